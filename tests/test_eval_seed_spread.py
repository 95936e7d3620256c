"""`eval report` across sampling seeds: with two seeds every (dataset, method, NFE) row of the sampling tasks carries
each headline metric recomputed on one seed's items and its spread (min, max, SD over seeds); with one seed there is
no spread, and the report says "1 seed"."""

from __future__ import annotations

import json
import math
import statistics

import pytest
from eval_fixtures import base_config, data_dir, eval_models  # noqa: F401  (session fixture)

from dsl_llada.eval.eval_config import EvalConfig
from dsl_llada.eval.metrics import generation_metrics, rouge_aggregate
from dsl_llada.eval.runner import run_eval
from dsl_llada.eval.shards import read_records
from dsl_llada.stats import seed_spread

pytestmark = pytest.mark.usefixtures("one_thread")
METHODS = [{"name": "DSL-SDE", "model": "dsl", "preset": "dsl-sde"}, {"name": "LLaDA", "model": "llada", "preset": "llada"}]


def config(models, seeds: list[int], tmp_path) -> EvalConfig:
    d = data_dir()
    rows = [json.loads(x) for x in (d / "summ_xsum.jsonl").read_text().splitlines()[:2]]
    docs = tmp_path / "xsum_docs.jsonl"  # short documents (the first 40 words), the paper's XSum prompt applied
    docs.write_text("".join(json.dumps({"id": r["id"], "document": " ".join(r["prompt"].split("\n\n", 1)[1].split()[:40]),
                                        "summary": r["reference"]}) + "\n" for r in rows))
    tasks = [{"name": "generation", "options": {"scorer": {"path": str(models["ar"])}},
              "datasets": [{"name": "prompts", "path": str(d / "prompts_200.jsonl"), "limit": 3, "gen_length": 8}]},
             {"name": "reasoning", "datasets": [{"name": "gsm8k", "path": str(d / "gsm8k_test.jsonl"), "limit": 3,
                                                 "gen_length": 8}]},
             {"name": "summarization", "datasets": [{"name": "xsum", "path": str(docs), "gen_length": 8}]}]
    return EvalConfig.from_dict(base_config(models, tasks, methods=METHODS, seeds=seeds))


def recomputed_generation(models, recs) -> dict[str, float | None]:
    """GenPPL (token-weighted, scored afresh by the scorer model), D2, Rep and Len of one seed's records."""
    from dsl_llada.eval.scorers.genppl import CausalLMScorer

    texts = [r["text"] if r["error"] is None else "" for r in recs]
    g = generation_metrics(texts)
    scored = [(s, n) for s, n in CausalLMScorer(str(models["ar"])).nll([" ".join(t.split()[:128]) for t in texts if t.strip()])
              if n > 0]
    ppl = math.exp(sum(s for s, _ in scored) / sum(n for _, n in scored)) if scored else None
    return {"genppl": ppl, "d2": g["d2"], "rep": g["rep"], "len": g["len"]}


def test_two_seeds_give_per_seed_values_and_their_spread(eval_models, tmp_path):  # noqa: F811
    run_eval(config(eval_models, [42, 7], tmp_path), tmp_path / "run", progress=False)
    recs = read_records(tmp_path / "run")
    s = json.loads((tmp_path / "run" / "summary.json").read_text())
    md = (tmp_path / "run" / "summary.md").read_text()
    assert md.count("| dataset | method | NFE | metric | per seed | min – max | SD |") == 3  # one per task
    gen = s["tasks"]["generation"]["rows"]
    assert [(r["method"], r["nfe"], r["n"]) for r in gen] == [("DSL-SDE", 4, 6), ("LLaDA", 4, 6)]
    for row in gen:
        assert row["seeds"] == [7, 42]
        assert set(row["per_seed"]) == set(row["seed_spread"]) == {"genppl", "d2", "rep", "len"}
        mine = [r for r in recs if r["task"] == "generation" and r["method"] == row["method"]]
        expect = [recomputed_generation(eval_models, [r for r in mine if r["seed"] == seed]) for seed in (7, 42)]
        for key, vals in row["per_seed"].items():
            assert vals == pytest.approx([e[key] for e in expect], rel=1e-9)
            present = [v for v in vals if v is not None]
            sp = row["seed_spread"][key]
            assert sp["n"] == len(present) and sp["min"] == min(present) and sp["max"] == max(present)
            assert sp["sd"] == pytest.approx(statistics.stdev(present))
        g = row["per_seed"]["genppl"]
        assert (f"| prompts | {row['method']} | 4 | genppl | 7: {g[0]:.2f}, 42: {g[1]:.2f} | "
                f"{min(g):.2f} – {max(g):.2f} | {statistics.stdev(g):.2f} |") in md
        # the pooled value is not the mean of the per-seed ones for a ratio of sums, but lies within their range
        assert min(g) <= row["genppl"] <= max(g)
    for row in s["tasks"]["reasoning"]["rows"]:
        mine = [r for r in recs if r["task"] == "reasoning" and r["method"] == row["method"]]
        acc = [100.0 * sum(r["metrics"]["correct"] for r in mine if r["seed"] == seed) / 3 for seed in (7, 42)]
        assert row["seeds"] == [7, 42] and row["per_seed"] == {"acc": acc}
        assert row["seed_spread"]["acc"]["min"] == min(acc) and row["seed_spread"]["acc"]["max"] == max(acc)
    for row in s["tasks"]["summarization"]["rows"]:
        mine = [r for r in recs if r["task"] == "summarization" and r["method"] == row["method"]]
        per = [rouge_aggregate([r["metrics"] for r in mine if r["seed"] == seed]) for seed in (7, 42)]
        assert row["seeds"] == [7, 42] and set(row["per_seed"]) == {"rouge1", "rouge2", "rougeL"}
        for key in ("rouge1", "rouge2", "rougeL"):
            assert row["per_seed"][key] == pytest.approx([p[key] for p in per], rel=1e-12)
            assert row["seed_spread"][key]["max"] == max(row["per_seed"][key])
    assert "1 seed" not in md


def test_one_seed_has_no_spread_and_says_so(eval_models, tmp_path):  # noqa: F811
    run_eval(config(eval_models, [42], tmp_path), tmp_path / "run", progress=False)
    s = json.loads((tmp_path / "run" / "summary.json").read_text())
    md = (tmp_path / "run" / "summary.md").read_text()
    for task in ("generation", "reasoning", "summarization"):
        for row in s["tasks"][task]["rows"]:
            assert row["seeds"] == [42] and "per_seed" not in row and "seed_spread" not in row
    line = "Spread across seeds: 1 seed (42), no spread to report (list two or more `seeds` in the config)."
    assert md.count(line) == 3 and "| min – max |" not in md


def test_seed_spread_skips_undefined_values():
    assert seed_spread([1.0, None, 3.0]) == {"n": 2, "min": 1.0, "max": 3.0, "sd": pytest.approx(math.sqrt(2))}
    assert seed_spread([2.5]) == {"n": 1, "min": 2.5, "max": 2.5, "sd": None}
    assert seed_spread([None, float("nan")]) == {"n": 0, "min": None, "max": None, "sd": None}
