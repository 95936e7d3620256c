"""The one resumable record writer (`jsonl_log`): whole lines, fsync policy, skip done keys, repair a broken last
line; the four writers (generate, eval shards, judge, sweep rows) share it."""

from __future__ import annotations

import errno
import json
import os

import pytest

import dsl_llada.artifacts.jsonl_log as jl


def test_append_whole_lines_and_read_back(tmp_path):
    p = tmp_path / "sub" / "r.jsonl"
    with jl.JsonlAppender(p) as w:
        assert w.append([{"key": "a", "x": "é"}, {"key": "b"}]) == len(p.read_bytes())
        w.append([])
    assert p.read_text(encoding="utf-8") == '{"key": "a", "x": "é"}\n{"key": "b"}\n'
    records, valid = jl.read(p)
    assert [r["key"] for r in records] == ["a", "b"] and valid == len(p.read_bytes())


def test_sort_keys_option(tmp_path):
    p = tmp_path / "r.jsonl"
    with jl.JsonlAppender(p, sort_keys=True) as w:
        w.append([{"z": 1, "a": 2}])
    assert p.read_text() == '{"a": 2, "z": 1}\n'


def test_a_broken_last_line_is_ignored_then_repaired(tmp_path):
    p = tmp_path / "r.jsonl"
    p.write_bytes(b'{"key": "a"}\n{"key": "b"}\n{"key": "c", "x": 1')
    records, valid = jl.read(p)
    assert [r["key"] for r in records] == ["a", "b"] and valid == len(b'{"key": "a"}\n{"key": "b"}\n')
    with jl.JsonlAppender(p) as w:
        w.append([{"key": "c"}])
    assert p.read_bytes() == b'{"key": "a"}\n{"key": "b"}\n{"key": "c"}\n'


def test_without_repair_the_tail_is_kept(tmp_path):
    p = tmp_path / "r.jsonl"
    p.write_bytes(b'{"key": "a"}\n{"ke')
    w = jl.JsonlAppender(p, repair=False)
    w.close()
    assert p.read_bytes() == b'{"key": "a"}\n{"ke'


def test_complete_end_is_found_past_a_long_tail(tmp_path):
    p = tmp_path / "r.jsonl"
    p.write_bytes(b'{"key": "a"}\n' + b"x" * 200_000)
    with jl.JsonlAppender(p) as w:
        assert w.end == len(b'{"key": "a"}\n')
    assert p.read_bytes() == b'{"key": "a"}\n'


def test_a_failed_write_leaves_none_of_its_batch(tmp_path, monkeypatch):
    p = tmp_path / "r.jsonl"
    w = jl.JsonlAppender(p)
    w.append([{"key": "a"}])

    def half_then_full(fd, data):
        os.write(fd, data[: len(data) // 2])
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    real = jl._write_all
    monkeypatch.setattr(jl, "_write_all", half_then_full)
    with pytest.raises(OSError) as e:
        w.append([{"key": "b"}, {"key": "c"}])
    assert e.value.errno == errno.ENOSPC and e.value.filename == str(p)
    assert p.read_bytes() == b'{"key": "a"}\n'
    monkeypatch.setattr(jl, "_write_all", real)
    w.append([{"key": "d"}])
    w.close()
    assert [r["key"] for r in jl.read(p)[0]] == ["a", "d"]


def test_an_interruption_keeps_a_written_batch_and_cuts_a_partial_one(tmp_path, monkeypatch):
    p = tmp_path / "r.jsonl"
    w = jl.JsonlAppender(p)
    w.append([{"key": "a"}])

    def stop(*_):  # Ctrl-C (or SIGTERM's exception) arriving once the batch is in the file, before its fsync returns
        raise KeyboardInterrupt

    monkeypatch.setattr(jl.os, "fsync", stop)
    with pytest.raises(KeyboardInterrupt):
        w.append([{"key": "b"}])
    assert w.end == p.stat().st_size  # the whole batch stays and is counted

    def half(fd, data):  # the same interruption inside the write: half a line would be left
        os.write(fd, data[: len(data) // 2])
        raise KeyboardInterrupt

    monkeypatch.setattr(jl, "_write_all", half)
    with pytest.raises(KeyboardInterrupt):
        w.append([{"key": "c"}, {"key": "d"}])
    w.close()
    assert p.read_bytes() == b'{"key": "a"}\n{"key": "b"}\n'


@pytest.mark.parametrize("policy, expected", [(True, 2), (False, 0)])
def test_fsync_policy(tmp_path, monkeypatch, policy, expected):
    calls = []
    real = os.fsync
    monkeypatch.setattr(jl.os, "fsync", lambda fd: (calls.append(fd), real(fd)))
    with jl.JsonlAppender(tmp_path / "r.jsonl", fsync=policy) as w:
        w.append([{"k": 1}])
        w.append([{"k": 2}])
    assert len(calls) == expected


def test_strict_and_lenient_reading_of_a_bad_line(tmp_path):
    p = tmp_path / "r.jsonl"
    p.write_bytes(b'{"key": "a"}\nnot json\n[1, 2]\n{"key": "b"}\n')
    with pytest.raises(ValueError, match=rf"{p}:2: not a JSON record"):
        jl.read(p)
    assert [r["key"] for r in jl.read(p, strict=False)[0]] == ["a", "b"]
    with pytest.raises(ValueError, match=rf"{p}:1: not a record of this file"):
        jl.read(p, accept=lambda r: isinstance(r, dict) and "index" in r)
    assert jl.read(tmp_path / "missing.jsonl") == ([], 0)


def test_done_keys_latest_record_wins():
    recs = [{"index": 0, "error": "boom"}, {"index": 1, "response": "x"}, {"index": 0, "response": "y"}]
    assert jl.done_keys(recs, "index") == {0: {"index": 0, "response": "y"}, 1: {"index": 1, "response": "x"}}
    assert set(jl.done_keys(recs, lambda r: (r["index"], "error" in r))) == {(0, True), (1, False), (0, False)}


def test_an_appender_on_a_given_descriptor_leaves_it_open(tmp_path):
    p = tmp_path / "r.jsonl"
    fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    try:
        w = jl.JsonlAppender(p, fd=fd, valid_bytes=0)
        w.append([{"k": 1}])
        w.close()
        os.write(fd, b'{"k": 2}\n')  # still open
    finally:
        os.close(fd)
    assert [json.loads(x)["k"] for x in p.read_text().splitlines()] == [1, 2]
    with pytest.raises(ValueError, match="append after close"):
        w.append([{"k": 3}])
