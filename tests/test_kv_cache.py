"""Approximate key/value caching: the backbone's cached forward, the window cache's refresh
rule, the samplers' cache options (R = 1 is exact) and the toy world's cache frontier."""

from __future__ import annotations

import pytest
import torch

from dsl_llada.config import ConfigError, RemaskConfig, SDEConfig
from dsl_llada.sampling import PromptBatch, sample_sde
from dsl_llada.sampling.kv_cache import WindowKVCache
from dsl_llada.sampling.remask import sample_remask
from helpers import EOS, gen, perturb_converter, tiny_backbone, tiny_dsl


def _inputs(B: int = 2, L: int = 12, H: int = 32, seed: int = 0) -> torch.Tensor:
    return torch.randn(B, L, H, generator=gen(seed))


def _padding() -> torch.Tensor:
    mask = torch.ones(2, 12, dtype=torch.long)
    mask[1, :3] = 0
    return mask


@pytest.mark.parametrize("kv_heads", [None, 2])
@pytest.mark.parametrize("padded", [False, True])
def test_cached_rows_equal_the_full_forward_when_nothing_changed(kv_heads, padded):
    bb = tiny_backbone(n_kv_heads=kv_heads)
    x, am = _inputs(), _padding() if padded else None
    with torch.no_grad():
        full = bb(x, am)
        logits, cache = bb.forward_cached(x, am, positions=slice(4, 8))
        assert cache.length == 12 and len(cache.keys) == 2
        assert cache.keys[0].shape == (2, kv_heads or 4, 12, 8)
        assert float((logits - full[:, 4:8]).abs().max()) < 1e-5
        for rows in ((4, 8), (4, 12), (0, 12)):  # dual window, prefix (window + suffix), everything
            lo, hi = rows
            sub, _ = bb.forward_cached(x[:, lo:hi], am, positions=slice(0, 4), cache=cache, start=lo)
            assert float((sub - full[:, lo:lo + 4]).abs().max()) < 1e-5


def test_one_layer_cache_is_exact_after_the_window_changes():
    """In layer 1 a position's keys/values depend only on its own input, so with one layer the stale cache is
    exact; with two layers the context's second-layer keys/values saw the old window and the logits differ."""
    x = _inputs()
    x2 = x.clone()
    x2[:, 4:8] = torch.randn(2, 4, 32, generator=gen(9))
    for n_layers, exact in ((1, True), (2, False)):
        bb = tiny_backbone(n_layers=n_layers)
        with torch.no_grad():
            _, cache = bb.forward_cached(x)
            cached, _ = bb.forward_cached(x2[:, 4:8], cache=cache, start=4, positions=slice(0, 4))
            truth = bb(x2)[:, 4:8]
        err = float((cached - truth).abs().max())
        assert (err < 1e-5) is exact, (n_layers, err)


def test_cached_forward_rejects_rows_outside_the_cached_sequence():
    bb = tiny_backbone()
    with torch.no_grad():
        _, cache = bb.forward_cached(_inputs())
        with pytest.raises(ValueError, match=r"rows \[10, 14\) are outside the cached sequence of 12"):
            bb.forward_cached(_inputs()[:, :4], cache=cache, start=10)


def test_window_cache_refreshes_every_r_calls_and_at_each_window():
    bb = tiny_backbone()
    x = _inputs()
    for refresh, full_calls in ((1, 6), (2, 4), (4, 2), (0, 2)):  # 2 windows x 3 calls each
        fwd = WindowKVCache(bb, "dual", refresh)
        for lo in (4, 8):
            fwd.start_window(lo, lo + 4)
            for _ in range(3):
                out = fwd(x, None, positions=slice(lo, lo + 4))
                assert out.shape == (2, 4, 64)
        assert (fwd.full_forwards, fwd.window_forwards) == (full_calls, 6 - full_calls), refresh


def test_window_cache_positions_and_backbone_errors():
    bb = tiny_backbone()
    fwd = WindowKVCache(bb, "dual", 0)
    fwd.start_window(4, 8)
    fwd(_inputs(), positions=slice(4, 8))
    with pytest.raises(ValueError, match=r"outside the recomputed rows \[4, 8\)"):
        fwd(_inputs(), positions=slice(4, 9))
    with pytest.raises(ValueError, match=r"positions \[2, 5\] are outside the recomputed rows \[4, 8\)"):
        fwd(_inputs(), positions=torch.tensor([2, 5]))
    prefix = WindowKVCache(bb, "prefix", 0)
    prefix.start_window(4, 8)
    prefix(_inputs(), positions=slice(4, 8))
    assert prefix(_inputs(), positions=torch.tensor([5, 11])).shape == (2, 2, 64)  # the suffix is recomputed too

    class NoCache(torch.nn.Module):
        family = "generic-hf"

    with pytest.raises(ConfigError, match="kv_cache='dual' needs a backbone with a key/value cache.*'generic-hf'"):
        WindowKVCache(NoCache(), "dual", 0)


@pytest.mark.parametrize("field,value,message", [
    ("kv_cache", "full", r"kv_cache='full' is not valid; expected one of \['off', 'prefix', 'dual'\]"),
    ("cache_refresh", -1, "cache_refresh=-1 must be an int >= 0"),
    ("cache_refresh", 1.5, "cache_refresh=1.5 must be an int >= 0"),
])
def test_cache_options_are_validated(field, value, message):
    for cls in (SDEConfig, RemaskConfig):
        with pytest.raises(ConfigError, match=message):
            cls(**{field: value})
    with pytest.raises(ConfigError, match="with cfg_scale=1.0 is not supported"):
        RemaskConfig(kv_cache="dual", cfg_scale=1.0)
    with pytest.raises(ConfigError, match="compile=True with kv_cache='prefix' is not supported"):
        SDEConfig(kv_cache="prefix", compile=True)


PROMPTS = [[1, 2, 3, 4, 5], [6, 7, 8]]
CONFIGS = [SDEConfig(nfe=8, gen_length=16, block_length=4), SDEConfig(nfe=8, gen_length=16),
           RemaskConfig(steps=16, gen_length=16, block_length=4, temperature=1.0),
           RemaskConfig(steps=8, gen_length=16, remdm=True, temperature=1.0)]  # T > 0: the seed matters


def _run(model, cfg, seed: int = 3):
    batch = PromptBatch.from_lists(PROMPTS, pad_id=EOS)
    fn = sample_sde if isinstance(cfg, SDEConfig) else sample_remask
    return fn(model, batch, cfg, generator=gen(seed))


@pytest.mark.parametrize("cfg", CONFIGS, ids=["block-sde", "sde", "block-remask", "remdm"])
def test_refresh_every_call_is_the_exact_sampler(cfg):
    model = perturb_converter(tiny_dsl())
    exact = _run(model, cfg)
    for mode in ("prefix", "dual"):
        cached = _run(model, cfg.replace(kv_cache=mode, cache_refresh=1))
        assert torch.equal(cached.ids, exact.ids), mode
        assert cached.forward_passes == exact.forward_passes
    other_seed = _run(model, cfg, seed=4)
    assert not torch.equal(other_seed.ids, exact.ids)


@pytest.mark.parametrize("cfg", CONFIGS[:3], ids=["block-sde", "sde", "block-remask"])
def test_stale_caches_change_tokens_but_stay_seeded(cfg):
    model = perturb_converter(tiny_dsl())
    exact = _run(model, cfg)
    stale = cfg.replace(kv_cache="dual", cache_refresh=0)
    a, b = _run(model, stale), _run(model, stale)
    assert torch.equal(a.ids, b.ids)  # deterministic for a seed
    assert not torch.equal(a.ids, exact.ids)  # and really approximate on this 2-layer model
    assert a.config["kv_cache"] == "dual" and a.config["cache_refresh"] == 0


def test_remask_cache_on_a_bare_backbone_and_one_layer_exactness():
    """Block remasking changes only the current block between a block's calls, so on a one-layer model even a
    never-refreshed cache gives the exact tokens."""
    bb = tiny_backbone(n_layers=1)
    cfg = RemaskConfig(steps=16, gen_length=16, block_length=4)
    assert torch.equal(_run(bb, cfg.replace(kv_cache="prefix", cache_refresh=0)).ids, _run(bb, cfg).ids)


# -- the toy world's cache frontier (`dsl-llada demo --cache-frontier`) ---------------------------------------------

def _micro_demo(out):
    from dsl_llada.toy.demo import Demo, DemoConfig
    from dsl_llada.toy.demo_train import TrainStage

    cfg = DemoConfig(d_model=32, n_layers=2, n_heads=2, noise_dim=8, n_train=64, batch_size=8,
                     pretrain=TrainStage(objective="mdm", steps=4, lr=1e-3, warmup=1, batch_size=8),
                     cpt=TrainStage(objective="dsl", steps=4, lr=1e-3, warmup=1, batch_size=8))
    return Demo(cfg, out, progress=False, echo=lambda s: None)


def test_cache_frontier_rows_table_plot_and_resume(tmp_path, monkeypatch):
    import json

    from dsl_llada.toy import evaluate
    from dsl_llada.toy.cache_frontier import FrontierConfig, variants

    fc = FrontierConfig(sde_nfe=2, remask_steps=8, n_open=3, n_summarize=1, rounds=2, batch_size=4, modes=("dual",),
                        refreshes=(2,), tolerances=(1e-3,))
    rows = _micro_demo(tmp_path).cache_frontier(fc)
    # Block SDE: 2 dtypes x 2 converters x (exact, dual R=2); SDE: 2 x 2 x exact; remasking: 2 dtypes x 2 caches
    assert len(variants(fc)) == 8 + 4 + 4 and len(rows) == 16
    labels = [(r["sampler"], r["label"]) for r in rows]
    assert labels[:4] == [("Block SDE", "R=1 (exact)"), ("Block SDE", "dual, R=2"),
                          ("Block SDE", "R=1 (exact), sparse 0.001"), ("Block SDE", "dual, R=2, sparse 0.001")]
    assert labels[4] == ("Block SDE", "R=1 (exact), bf16") and labels[7] == ("Block SDE", "dual, R=2, bf16, sparse 0.001")
    assert labels[8:12] == [("SDE", "R=1 (exact)"), ("SDE", "R=1 (exact), sparse 0.001"), ("SDE", "R=1 (exact), bf16"),
                            ("SDE", "R=1 (exact), bf16, sparse 0.001")]
    assert labels[12:] == [("Block remasking", "R=1 (exact)"), ("Block remasking", "dual, R=2"),
                           ("Block remasking", "R=1 (exact), bf16"), ("Block remasking", "dual, R=2, bf16")]
    for r in rows:
        assert r["n"] == 4 and r["rounds"] == 2
        assert r["seconds_min"] <= r["seconds_per_sample"] <= r["seconds_max"]
        assert r["open"]["n"] == 3 and r["summarize"]["n"] == 1
        lo, hi = r["open"]["ppl_ci"]
        assert lo <= r["open"]["ppl"] <= hi and len(r["summarize"]["rougeL_ci"]) == 2
        if r["label"] == "R=1 (exact)":
            assert r["same_tokens"] == 100.0 and r["speedup"] == 1.0 and r["dtype"] == "float32"
        else:
            assert 0.0 <= r["same_tokens"] <= 100.0
    out = tmp_path / "cache_frontier"
    runs = [json.loads(x) for x in (out / "runs.jsonl").read_text().splitlines()]
    assert len(runs) == 32 and sorted({r["round"] for r in runs}) == [0, 1]
    assert sum("open" in r for r in runs) == 16  # quality scored once per variant
    assert {(r["dtype"], r["tolerance"]) for r in runs if r["sampler"] == "SDE"} == {
        ("float32", 0.0), ("float32", 1e-3), ("bfloat16", 0.0), ("bfloat16", 1e-3)}
    assert {r["config"]["converter_tolerance"] for r in runs if r["sampler"] != "Block remasking"} == {0.0, 1e-3}
    table = (out / "frontier.md").read_text()
    main_table = table.split("Which sampler to pick")[0]
    assert main_table.count("\n| ") == 1 + 16 + 1  # header, the variants, the world's own samples
    assert table.count("\n| >= ") == 8  # one line per quality level, open-ended and summarisation
    assert "| Block remasking | dual, R=2, bf16 |" in table and "| World (true samples) |" in table
    assert "Recommended points:" in table and "- DSL model (any SDE): recommended " in table
    assert f"Timed with {torch.get_num_threads()} thread(s); 1-minute load average at the timed runs " in table
    assert all(len(r["loads"]) == 2 and r["threads"] == [torch.get_num_threads()] for r in rows)
    assert (out / "frontier.png").stat().st_size > 10_000
    config = json.loads((out / "config.json").read_text())
    assert config["frontier"] == json.loads(json.dumps(fc.to_dict()))
    assert config["keys"] == [r["key"] for r in rows] and config["reference"]["open"]["in_support"] == 100.0
    from dsl_llada.toy.frontier_report import render_run

    assert render_run(runs, config) == table  # the run's two files alone give the demo's report, verbatim

    def no_sampling(*a, **k):
        raise AssertionError("a finished frontier must not sample again")

    monkeypatch.setattr(evaluate, "run_batches", no_sampling)  # the frontier samples through evaluate.sampled_rows
    again = _micro_demo(tmp_path).cache_frontier(fc)
    assert [r["seconds_per_sample"] for r in again] == [r["seconds_per_sample"] for r in rows]


def test_cache_frontier_bf16_leaves_the_callers_models_fp32(tmp_path, monkeypatch):
    from dsl_llada.toy import demo as demo_module
    from dsl_llada.toy.cache_frontier import FrontierConfig, run_frontier

    seen = {}

    def spy(models, *a, **k):
        seen.update(models)
        return run_frontier(models, *a, **k)

    monkeypatch.setattr(demo_module, "run_frontier", spy)
    fc = FrontierConfig(sde_nfe=2, remask_steps=4, n_open=1, n_summarize=0, batch_size=2, modes=("dual",),
                        refreshes=(0,), tolerances=(), whole_sde=False)
    rows = _micro_demo(tmp_path).cache_frontier(fc)
    assert [r["dtype"] for r in rows] == ["float32"] * 2 + ["bfloat16"] * 2 + ["float32"] * 2 + ["bfloat16"] * 2
    assert {next(m.backbone.parameters() if hasattr(m, "backbone") else m.parameters()).dtype
            for m in seen.values()} == {torch.float32}


def test_frontier_measures_every_sampler_with_the_oracle_ceiling_and_batch_1(tmp_path):
    import json

    from dsl_llada.toy.cache_frontier import FrontierConfig, variants

    fc = FrontierConfig(sde_nfe=2, remask_steps=8, n_open=3, n_summarize=1, rounds=1, batch_size=4, modes=("dual",),
                        refreshes=(0,), tolerances=(), dtypes=("float32",), sde_nfes=(4,), remask_steps_grid=(4,),
                        thresholds=(0.5,), threshold_modes=("off", "dual"), remdm_steps=(8,), oracle=True,
                        batch1_prompts=2)
    vs = variants(fc)
    labels = [(v.name, v.label) for v in vs]
    assert labels == [("Block SDE", "R=1 (exact)"), ("Block SDE", "dual, R=never"), ("SDE", "R=1 (exact)"),
                      ("Block remasking", "R=1 (exact)"), ("Block remasking", "dual, R=never"),
                      ("Block SDE", "NFE 4, R=1 (exact)"), ("SDE", "NFE 4, R=1 (exact)"),
                      ("Block remasking", "4 steps, R=1 (exact)"), ("Threshold remasking", "tau=0.5, R=1 (exact)"),
                      ("Threshold remasking", "tau=0.5, dual, R=never"), ("ReMDM", "8 steps, R=1 (exact)"),
                      ("Oracle SDE", "NFE 2, R=1 (exact)"), ("Oracle SDE", "NFE 4, R=1 (exact)"),
                      ("Oracle Block remasking", "R=1 (exact)"), ("Oracle Threshold remasking", "tau=0.5, R=1 (exact)")]
    gen = 32
    assert vs[8].config(fc, gen).threshold == 0.5 and vs[8].config(fc, gen).steps == gen  # at most one step a token
    assert vs[10].config(fc, gen).remdm and vs[6].config(fc, gen).nfe == 4 and vs[7].config(fc, gen).steps == 4
    assert [v.model for v in vs[11:]] == ["oracle-dsl", "oracle-dsl", "oracle", "oracle"]
    rows = _micro_demo(tmp_path).cache_frontier(fc)
    assert len(rows) == len(vs)
    by = {(r["sampler"], r["label"]): r for r in rows}
    for r in rows:
        assert r["seconds_min_b1"] <= r["seconds_per_sample_b1"] <= r["seconds_max_b1"]
        assert 0.0 <= r["open"]["complete"] <= r["open"]["in_support"] + 1e-9
        assert len(r["open"]["premature_eos%_ci"]) == 2 and r["forward_passes"] >= 1
    fixed = by["Block remasking", "R=1 (exact)"]
    assert fixed["forward_passes"] == 8 and fixed["budget"] == 8 and fixed["speedup"] == 1.0
    thr = by["Threshold remasking", "tau=0.5, R=1 (exact)"]
    assert thr["budget"] == gen and 4 <= thr["forward_passes"] <= gen and thr["speedup"] is not None
    assert by["ReMDM", "8 steps, R=1 (exact)"]["same_tokens"] is not None  # against exact block remasking
    oracle = by["Oracle SDE", "NFE 2, R=1 (exact)"]
    assert oracle["oracle"] and oracle["speedup"] is None
    assert oracle["open"]["in_support"] == 100.0  # the exact denoiser never leaves the grammar
    table = (tmp_path / "cache_frontier" / "frontier.md").read_text()
    assert "| Oracle SDE | NFE 2, R=1 (exact) | – | – |" in table  # the oracle's time is not a speed figure
    assert "- DSL model (any SDE): recommended " in table and "- Masked DLM (any remasking): recommended " in table
    runs = [json.loads(x) for x in (tmp_path / "cache_frontier" / "runs.jsonl").read_text().splitlines()]
    assert len({r["key"] for r in runs}) == len(vs)  # every variant its own resumable key


def _row(sampler, label, sec, ppl_ci, ins_ci=(90.0, 100.0), rouge_ci=(40.0, 50.0), mode="off", dtype="float32",
         tolerance=0.0, **extra):
    return {"sampler": sampler, "label": label, "mode": mode, "refresh": 1, "dtype": dtype, "tolerance": tolerance,
            "seconds_per_sample": sec, "seconds_min": sec, "seconds_max": sec, "n": 3, **extra,
            "open": {"ppl": sum(ppl_ci) / 2, "ppl_ci": list(ppl_ci), "in_support": sum(ins_ci) / 2,
                     "in_support_ci": list(ins_ci)},
            "summarize": {"rougeL": sum(rouge_ci) / 2, "rougeL_ci": list(rouge_ci)}}


def test_frontier_recommends_the_fastest_point_within_exact_intervals():
    from dsl_llada.toy.frontier_report import recommendation_lines, recommendations, within_exact

    exact = _row("Block SDE", "R=1 (exact)", 1.0, (2.0, 3.0))
    ok = _row("Block SDE", "dual, R=2", 0.5, (2.8, 3.5), mode="dual")  # overlaps on every metric
    fastest_bad_ppl = _row("Block SDE", "dual, R=never", 0.2, (3.3, 4.0), mode="dual")
    fastest_bad_rouge = _row("Block SDE", "bf16", 0.1, (2.0, 3.0), rouge_ci=(10.0, 39.9), dtype="bfloat16")
    assert within_exact(ok, exact) and not within_exact(fastest_bad_ppl, exact)
    assert not within_exact(fastest_bad_rouge, exact)
    no_rouge = dict(ok, summarize=None)
    assert not within_exact(no_rouge, exact)  # a metric only the exact row has cannot be checked: not recommended
    whole = _row("SDE", "R=1 (exact)", 2.0, (2.5, 3.2))
    whole_bf16 = _row("SDE", "R=1 (exact), bf16", 0.4, (2.4, 3.3), dtype="bfloat16")
    recs = {scope: (best["label"], ref["label"]) for scope, best, ref in
            recommendations([exact, ok, fastest_bad_ppl, fastest_bad_rouge, whole, whole_bf16])}
    assert recs == {"Block SDE": ("dual, R=2", "R=1 (exact)"), "SDE": ("R=1 (exact), bf16", "R=1 (exact)"),
                    "DSL model (any SDE)": ("R=1 (exact), bf16", "R=1 (exact)")}
    lines = recommendation_lines([exact, ok, whole])
    assert lines[0].startswith("Block SDE: recommended Block SDE [dual, R=2] at 2.0 samples/s, 2.00x exact fp32")
    assert lines[-1].startswith("DSL model (any SDE): recommended Block SDE [dual, R=2] at 2.0 samples/s, 4.00x exact")
    # nothing within the intervals and faster: the exact point itself
    assert recommendations([exact, fastest_bad_ppl])[0][1] is exact


def oracle_free_fastest(rows):
    return min((r for r in rows if not r.get("oracle")), key=lambda r: r["seconds_per_sample"])


def test_threshold_speedup_family_reference_and_quality_levels():
    from dsl_llada.toy.frontier_report import level_rows, recommendations, threshold_line

    def rem(sampler, label, sec, ppl_ci, complete, steps=0, threshold=None, budget=32, b1=None, oracle=False):
        r = _row(sampler, label, sec, ppl_ci, steps=steps, threshold=threshold, budget=budget, oracle=oracle,
                 forward_passes=float(budget if threshold is None else 9))
        r["open"] |= {"complete": complete, "complete_ci": [complete - 5, complete + 5]}
        if b1 is not None:
            r |= {"seconds_per_sample_b1": b1, "seconds_min_b1": b1, "seconds_max_b1": b1}
        return r

    ref = rem("Block remasking", "R=1 (exact)", 1.0, (4.0, 5.0), 80.0, b1=2.0)
    few = rem("Block remasking", "8 steps, R=1 (exact)", 0.3, (9.0, 12.0), 40.0, steps=8, budget=8, b1=0.6)
    sixteen = rem("Block remasking", "16 steps, R=1 (exact)", 0.5, (4.5, 5.5), 78.0, steps=16, budget=16, b1=1.0)
    thr = rem("Threshold remasking", "tau=0.7, R=1 (exact)", 0.25, (4.2, 5.2), 79.0, threshold=0.7, b1=0.4)
    thr_bad = rem("Threshold remasking", "tau=0.3, R=1 (exact)", 0.1, (8.0, 9.0), 50.0, threshold=0.3, b1=0.2)
    sde = rem("SDE", "R=1 (exact)", 0.2, (20.0, 30.0), 30.0, budget=16, b1=0.3)
    sde64 = rem("SDE", "NFE 64, R=1 (exact)", 0.8, (21.0, 31.0), 32.0, steps=64, budget=64, b1=1.2)
    oracle = rem("Oracle Threshold remasking", "tau=0.7, R=1 (exact)", 0.01, (4.0, 4.1), 100.0, threshold=0.7,
                 oracle=True)
    rows = [ref, few, sixteen, thr, thr_bad, sde, sde64, oracle]
    recs = {scope: (best["label"], r["label"]) for scope, best, r in recommendations(rows)}
    assert recs["Masked DLM (any remasking)"] == ("tau=0.7, R=1 (exact)", "R=1 (exact)")
    assert recs["Threshold remasking"] == ("tau=0.7, R=1 (exact)", "R=1 (exact)")  # against fixed-step exact
    assert recs["DSL model (any SDE)"] == ("R=1 (exact)", "NFE 64, R=1 (exact)")  # the reference: largest NFE
    line = threshold_line(rows)
    assert line.startswith("Threshold decoding at equal exact quality (within exact block remasking at 32 steps)")
    # 0.5 s against 0.25 s at the quality batch; 1.0 s against 0.4 s at batch 1
    assert ("both exact fp32 without a cache, quality batch: [tau=0.7, R=1 (exact)] 4.0 samples/s against fixed-step "
            "[16 steps, R=1 (exact)] 2.0, **2.00x**") in line
    assert "without a cache, batch 1: [tau=0.7, R=1 (exact)] 2.5 samples/s against fixed-step [16 steps, R=1 " in line
    assert "9.0 forward passes per response at [tau=0.7, R=1 (exact)] against 32" in line
    levels = {e["level"]: e for e in level_rows(rows)}
    assert levels[90.0]["b8"] is None  # only the oracle reaches 90 %, and the oracle is never picked
    assert levels[75.0]["b8"] is thr and levels[75.0]["b1"] is thr
    assert levels[25.0]["b8"] is thr_bad and levels[25.0]["b1"] is thr_bad
    rouge = {e["level"]: e["b8"] for e in level_rows(rows, "summarize", "rougeL", (45.0, 60.0))}
    assert rouge == {45.0: oracle_free_fastest(rows), 60.0: None}
    assert threshold_line([ref, few]) is None  # no threshold row: no line


@pytest.mark.parametrize("kw,message", [
    ({"refreshes": (1,)}, r"refreshes=\[1\]: each must be an int 0 \(never\) or >= 2"),
    ({"modes": ("off",)}, r"modes=\['off'\]: choose from \['dual', 'prefix'\]"),
    ({"sde_nfe": 3}, "sde_nfe=3 must be an even int >= 2"),
    ({"remask_steps": 30}, "remask_steps=30 must be a multiple of blocks=4"),
    ({"dtypes": ("float16",)}, r"dtypes=\['float16'\]: choose distinct values from \['float32', 'bfloat16'\]"),
    ({"tolerances": (0.0,)}, r"tolerances=\[0.0\]: each must be a float in \(0, 1\)"),
    ({"sde_nfes": (5,)}, r"sde_nfes=\[5\]: each must be an even int from 2 to 65536"),
    ({"remask_steps_grid": (6,)}, r"remask_steps_grid=\[6\]: each must be a multiple of blocks=4 from 4 to 65536"),
    ({"remdm_steps": (0,)}, r"remdm_steps=\[0\]: each must be a multiple of blocks=4"),
    ({"thresholds": (1.0,)}, r"thresholds=\[1.0\]: each must be a float in \(0, 1\)"),
    ({"threshold_modes": ("both",)}, r"threshold_modes=\['both'\]: choose from \['off', 'prefix', 'dual'\]"),
    ({"batch1_prompts": 100}, r"batch1_prompts=100 must be from 0 to n_open \+ n_summarize = 72"),
])
def test_frontier_config_errors(kw, message):
    from dsl_llada.toy.cache_frontier import FrontierConfig

    with pytest.raises(ConfigError, match=message):
        FrontierConfig(**kw)


def test_demo_cache_frontier_flag_excludes_the_sweep(capsys):
    from dsl_llada.cli.main import build_parser, main

    args = build_parser().parse_args(["demo", "--cache-frontier", "--quick"])
    assert args.cache_frontier and args.quick and not args.sweep
    with pytest.raises(SystemExit) as e:
        main(["demo", "--cache-frontier", "--sweep"])
    assert e.value.code == 2
    assert "argument --sweep: not allowed with argument --cache-frontier" in capsys.readouterr().err


def test_results_rows_survive_an_interrupted_append(tmp_path):
    """A kill mid-append leaves a partial line; the next append closes it, so only the fragment is lost."""
    from dsl_llada.toy.sweep import append_rows, read_rows

    path = tmp_path / "runs.jsonl"
    append_rows(path, [{"key": "a", "round": 0}])
    with path.open("a") as f:
        f.write('{"key": "b", "rou')  # what a kill leaves behind
    append_rows(path, [{"key": "c", "round": 0}, {"key": "d", "round": 1}])
    assert [r["key"] for r in read_rows(path)] == ["a", "c", "d"]
    assert read_rows(tmp_path / "missing.jsonl") == []


def test_cache_runs_in_bf16_and_refresh_one_stays_exact():
    """The GPU dtype path, exercised on CPU: a bf16 backbone (the converter's softmax stays fp32)."""
    model = perturb_converter(tiny_dsl(seed=5))
    model.backbone.to(torch.bfloat16)
    model.converter.backbone_embedding.to(torch.bfloat16)
    cfg = SDEConfig(nfe=4, gen_length=8, block_length=4, top_m=8)
    exact = _run(model, cfg)
    assert torch.equal(_run(model, cfg.replace(kv_cache="dual", cache_refresh=1)).ids, exact.ids)
    stale = _run(model, cfg.replace(kv_cache="dual", cache_refresh=0))
    assert stale.ids.shape == (2, 8) and ((stale.ids >= 0) & (stale.ids < model.vocab_size)).all()
