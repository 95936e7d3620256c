"""Confidence-threshold parallel decoding (`RemaskConfig.threshold`, Fast-dLLM's rule) on a tiny random LLaDA, CPU.

The tiny model's weights have std 0.3 so its confidences spread over (0, 1): a threshold in the middle commits
several positions in some steps and one in others, and rows finish their blocks at different steps.
"""

from __future__ import annotations

import json

import pytest
import torch
from fastapi.testclient import TestClient
from serve_helpers import save_tiny_toy_dsl

from dsl_llada.core.backbones.llada import LLaDABackbone, tiny_llada_config
from dsl_llada.cli.main import main
from dsl_llada.config import ConfigError, RemaskConfig
from dsl_llada.eval.eval_config import MethodSpec
from dsl_llada.eval.methods import sampler_for
from dsl_llada.core.loading import load_model, load_tokenizer
from dsl_llada.sampling.common import PromptBatch
from dsl_llada.sampling.remask import sample_remask
from dsl_llada.sampling.remask_step import remaining_quota, transfer_counts
from dsl_llada.serve.app import create_app

EOT = 61  # tiny config: mask 63, eos 62 (also the pad id), eot 61
PROMPTS = [[1, 2, 3], [4, 5, 6, 7, 8, 9, 10], [11, 12, 13, 14, 15]]


@pytest.fixture(scope="module")
def model() -> LLaDABackbone:
    m = LLaDABackbone(tiny_llada_config(vocab_size=64, d_model=32, n_layers=2, eot_token_id=EOT))
    m.init_weights(torch.Generator().manual_seed(0), std=0.3)
    return m.eval()


def run(model, cfg: RemaskConfig, prompts=PROMPTS, seeds=None, **kw):
    batch = PromptBatch.from_lists(prompts, model.special.pad_id)
    gens = None if seeds is None else [torch.Generator().manual_seed(s) for s in seeds]
    return sample_remask(model, batch, cfg, generator=gens, **kw)


BASE = RemaskConfig(steps=16, gen_length=16, block_length=8)
TAU = 0.15  # on this model: some steps commit several positions, others one


@pytest.mark.parametrize("n,s", [(13, 5), (8, 8), (5, 8), (0, 3), (32, 4), (1, 1)])
def test_remaining_quota_follows_the_linear_schedule(n, s):
    """Recomputed after each step's commits, the quota walks LLaDA's schedule: its first entry each time."""
    counts, left = [], n
    for i in range(s):
        q = int(remaining_quota(torch.tensor([left]), s - i))
        assert q == transfer_counts(left, s - i)[0]
        counts.append(q)
        left -= q
    assert counts == transfer_counts(n, s) and left == 0


@pytest.mark.parametrize("steps,kv", [(16, "off"), (4, "off"), (16, "dual")])
def test_threshold_one_is_the_fixed_schedule(model, steps, kv):
    """A probability never exceeds 1: the threshold run is the fixed-step run, token for token and pass for pass
    (steps = gen_length: one token per step)."""
    fixed = BASE.replace(steps=steps, kv_cache=kv)
    a, b = run(model, fixed), run(model, fixed.replace(threshold=1.0))
    assert torch.equal(a.ids, b.ids) and a.forward_passes == b.forward_passes == steps
    assert b.nfe == steps and b.steps_per_block.tolist() == [[steps // 2] * 2] * 3


def test_threshold_zero_commits_each_block_in_one_pass(model):
    seen: list[int] = []
    out = run(model, BASE.replace(threshold=0.0), callback=lambda info: seen.append(int(info.extra["n_committed"][0])))
    assert out.forward_passes == out.nfe == 2 and out.steps_per_block.tolist() == [[1, 1]] * 3
    assert seen == [8, 8] and not bool((out.ids == model.special.mask).any())


def test_threshold_commits_above_tau_and_at_least_one(model):
    """Each step commits every masked position above tau, plus the schedule's count (one per step at steps =
    gen_length) of the most confident others; fewer passes than the fixed run, data-dependent per row."""
    tau = TAU
    log: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []

    def watch(info):
        probs = info.logits.double().softmax(-1).max(-1).values  # the proposal's confidence (greedy)
        log.append((probs.clone(), info.newly_committed[:, info.window[0]:info.window[1]].clone(),
                    info.committed[:, info.window[0]:info.window[1]].clone()))

    out = run(model, BASE.replace(threshold=tau), callback=watch)
    for probs, newly, committed in log:
        eligible = ~(committed & ~newly)  # masked before this step
        above = (probs > tau) & eligible
        assert bool((newly | ~above).all())  # every masked position above tau was committed
        active = eligible.any(dim=1)
        assert bool((newly.sum(dim=1)[active] >= 1).all())  # and at least one per row still decoding
        assert bool((newly.sum(dim=1)[active] <= above.sum(dim=1)[active].clamp(min=1)).all())
    per_row = out.steps_per_block
    assert out.forward_passes == out.nfe == int(per_row.max(dim=0).values.sum()) < 16
    assert len({tuple(r) for r in per_row.tolist()}) > 1  # rows took different numbers of steps


@pytest.mark.parametrize("temperature,kv", [(0.0, "off"), (1.0, "off"), (1.0, "prefix")])
def test_batch_equals_rows_run_alone(model, temperature, kv):
    """Rows finish each block at different steps; a row that is done draws nothing, so each row's tokens and
    steps are those it gets alone with its own generator."""
    cfg = BASE.replace(threshold=TAU, temperature=temperature, kv_cache=kv, cache_refresh=1 if kv != "off" else 0)
    seeds = [3, 4, 5]
    batch = run(model, cfg, seeds=seeds)
    assert len({tuple(r) for r in batch.steps_per_block.tolist()}) > 1
    for i, (p, s) in enumerate(zip(PROMPTS, seeds, strict=True)):
        one = run(model, cfg, prompts=[p], seeds=[s])
        assert torch.equal(one.ids[0], batch.ids[i]) and torch.equal(one.lengths[0], batch.lengths[i])
        assert one.steps_per_block[0].tolist() == batch.steps_per_block[i].tolist()


def test_seed_twin(model):
    cfg = BASE.replace(threshold=TAU, temperature=1.0)
    a, b, c = (run(model, cfg, seeds=[s] * 3) for s in (7, 7, 8))
    assert torch.equal(a.ids, b.ids) and a.steps_per_block.tolist() == b.steps_per_block.tolist()
    assert not torch.equal(a.ids, c.ids)


def test_dual_cache_reuse_with_threshold_decodes_every_position(model):
    """kv_cache dual without refresh: stale keys/values of the other blocks, still one pass per committed group."""
    out = run(model, BASE.replace(threshold=TAU, kv_cache="dual"))
    assert not bool((out.ids == model.special.mask).any()) and out.forward_passes < 16
    exact = run(model, BASE.replace(threshold=TAU, kv_cache="dual", cache_refresh=1))
    assert torch.equal(exact.ids, run(model, BASE.replace(threshold=TAU)).ids)


def test_eos_ban_holds_when_a_block_commits_at_once(model):
    """EOS made the most confident token everywhere: tau near 0 would commit it in one pass; eos_inf bans it."""

    class EosBiased:
        special = model.special
        max_length = model.max_length

        def logits_from_ids(self, ids, attention_mask=None):
            out = model.logits_from_ids(ids, attention_mask).clone()
            out[..., model.special.eos] += 30.0
            return out

    free = run(EosBiased(), BASE.replace(threshold=0.01, truncate_at_eos=False))
    assert bool((free.ids == model.special.eos).all()) and free.forward_passes == 2
    banned = run(EosBiased(), BASE.replace(threshold=0.01, eos_inf=True, truncate_at_eos=False))
    assert not bool((banned.ids == model.special.eos).any())
    held = run(EosBiased(), BASE.replace(threshold=0.01, eos_suppress_ratio=0.5, truncate_at_eos=False))
    assert not bool((held.ids == model.special.eos).any()) and held.forward_passes == 2  # suppressed at step 0


@pytest.mark.parametrize("kw,fragment", [
    ({"threshold": 1.5}, r"threshold=1.5 is out of range: it must be >= 0 and <= 1"),
    ({"threshold": float("nan")}, r"threshold=nan is not valid"),
    ({"threshold": 0.9, "remasking": "random"}, r"threshold=0.9 needs remasking='low_confidence' without remdm"),
    ({"threshold": 0.9, "remdm": True}, r"remdm=True\): drop threshold"),
])
def test_bad_threshold_is_one_clear_error(kw, fragment):
    with pytest.raises(ConfigError, match=fragment):
        RemaskConfig(**kw)


def test_one_spelling_in_cli_eval_and_server(tmp_path, capsys):
    with pytest.raises(SystemExit):
        main(["generate", "--help"])
    assert "--threshold" in capsys.readouterr().out
    method = MethodSpec(name="fast", model="llada", preset="llada-block", options={"threshold": 0.9})
    cfg = sampler_for(method, 64, 64)
    assert isinstance(cfg, RemaskConfig) and cfg.threshold == 0.9 and cfg.block_length == 32

    folder = save_tiny_toy_dsl(tmp_path / "tiny")
    dsl, tok = load_model(folder), load_tokenizer(folder)
    body = {"prompt": "hi", "sampler": "remask", "steps": 8, "max_tokens": 8, "seed": 1, "threshold": 0.0}
    with TestClient(create_app(dsl, tok, model_name="tiny")) as c:
        with c.stream("POST", "/v1/completions", json={**body, "stream": True}) as r:
            events = [line for line in r.iter_lines() if line.startswith("data: {")]
        assert sum('"denoising"' in e for e in events) == 1  # one pass commits the whole block
        plain = c.post("/v1/completions", json=body).json()
        assert plain["dsl_llada"]["forward_passes"] == 1
        bad = c.post("/v1/completions", json={**body, "threshold": 2})
        assert bad.status_code == 400 and "threshold=2" in bad.json()["error"]["message"]
    out = tmp_path / "gen.jsonl"
    assert main(["generate", "--model", str(folder), "--sampler", "remask", "--steps", "8", "--gen-length", "8",
                 "--block-length", "4", "--threshold", "0", "--output", str(out), "-q", "--prompt", "hi",
                 "--prompt", "a longer prompt here"]) == 0
    recs = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["steps_per_block"] for r in recs] == [[1, 1], [1, 1]] and {r["forward_passes"] for r in recs} == {2}
    assert json.loads((tmp_path / "gen.jsonl.config.json").read_text())["config"]["threshold"] == 0.0


def test_dropped_row_leaves_the_others_unchanged_and_cfg_doubles_passes(model):
    cfg = BASE.replace(threshold=TAU, temperature=1.0)
    full = run(model, cfg, seeds=[3, 4, 5])

    def drop_row_one(info):
        if info.step == 0:
            info.drop(1)

    dropped = run(model, cfg, seeds=[3, 4, 5], callback=drop_row_one)
    assert dropped.dropped == [1] and dropped.steps_per_block[1].tolist() == [0, 0]
    for r in (0, 2):
        assert torch.equal(dropped.ids[r], full.ids[r])
        assert dropped.steps_per_block[r].tolist() == full.steps_per_block[r].tolist()
    guided = run(model, cfg.replace(cfg_scale=1.0), seeds=[3, 4, 5])
    assert guided.forward_passes == 2 * guided.nfe
