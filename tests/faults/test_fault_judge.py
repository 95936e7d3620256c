"""The pairwise judge's faults: two runs that hold different documents under the same sample ids (judged against
run A's reference, with a win rate and exit 0), and the authors' reply parser taking a verdict in the wrong case."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from faults_helpers import refused
from helpers import first_shown_judge

from dsl_llada.cli.main import main
from dsl_llada.eval.judge import Pair, Sample, judgment_record, parse_reply


def test_authors_parser_gives_nothing_for_a_lowercase_verdict():
    """docs/provenance.md §5.7: the authors' parser returns the decoded object only when its "overall" is exactly
    "A", "B" or "tie"; {"overall": "a"} gives nothing, so the judgment is unparsed (dropped from the win rate)."""
    assert parse_reply('{"overall": "a"}', mode="authors") is None
    assert parse_reply('verdict: {"overall": "A"}', mode="authors") == {"overall": "A"}  # exactly, as decoded
    s = Sample("1", "x", "r")
    rec = judgment_record(Pair("1", False, s, s), '{"overall": "a"}', mode="authors")
    assert rec["parsed"] is False and "winner" not in rec
    assert judgment_record(Pair("1", False, s, s), '{"overall": "A"}', mode="authors")["winner"] == "A"


# -- pairing: the same sample ids must hold the same documents -----------------------------------------------------
DATA = Path(__file__).resolve().parents[2] / "configs" / "eval" / "toy-data" / "toy_summarize.jsonl"
N = 8


def toy_rows() -> list[dict]:
    return [json.loads(x) for x in DATA.read_text().splitlines()[:N]]


def write_run(folder: Path, rows: list[dict], text: str) -> Path:
    """A run folder as `eval run` writes it for toy_summarize: the records carry the task's sample info."""
    from dsl_llada.eval.eval_config import DatasetSpec
    from dsl_llada.eval.tasks import get_task

    folder.mkdir(parents=True)
    data = folder / "data.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    samples = get_task("summarization").samples(DatasetSpec("toy_summarize", str(data), kind="xsum"), {})
    recs = [{"task": "summarization", "dataset": "toy_summarize", "method": "m", "nfe": 4, "seed": 0,
             "sample_id": s.id, "text": f"{text} {s.id}", "error": None, "info": s.info} for s in samples]
    (folder / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    return folder


@pytest.fixture
def endpoint():
    """An OpenAI-compatible endpoint whose judge always prefers the candidate shown first."""
    with first_shown_judge() as served:
        yield served


def judge_argv(ra: Path, rb: Path, out: Path, url: str) -> list[str]:
    return ["eval", "judge", str(ra), str(rb), "--out", str(out), "--endpoint", url, "--judge-model", "m",
            "--concurrency", "1", "--resamples", "200", "-q"]


def swap(rows: list[dict], i: int, j: int, *fields: str) -> list[dict]:
    out = [dict(r) for r in rows]
    for f in fields:
        out[i][f], out[j][f] = rows[j][f], rows[i][f]
    return out


@pytest.mark.parametrize(("fields", "what"), [(("prompt", "reference"), "reference"), (("prompt",), "source")],
                         ids=["documents-swapped", "same-reference-other-document"])
def test_judge_refuses_runs_holding_other_documents_under_the_same_ids(tmp_path, endpoint, capsys, fields, what):
    rows = toy_rows()
    ra = write_run(tmp_path / "ra", rows, "summary a")
    rb = write_run(tmp_path / "rb", swap(rows, 3, 5, *fields), "summary b")  # ids 3 and 5 hold each other's
    url, calls = endpoint
    line = refused(capsys, judge_argv(ra, rb, tmp_path / "j", url))
    assert f"sample id '3' holds a different {what}" in line, line
    assert not calls and not (tmp_path / "j").exists()  # nothing judged, nothing written


def test_judge_pairs_runs_of_the_same_documents(tmp_path, endpoint, capsys):
    rows = toy_rows()
    ra, rb = write_run(tmp_path / "ra", rows, "summary a"), write_run(tmp_path / "rb", rows, "summary b")
    url, calls = endpoint
    assert main(judge_argv(ra, rb, tmp_path / "j", url)) == 0
    summary = json.loads((tmp_path / "j" / "summary.json").read_text())
    assert len(calls) == N and summary["n_parsed"] == N  # every common id judged once
    shown_first_a = [not json.loads(x)["swap"] for x in (tmp_path / "j" / "judgments.jsonl").read_text().splitlines()]
    assert summary["win"] == 100.0 * sum(shown_first_a) / N  # the judge always picks the candidate shown first
    assert summary["shown_a_rate"] == 1.0
    capsys.readouterr()
