"""The evaluation runner on a tiny LLaDA-architecture model with a real (test-time trained) BPE tokenizer over
slices of the real evaluation files: records, batching invariance, resume, refusals and errors."""

from __future__ import annotations

import json

import pytest
from eval_fixtures import base_config, data_dir, eval_models  # noqa: F401  (session fixture)

from dsl_llada.eval.eval_config import EvalConfig
from dsl_llada.eval.shards import read_records
from dsl_llada.eval.runner import run_eval

pytestmark = pytest.mark.usefixtures("one_thread")
TIMING = ("seconds", "batch_seconds", "batch_size")


@pytest.fixture
def models(eval_models):  # noqa: F811
    """The session's tiny model folders."""
    return eval_models


def gen_task(limit: int = 5, gen_length: int = 16) -> dict:
    d = data_dir()
    return {"name": "generation", "datasets": [{"name": "prompts", "path": str(d / "prompts_200.jsonl"), "limit": limit,
                                                "gen_length": gen_length}]}


def strip(recs):
    return [{k: v for k, v in r.items() if k not in TIMING} for r in recs]


def test_generation_records(models, tmp_path):
    cfg = EvalConfig.from_dict(base_config(models, [gen_task()]))
    res = run_eval(cfg, tmp_path / "run", progress=False)
    recs = read_records(tmp_path / "run")
    assert res.n_items == len(recs) == 10 and res.n_run == 10
    assert [r["method"] for r in recs] == ["DSL-SDE"] * 5 + ["LLaDA"] * 5
    assert [r["sample_id"] for r in recs[:5]] == ["0", "1", "2", "3", "4"]
    for r in recs:
        assert r["error"] is None
        assert len(r["ids"]) == r["n_tokens"] <= 16
        assert r["forward_passes"] == (5 if r["method"] == "DSL-SDE" else 4)
        assert r["metrics"]["words"] == len(r["text"].split())
    s = json.loads((tmp_path / "run" / "summary.json").read_text())
    rows = s["tasks"]["generation"]["rows"]
    assert {(r["method"], r["nfe"], r["n"]) for r in rows} == {("DSL-SDE", 4, 5), ("LLaDA", 4, 5)}
    assert s["config"] == cfg.to_dict()
    assert "| method | nfe 4 |" in (tmp_path / "run" / "summary.md").read_text()
    from PIL import Image

    png = Image.open(tmp_path / "run" / s["tasks"]["generation"]["figures"][0])
    stamp = json.loads(png.info["dsl-llada"])  # every figure carries the config and the version
    assert stamp["config"] == cfg.to_dict() and stamp["version"] == s["version"]


def test_batching_does_not_change_records(models, tmp_path):
    """Per-row generators: batch size 1 and 3 give the same tokens (a different seed gives different ones). The SDE
    runs 'Algorithm 2 as printed': with the default predictor noise this random tiny model amplifies the ~1e-6
    rounding difference between batch shapes into other tokens (tests/test_serve.py says more)."""
    methods = [{"name": "DSL-SDE", "model": "dsl", "preset": "dsl-sde", "options": {"predictor_noise": False}},
               {"name": "LLaDA", "model": "llada", "preset": "llada"}]
    one = EvalConfig.from_dict(base_config(models, [gen_task(4)], methods=methods, batch_size=1))
    three = EvalConfig.from_dict(base_config(models, [gen_task(4)], methods=methods, batch_size=3))
    other = EvalConfig.from_dict(base_config(models, [gen_task(4)], methods=methods, batch_size=3, seeds=[7]))
    run_eval(one, tmp_path / "b1", progress=False, report=False)
    run_eval(three, tmp_path / "b3", progress=False, report=False)
    run_eval(other, tmp_path / "s7", progress=False, report=False)
    ids1 = [r["ids"] for r in read_records(tmp_path / "b1")]
    ids3 = [r["ids"] for r in read_records(tmp_path / "b3")]
    ids7 = [r["ids"] for r in read_records(tmp_path / "s7")]
    assert ids1 == ids3
    assert ids7[:4] != ids3[:4]  # the SDE rows depend on the seed


def test_engine_records_equal_the_fixed_batches(models, tmp_path):
    """`batching='continuous'` (the step-level engine) gives every item the tokens of the fixed batches: remasking
    (with a confidence threshold its rows finish at different ticks, so later rows join mid-way) and ReMDM exactly
    in any arrangement; the SDE in the fixed batches' own arrangement (every row of a batch joins at one tick and
    leaves at one): on prompts of one length as the engine's own tests, and here also on the length-sorted batches
    of mixed lengths (the engine pads with zero embeddings, a fixed batch with the pad token's: both masked out).
    Only the timing fields differ (with a threshold also the counts: the engine's are the row's own, a fixed
    batch's its slowest row's)."""
    d = data_dir()
    first = json.loads((d / "prompts_200.jsonl").read_text().splitlines()[0])
    path = tmp_path / "same.jsonl"  # five prompts of one length: one text, five items (seeded 42 + i)
    path.write_text("".join(json.dumps({**first, "id": i}) + "\n" for i in range(5)))
    task = gen_task(5)
    task["datasets"].append({"name": "same", "path": str(path), "kind": "prompts", "gen_length": 16})
    methods = [{"name": "DSL-SDE", "model": "dsl", "preset": "dsl-sde"},
               {"name": "LLaDA", "model": "llada", "preset": "llada"},
               {"name": "LLaDA-thr", "model": "llada", "preset": "llada", "options": {"threshold": 0.05}},
               {"name": "ReMDM", "model": "llada", "preset": "remdm"}]
    cfg = EvalConfig.from_dict(base_config(models, [task], methods=methods, batch_size=2))
    run_eval(cfg, tmp_path / "engine", progress=False, report=False)
    run_eval(cfg, tmp_path / "fixed", progress=False, report=False, batching="fixed")
    eng, fix = read_records(tmp_path / "engine"), read_records(tmp_path / "fixed")
    assert len(eng) == len(fix) == 2 * 5 * len(methods)
    assert all(r["error"] is None for r in eng + fix)
    counts = ("nfe_sampler", "forward_passes")
    for e, f in zip(eng, fix):
        assert e["ids"] == f["ids"], (e["key"], e["ids"], f["ids"])
        drop = TIMING + (counts if e["method"] == "LLaDA-thr" else ())
        assert {k: v for k, v in e.items() if k not in drop} == {k: v for k, v in f.items() if k not in drop}
    thr = [r for r in eng if r["method"] == "LLaDA-thr"]
    assert len({r["nfe_sampler"] for r in thr}) > 1  # the threshold rows took different step counts
    assert max(r["batch_size"] for r in eng) == 2


def test_resume_after_torn_writes(models, tmp_path):
    """Cut the shard anywhere (mid-line, mid-batch): the same command finishes with exactly the records of an
    uninterrupted run and re-runs only what is missing."""
    cfg = EvalConfig.from_dict(base_config(models, [gen_task(5)], batch_size=2))
    run_eval(cfg, tmp_path / "full", progress=False, report=False)
    full = read_records(tmp_path / "full")
    run = tmp_path / "cut"
    run_eval(cfg, run, progress=False, report=False)
    shard = run / "shards" / "rank-0.jsonl"
    data = shard.read_bytes()
    lines = data.split(b"\n")
    keep = b"\n".join(lines[:3]) + b"\n" + lines[3][: len(lines[3]) // 2]  # 3 records + half a line
    shard.write_bytes(keep)
    (run / "records.jsonl").unlink()
    res = run_eval(cfg, run, progress=False, report=False)
    assert res.n_run == len(full) - 3
    assert strip(read_records(run)) == strip(full)
    assert shard.read_bytes().count(b"\n") == len(full)  # the torn half line was cut, nothing duplicated
    again = run_eval(cfg, run, progress=False, report=False)
    assert again.n_run == 0 and strip(read_records(run)) == strip(full)


def test_changed_config_and_foreign_folder_are_refused(models, tmp_path):
    from dsl_llada.config import ConfigError

    cfg = EvalConfig.from_dict(base_config(models, [gen_task(2)]))
    run_eval(cfg, tmp_path / "run", progress=False, report=False)
    changed = EvalConfig.from_dict(base_config(models, [gen_task(2, gen_length=8)], nfe=[8]))
    with pytest.raises(ConfigError, match=r"differing: nfe, tasks\.generation\.datasets\.prompts\.gen_length"):
        run_eval(changed, tmp_path / "run", progress=False, report=False)
    res = run_eval(changed, tmp_path / "run", new_run=True, progress=False, report=False)
    assert res.n_run == 4
    prev = [p for p in (tmp_path / "run").iterdir() if p.name.startswith("previous-")]
    assert len(prev) == 1 and len(read_records(prev[0])) == 4  # the old records were kept
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    with pytest.raises(ValueError, match="not empty and holds no dsl-llada evaluation run"):
        run_eval(cfg, foreign, progress=False, report=False)
    run_eval(cfg, foreign, overwrite=True, progress=False, report=False)
    assert (foreign / "notes.txt").read_text() == "mine"  # --overwrite replaces only what the runner writes


@pytest.mark.parametrize("batching", ["continuous", "fixed"])
def test_failing_sample_is_recorded_and_the_run_goes_on(models, tmp_path, monkeypatch, batching):
    from dsl_llada.eval import models as M
    from dsl_llada.sampling.engine import Engine

    d = data_dir()
    rows = [json.loads(x) for x in (d / "prompts_200.jsonl").read_text().splitlines()[:3]]
    path = tmp_path / "prompts.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    task = {"name": "generation", "datasets": [{"name": "p", "path": str(path), "kind": "prompts", "gen_length": 8}]}
    cfg = EvalConfig.from_dict(base_config(models, [task], methods=[{"name": "LLaDA", "model": "llada",
                                                                   "preset": "llada"}], batch_size=3))
    real = M.run_batch
    bad_seed = 42 + 1  # row 1 (seeded seed + row number) fails whenever it is in the call

    def flaky(loaded, method, choice, prompt_ids, seeds):
        if bad_seed in seeds:
            raise RuntimeError("synthetic failure of row 1")
        return real(loaded, method, choice, prompt_ids, seeds)

    real_forward = Engine._forward

    def flaky_forward(self, rows, seqs):  # the engine's rows are tagged with their position in the batch
        if any(int(r.tag) == 1 for r in rows):
            raise RuntimeError("synthetic failure of row 1")
        return real_forward(self, rows, seqs)

    monkeypatch.setattr(M, "run_batch", flaky)
    monkeypatch.setattr(Engine, "_forward", flaky_forward)
    res = run_eval(cfg, tmp_path / "run", progress=False, batching=batching)
    recs = read_records(tmp_path / "run")
    assert res.n_errors == 1
    assert [r["error"] is None for r in recs] == [True, False, True]
    assert recs[1]["error"] == "RuntimeError: synthetic failure of row 1" and recs[1]["ids"] is None
    assert all(len(r["ids"]) <= 8 for r in (recs[0], recs[2]))
    s = json.loads((tmp_path / "run" / "summary.json").read_text())
    row = s["tasks"]["generation"]["rows"][0]
    assert (row["n"], row["errors"]) == (3, 1)
    assert s["errors_by_task"]["generation"] == {"n": 3, "errors": 1, "rate": 1 / 3,
                                                 "most_common": "RuntimeError: synthetic failure of row 1",
                                                 "most_common_count": 1}
    assert res.failed_tasks(0.05) == ["generation"] and res.failed_tasks(0.5) == []


def test_genppl_scorer_loaded_once_and_not_again_for_the_report(models, tmp_path):
    """The run's report loads the scorer once; `eval report` in the same process reuses it, and in a fresh process
    (shared models released) every text is in genppl_cache.jsonl, so the model is not loaded at all."""
    from dsl_llada.eval.scorers import shared
    from dsl_llada.eval.summary import write_report

    task = gen_task(limit=3, gen_length=8)
    task["options"] = {"scorer": {"path": str(models["ar"])}}
    cfg = EvalConfig.from_dict(base_config(models, [task]))
    shared.release_all()
    before = shared.LOADS.get("causal-lm", 0)
    run_eval(cfg, tmp_path / "run", progress=False)
    assert shared.LOADS["causal-lm"] == before + 1
    first = json.loads((tmp_path / "run" / "summary.json").read_text())["tasks"]["generation"]["rows"]
    write_report(tmp_path / "run")
    assert shared.LOADS["causal-lm"] == before + 1
    shared.release_all()
    again = write_report(tmp_path / "run")["tasks"]["generation"]["rows"]
    assert shared.LOADS["causal-lm"] == before + 1  # all texts cached: no load
    assert [r["genppl"] for r in again] == [r["genppl"] for r in first] and all(r["genppl"] for r in first)
