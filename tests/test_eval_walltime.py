"""The walltime task: a fixed seeded prompt subset, batch size 1, one warm-up per (method, NFE), generated-token
throughput, AR baselines with and without KV cache, the summary table and plot."""

from __future__ import annotations

import json

import numpy as np
import pytest
from eval_fixtures import base_config, data_dir, eval_models  # noqa: F401  (session fixture)

from dsl_llada.eval import models as M
from dsl_llada.eval.eval_config import EvalConfig
from dsl_llada.eval.shards import read_records
from dsl_llada.eval.runner import run_eval
from dsl_llada.eval.tasks.walltime import choose_prompts

pytestmark = pytest.mark.usefixtures("one_thread")


def test_choose_prompts_is_numpy_randomstate_42_without_replacement():
    want = sorted(np.random.RandomState(42).choice(1000, size=20, replace=False).tolist())
    assert choose_prompts(1000, 20) == want and len(set(want)) == 20
    assert choose_prompts(5, 20) == [0, 1, 2, 3, 4]  # fewer rows than asked: all of them
    assert choose_prompts(1000, 20, seed=1) != want
    with pytest.raises(ValueError, match="no rows"):
        choose_prompts(0, 3)


def test_walltime_task_end_to_end(eval_models, tmp_path, monkeypatch):  # noqa: F811
    calls: list[int] = []
    real = M.run_batch

    def counting(loaded, method, choice, ids, seeds):
        calls.append(len(ids))
        return real(loaded, method, choice, ids, seeds)

    monkeypatch.setattr(M, "run_batch", counting)
    rows = [json.loads(x) for x in (data_dir() / "summ_xsum.jsonl").read_text().splitlines()[:10]]
    docs = tmp_path / "xsum_docs.jsonl"  # short documents: the tiny models have a small context
    docs.write_text("".join(json.dumps({"id": r["id"], "document": " ".join(r["prompt"].split("\n\n", 1)[1].split()[:40]),
                                        "summary": r["reference"]}) + "\n" for r in rows))
    d = base_config(eval_models, [{"name": "walltime", "options": {"n_prompts": 3},
                                   "datasets": [{"name": "xsum", "path": str(docs), "gen_length": 8}]}],
                    methods=[{"name": "DSL-SDE", "model": "dsl", "preset": "dsl-sde"},
                             {"name": "AR-cache", "model": "ar", "preset": "ar"},
                             {"name": "AR-nocache", "model": "ar", "preset": "ar", "options": {"use_cache": False}}],
                    nfe=[2, 4])
    d["models"].append({"name": "ar", "path": str(eval_models["ar"]), "kind": "causal-lm"})
    cfg = EvalConfig.from_dict(d)
    run_eval(cfg, tmp_path / "run", progress=False)
    recs = read_records(tmp_path / "run")
    assert {r["sample_id"] for r in recs} == {str(rows[i]["id"]) for i in choose_prompts(10, 3)}
    assert all(r["batch_size"] == 1 and r["error"] is None and r["seconds"] > 0 and r["peak_mem_mib"] > 0 for r in recs)
    groups = {(r["method"], r["nfe"]) for r in recs}
    assert all(calls) and max(calls) == 1  # batch size 1 throughout
    assert len(calls) == len(recs) + len(groups)  # one warm-up per (method, NFE)
    assert all(r["n_tokens"] <= 8 for r in recs)
    s = json.loads((tmp_path / "run" / "summary.json").read_text())["tasks"]["walltime"]
    rows = {(r["method"], r["nfe"]): r for r in s["rows"]}
    sde = rows[("DSL-SDE", 4)]
    mine = [r for r in recs if r["method"] == "DSL-SDE" and r["nfe"] == 4]
    assert sde["median_s"] == pytest.approx(float(np.median([r["seconds"] for r in mine])))
    assert sde["gen_tokens_per_s"] == pytest.approx(sum(r["n_tokens"] for r in mine) / sum(r["seconds"] for r in mine))
    assert sde["forward_passes"] == 5  # NFE 4 = 2 Heun steps x 2 + the final decode
    assert rows[("AR-cache", None)]["nfe"] is None and ("AR-nocache", None) in rows
    md = (tmp_path / "run" / "summary.md").read_text()
    assert "Wall time: xsum" in md and "| AR-nocache | AR |" in md
    assert (tmp_path / "run" / "figures" / "walltime_xsum.png").stat().st_size > 1000
