"""Pairwise LLM judge: pairing, parsing, un-swapping, aggregation with bootstrap CIs, resume, retries, CLI."""

from __future__ import annotations

import argparse
import json
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import numpy as np
import pytest

from dsl_llada.eval.judge import (AXES, JudgeConfig, Pair, Sample, aggregate, bootstrap_rates, build_messages, judgment_record,
                                  pair_samples, parse_reply, samples_from_records, unswap)
from dsl_llada.eval.judge_backends import JudgeBackendError, LocalChatBackend, OpenAIChatBackend
from dsl_llada.cli.judge_cli import add_judge_parser
from dsl_llada.eval.judge_run import judge_runs, read_records
from dsl_llada.eval.judge import RunSamples


def reply(a=(4, 4, 4, 4), b=(2, 2, 2, 2), overall="A", rationale="ok") -> str:
    return json.dumps({"a": dict(zip(AXES, a)), "b": dict(zip(AXES, b)), "overall": overall, "rationale": rationale})


def run(name: str, n: int, prefix: str = "out") -> RunSamples:
    return RunSamples(name, {str(i): Sample(str(i), f"{prefix} {i}", f"ref {i}", f"doc {i}") for i in range(n)})


# -- parsing -------------------------------------------------------------------------------------------------------
def test_parse_reply_robust_takes_first_valid_object_authors_mode_fails_on_two():
    text = 'Sure. {"note": 1} then ' + reply(overall="tie") + " and " + reply(overall="B")
    got = parse_reply(text)
    assert got["overall"] == "tie" and got["a"]["factuality"] == 4.0
    assert parse_reply(text, mode="authors") is None  # their greedy {...} span spans several objects
    assert parse_reply("prefix " + reply(overall="B") + " suffix", mode="authors")["overall"] == "B"
    # the authors' parser returns the object only when its verdict is exactly "A", "B" or "tie" (case-sensitive)
    s = Sample("1", "x", "r")
    for v in ("b", "a", "Tie", "TIE", " A"):
        assert parse_reply(reply(overall=v), mode="authors") is None
        assert judgment_record(Pair("1", False, s, s), reply(overall=v), mode="authors")["parsed"] is False
        assert parse_reply(reply(overall=v)) is not None or v == " A"
    rec = judgment_record(Pair("1", True, s, s), '{"overall": "tie"}', mode="authors")
    assert rec["parsed"] is True and rec["winner"] == "tie" and rec["rationale"] is None


def test_authors_parser_accepts_what_robust_rejects():
    """Authors mode (docs/provenance.md §5.7): the object found in the reply is kept as decoded when its verdict is
    exactly "A", "B" or "tie"; scores are not validated."""
    for text in (reply(a=(6, 4, 4, 4)), '{"a": {"factuality": 3}, "b": {}, "overall": "A"}', '{"overall": "tie"}',
                 '{"a": 1, "b": "x", "overall": "B", "rationale": 5}'):
        assert parse_reply(text) is None
        assert parse_reply(text, mode="authors") == json.loads(text)    # as decoded, nothing added or dropped
    s = Sample("1", "x", "r")
    rec = judgment_record(Pair("1", False, s, s), '{"a": 1, "b": {"fluency": "x", "coverage": 2}, "overall": "B"}',
                          mode="authors")
    assert rec["parsed"] and rec["scores_a"] == {} and rec["scores_b"] == {"coverage": 2.0}  # numbers for the means
    assert parse_reply('["overall", "A"]', mode="authors") is None and parse_reply("{ broken", mode="authors") is None
    assert parse_reply('{"overall": "C"}', mode="authors") is None and parse_reply('{"a": 1}', mode="authors") is None
    assert judgment_record(Pair("1", False, s, s), '{"overall": "C"}', mode="authors")["parsed"] is False


@pytest.mark.parametrize("bad", [
    reply(a=(6, 4, 4, 4)),                       # score out of 1..5
    reply(overall="C"),                          # unknown verdict
    '{"a": {"factuality": 3}, "b": {}, "overall": "A"}',  # missing axes
    "no json here", "{broken",
])
def test_parse_reply_rejects_invalid(bad):
    assert parse_reply(bad) is None


def test_unswap_maps_displayed_verdict_back_to_runs():
    s = Sample("1", "x", "r")
    parsed = parse_reply(reply(a=(5, 5, 5, 5), b=(1, 2, 3, 4), overall="A"))
    straight = unswap(Pair("1", False, s, s), parsed)
    swapped = unswap(Pair("1", True, s, s), parsed)
    assert straight["winner"] == "A" and straight["scores_a"]["factuality"] == 5.0
    assert swapped["winner"] == "B" and swapped["scores_b"]["factuality"] == 5.0
    assert swapped["scores_a"]["conciseness"] == 4.0
    assert straight["shown_first_won"] is True and swapped["shown_first_won"] is True


def test_messages_show_displayed_order_and_source_only_on_request():
    a, b = Sample("1", "SYSTEM-A", "REF", "DOC"), Sample("1", "SYSTEM-B", "REF", "DOC")
    user = build_messages(Pair("1", True, a, b))[1]["content"]
    assert user.index("SYSTEM-B") < user.index("SYSTEM-A")  # swapped: run B is shown as Candidate A
    assert "DOC" not in user and "source" not in build_messages(Pair("1", True, a, b))[0]["content"]
    assert "DOC" in build_messages(Pair("1", False, a, b), include_source=True)[1]["content"]


# -- pairing -------------------------------------------------------------------------------------------------------
def test_pairing_is_seeded_keeps_first_n_common_ids_and_draws_swaps():
    ra, rb = run("a", 50), run("b", 40)
    cfg = JudgeConfig(n=30)
    p1, p2 = pair_samples(ra.samples, rb.samples, cfg), pair_samples(ra.samples, rb.samples, cfg)
    assert [(p.id, p.swap) for p in p1] == [(p.id, p.swap) for p in p2]
    assert len(p1) == 30 and {p.id for p in p1} <= {str(i) for i in range(40)}
    assert 5 < sum(p.swap for p in p1) < 25
    other = pair_samples(ra.samples, rb.samples, JudgeConfig(n=30, seed=7))
    assert [p.id for p in other] != [p.id for p in p1]
    both = pair_samples(ra.samples, rb.samples, JudgeConfig(n=30, both_orders=True))
    assert len(both) == 60 and all(both[i].swap != both[i + 1].swap for i in range(0, 60, 2))
    with pytest.raises(ValueError, match="no sample id in common"):
        pair_samples(run("a", 3).samples, RunSamples("b", {"x": Sample("x", "o", "r")}).samples, cfg)


# -- aggregation ---------------------------------------------------------------------------------------------------
def _recs(verdicts, swaps=None):
    s = Sample("0", "o", "r")
    out = []
    for i, v in enumerate(verdicts):
        pair = Pair(str(i), bool(swaps[i]) if swaps else False, s, s)
        out.append(judgment_record(pair, None if v is None else reply(a=(4, 3, 5, 2), b=(2, 3, 1, 4), overall=v),
                                   mode="robust"))
    return out


def test_aggregate_hand_computed_rates_axes_and_position_bias():
    recs = _recs(["A", "tie", "B", None, "A"], swaps=[0, 0, 1, 0, 1])
    refused = aggregate(recs, resamples=2000)  # 4 of 5 parsed = 80 % < 90 %: no win rate
    assert refused["win"] is None and refused["parse_rate"] == pytest.approx(0.8)
    assert "4 of 5 replies (80.0 %) parsed, below the 90 % needed" in refused["refused"]
    assert refused["shown_a_rate"] == pytest.approx(2 / 3)  # position bias is still reported
    s = aggregate(recs, resamples=2000, min_parse_rate=0.8)
    assert s["refused"] is None
    # displayed verdicts A, tie, B, -, A; un-swapped winners A, tie, A, -, B  → 2 wins, 1 tie, 1 loss of 4 parsed
    assert (s["n_parsed"], s["n_unparsed"]) == (4, 1)
    assert s["win"] == pytest.approx(50.0) and s["tie"] == pytest.approx(25.0) and s["loss"] == pytest.approx(25.0)
    # per-axis means of run A: shown-first scores (4,3,5,2) when not swapped, (2,3,1,4) when swapped
    # parsed: rec0 straight, rec1 straight, rec2 swapped, rec4 swapped → factuality (4+4+2+2)/4 = 3
    assert s["axes_a"]["factuality"] == pytest.approx(3.0) and s["axes_b"]["conciseness"] == pytest.approx(3.0)
    assert s["shown_a_rate"] == pytest.approx(2 / 3) and s["n_decisive"] == 3  # displayed A won 2 of 3 decisive


def test_bootstrap_ci_hand_computed_extremes_and_seeded():
    all_a = aggregate(_recs(["A"] * 10), resamples=1000)
    assert all_a["win_ci95"] == [100.0, 100.0] and all_a["loss_ci95"] == [0.0, 0.0]
    # two samples, one win one loss: the resampled win rate is 0, 50 or 100 with p = 1/4, 1/2, 1/4
    two = aggregate(_recs(["A", "B"]), resamples=10_000)
    assert two["win"] == 50.0 and two["win_ci95"] == [0.0, 100.0]
    mixed = _recs(["A", "B", "tie", "A", "A", "B", "A", "tie", "B", "A"] * 3)
    s1, s2 = aggregate(mixed, resamples=2000, seed=1), aggregate(mixed, resamples=2000, seed=1)
    assert s1["win_ci95"] == s2["win_ci95"]
    assert s1["win_ci95"][0] < s1["win"] < s1["win_ci95"][1]
    groups = [[0], [2], [1], [0]] * 5
    b1, b2 = bootstrap_rates(groups, resamples=500, seed=1), bootstrap_rates(groups, resamples=500, seed=1)
    assert b1.shape == (500, 3) and np.array_equal(b1, b2) and np.allclose(b1.sum(1), 100.0)
    assert not np.array_equal(b1, bootstrap_rates(groups, resamples=500, seed=2))
    assert abs(b1[:, 0].mean() - 50.0) < 3.0  # the bootstrap is centred on the point estimate


# -- running, resume, errors ---------------------------------------------------------------------------------------
class FakeJudge:
    """Prefers whichever displayed candidate text sorts last; can be told to die after k calls."""

    concurrency = 1

    def __init__(self, die_after: int | None = None):
        self.calls, self.die_after = 0, die_after

    def describe(self):
        return {"backend": "fake"}

    def __call__(self, messages):
        self.calls += 1
        if self.die_after is not None and self.calls > self.die_after:
            raise KeyboardInterrupt
        user = messages[1]["content"]
        first = user.split("=== Candidate A ===\n")[1].split("\n")[0]
        second = user.split("=== Candidate B ===\n")[1].split("\n")[0]
        return "Verdict: " + reply(overall="A" if first > second else "B")


def test_judge_runs_resumes_after_interrupt_with_identical_records(tmp_path):
    ra, rb = run("a", 12, "zz"), run("b", 12, "aa")  # run A's texts sort last: the fake judge always picks A
    cfg = JudgeConfig(n=10)
    full = judge_runs(ra, rb, FakeJudge(), tmp_path / "full", cfg, progress=False)
    assert full["win"] == 100.0 and full["n_parsed"] == 10
    with pytest.raises(KeyboardInterrupt):
        judge_runs(ra, rb, FakeJudge(die_after=4), tmp_path / "cut", cfg, progress=False)
    lines = (tmp_path / "cut" / "judgments.jsonl").read_text().splitlines()
    assert len(lines) == 4
    with open(tmp_path / "cut" / "judgments.jsonl", "a") as fh:
        fh.write('{"key": "torn')  # a partial line from a kill mid-write
    judge = FakeJudge()
    resumed = judge_runs(ra, rb, judge, tmp_path / "cut", cfg, progress=False)
    assert judge.calls == 6  # only the missing ones
    key = lambda p: sorted(json.loads(x)["key"] for x in p.read_text().splitlines())  # noqa: E731
    assert key(tmp_path / "cut" / "judgments.jsonl") == key(tmp_path / "full" / "judgments.jsonl")
    assert resumed == full
    with pytest.raises(ValueError, match="different settings.*config"):
        judge_runs(ra, rb, FakeJudge(), tmp_path / "cut", JudgeConfig(n=5), progress=False)


class _Flaky(BaseHTTPRequestHandler):
    failures = 2
    hits = 0

    def do_POST(self):
        type(self).hits += 1
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        assert body["messages"][0]["role"] == "system"
        if type(self).hits <= type(self).failures:
            self.send_response(503)
            self.end_headers()
            return
        data = json.dumps({"choices": [{"message": {"content": reply(overall="tie")}}]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *a):
        pass


@pytest.fixture
def flaky_server():
    _Flaky.hits = 0
    srv = HTTPServer(("127.0.0.1", 0), _Flaky)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    yield f"http://127.0.0.1:{srv.server_address[1]}/v1"
    srv.shutdown()
    srv.server_close()


def test_endpoint_retries_with_exponential_backoff_then_answers(flaky_server):
    sleeps = []
    be = OpenAIChatBackend(flaky_server, "judge-x", retries=3, backoff_s=0.5, sleep=sleeps.append)
    assert parse_reply(be([{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]))["overall"] == "tie"
    assert _Flaky.hits == 3 and sleeps == [0.5, 1.0]


def test_endpoint_gives_up_and_run_continues(tmp_path, flaky_server):
    _Flaky.failures = 10**6
    try:
        be = OpenAIChatBackend(flaky_server, "judge-x", retries=1, sleep=lambda s: None, concurrency=2)
        with pytest.raises(JudgeBackendError, match="HTTP 503 after 2 attempt"):
            be([{"role": "system", "content": "s"}])
        s = judge_runs(run("a", 3), run("b", 3), be, tmp_path / "j", JudgeConfig(n=3), progress=False)
        assert (s["n_judgments"], s["n_parsed"], s["n_errors"], s["win"]) == (3, 0, 3, None)
    finally:
        _Flaky.failures = 2
    dead = OpenAIChatBackend("http://127.0.0.1:9/v1", "m", retries=0, timeout_s=2)
    with pytest.raises(JudgeBackendError, match="unreachable"):
        dead([{"role": "user", "content": "u"}])


def test_backend_input_errors(tmp_path, monkeypatch):
    monkeypatch.delenv("DSL_TEST_JUDGE_KEY", raising=False)
    with pytest.raises(ValueError, match="'DSL_TEST_JUDGE_KEY' is not set"):
        OpenAIChatBackend("http://127.0.0.1:1/v1", "m", api_key_env="DSL_TEST_JUDGE_KEY")
    with pytest.raises(ValueError, match="not an http"):
        OpenAIChatBackend("127.0.0.1:1", "m")
    with pytest.raises(ValueError, match="does not exist"):
        LocalChatBackend(tmp_path / "nope")
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    tok = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.WordLevel({"a": 0, "[UNK]": 1}, unk_token="[UNK]")))
    tok.save_pretrained(str(tmp_path / "plain"))
    with pytest.raises(ValueError, match="no chat template"):
        LocalChatBackend(tmp_path / "plain")


# -- records and CLI -----------------------------------------------------------------------------------------------
def _write_run(path: Path, dataset: str, n: int, text: str, nfe: int = 64) -> Path:
    path.mkdir(parents=True)
    rows = [{"task": "summarization", "dataset": dataset, "method": "m", "nfe": nfe, "sample_id": str(i),
             "output": f"{text} {i}", "reference": f"ref {i}"} for i in range(n)]
    rows.append({"task": "summarization", "dataset": dataset, "method": "m", "nfe": 8, "sample_id": "0",
                 "output": "other nfe", "reference": "ref 0"})
    (path / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _parse(argv):
    p = argparse.ArgumentParser()
    add_judge_parser(p.add_subparsers(dest="cmd"))
    return p.parse_args(["judge", *argv])


def test_judge_cli_options_and_errors(tmp_path):
    a = _parse(["A", "B", "--out", "o", "--dataset", "xsum", "--nfe", "64", "--local", "smollm2", "--both-orders"])
    assert (a.n, a.seed, a.dataset, a.nfe, a.both_orders, a.parse_mode, a.resamples) == \
        (100, 42, "xsum", 64, True, "robust", 10_000)
    ra, rb = _write_run(tmp_path / "ra", "xsum", 5, "x"), _write_run(tmp_path / "rb", "cnndm", 5, "y")
    with pytest.raises(ValueError, match="different datasets"):
        a = _parse([str(ra), str(rb), "--out", str(tmp_path / "o"), "--local", "x"])
        a.func(a)
    with pytest.raises(ValueError, match="exactly one judge back-end"):
        a = _parse([str(ra), str(ra), "--out", str(tmp_path / "o"), "--nfe", "64"])
        a.func(a)
    samples = samples_from_records(read_records(ra), name="ra", nfe=64)
    assert sorted(samples.samples) == [str(i) for i in range(5)] and samples.samples["0"].output == "x 0"
    with pytest.raises(ValueError, match="occurs twice"):
        samples_from_records(read_records(ra), name="ra")
    (tmp_path / "bad.jsonl").write_text('{"a": 1}\nnot json\n{"b": 2}\n')
    with pytest.raises(ValueError, match=r"bad.jsonl:2: not a JSON line"):
        read_records(tmp_path / "bad.jsonl")


@pytest.mark.slow
def test_local_smollm2_judge_constrained_parses_all_and_free_text_is_refused(tmp_path, one_thread):
    """The tiny real judge (SmolLM2-135M, loaded once for both runs): constrained decoding parses every reply and the
    table shows the parse rate; free text with a tiny budget parses < 90 % and the win rate is withheld (exit 1)."""
    pytest.importorskip("gguf")
    from dsl_llada.eval.judge_backends import smollm2_gguf
    from dsl_llada.eval.scorers import shared

    try:
        smollm2_gguf()
    except ValueError as e:
        pytest.skip(str(e))
    ra, rb = _write_run(tmp_path / "ra", "xsum", 3, "The cat sat on the mat"), _write_run(tmp_path / "rb", "xsum", 3, "mat")
    loads = shared.LOADS.get("causal-lm", 0)
    a = _parse([str(ra), str(rb), "--out", str(tmp_path / "j"), "--nfe", "64", "--local", "smollm2", "--n", "3",
                "--resamples", "200", "-q"])
    assert a.func(a) == 0
    # at most one load (none when an earlier test of this process already shared the same SmolLM2 folder)
    after_first = shared.LOADS.get("causal-lm", 0)
    assert after_first - loads <= 1
    lines = [json.loads(x) for x in (tmp_path / "j" / "judgments.jsonl").read_text().splitlines()]
    assert sorted(r["id"] for r in lines) == ["0", "1", "2"] and all(r["parsed"] for r in lines)
    for r in lines:
        obj = json.loads(r["reply"])
        assert obj["overall"] in ("A", "B", "tie") and all(obj[s][ax] in range(1, 6) for s in "ab" for ax in AXES)
    summary = json.loads((tmp_path / "j" / "summary.json").read_text())
    assert summary["parse_rate"] == 1.0 and summary["win"] is not None and summary["refused"] is None
    md = (tmp_path / "j" / "summary.md").read_text()
    assert "| 100.0 % (3/3) |" in md and "shown-A rate" in md
    cfg = json.loads((tmp_path / "j" / "judge_config.json").read_text())
    assert cfg["backend"]["constrained"] is True and cfg["config"]["n"] == 3
    b = _parse([str(ra), str(rb), "--out", str(tmp_path / "free"), "--nfe", "64", "--local", "smollm2", "--n", "3",
                "--unconstrained", "--max-tokens", "3", "--resamples", "200", "-q"])
    assert b.func(b) == 1
    free = json.loads((tmp_path / "free" / "summary.json").read_text())
    assert free["parse_rate"] == 0.0 and free["win"] is None and "win rate withheld" in free["refused"]
    assert "win rate withheld" in (tmp_path / "free" / "summary.md").read_text()
    assert shared.LOADS.get("causal-lm", 0) == after_first  # the second judge run reuses the first one's model


def test_judge_help_lists_the_options(capsys):
    with pytest.raises(SystemExit):
        _parse(["--help"])
    out = capsys.readouterr().out
    for opt in ("--judge-prompt-file", "--min-parse-rate", "--unconstrained", "--parse-mode", "--local", "--endpoint",
                "--both-orders", "--include-source"):
        assert opt in out


def test_prompt_file_text_and_json_and_refusals(tmp_path):
    from dsl_llada.eval.judge_command import load_prompt_file

    txt = tmp_path / "p.txt"
    txt.write_text("You judge.\nReply {\"overall\": ...}\n---\nREF {reference}\nA {candidate_a}\nB {candidate_b}\n")
    system, user = load_prompt_file(txt)
    assert system == 'You judge.\nReply {"overall": ...}' and user == "REF {reference}\nA {candidate_a}\nB {candidate_b}"
    js = tmp_path / "p.json"
    js.write_text(json.dumps({"system": "S", "user": "{reference} {candidate_a} {candidate_b}"}))
    assert load_prompt_file(js) == ("S", "{reference} {candidate_a} {candidate_b}")
    cfg = JudgeConfig(system_prompt=system, user_template=user)
    assert JudgeConfig.from_dict(cfg.to_dict()) == cfg
    (tmp_path / "bad.txt").write_text("no separator here {reference}")
    with pytest.raises(ValueError, match="no line '---'"):
        load_prompt_file(tmp_path / "bad.txt")
    with pytest.raises(ValueError, match=r"lacks the placeholder\(s\) \['\{candidate_b\}'\]"):
        JudgeConfig(system_prompt="S", user_template="{reference} {candidate_a}")
    with pytest.raises(ValueError, match="does not exist"):
        load_prompt_file(tmp_path / "none.txt")
