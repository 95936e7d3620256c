"""The NaN guard is a step callback: it fires on broken weights under every key/value-cache mode and for the SDE,
stays silent (and changes nothing) on a healthy model; `chain_callbacks` runs several observers in order."""

from __future__ import annotations

import pytest
import torch
from helpers import gen, tiny_backbone, tiny_dsl

from dsl_llada.config import RemaskConfig, SDEConfig
from dsl_llada.sampling import PromptBatch, sample_remask, sample_sde
from dsl_llada.sampling.guards import FiniteLogitsGuard, NonFiniteLogitsError
from dsl_llada.sampling.observers import chain_callbacks


def prompts() -> PromptBatch:
    return PromptBatch.from_lists([[1, 2, 3, 4], [5, 6, 7, 8]], pad_id=62)


def broken(module: torch.nn.Module, value: float) -> torch.nn.Module:
    with torch.no_grad():
        next(p for n, p in module.named_parameters() if "ff_out" in n or "lm_head" in n or n.endswith("out.weight")) \
            .fill_(value)
    return module


@pytest.mark.parametrize("kv_cache", ["off", "prefix", "dual"])
@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_guard_fires_under_every_cache_mode(kv_cache, value):
    bb = broken(tiny_backbone(), value)
    cfg = RemaskConfig(steps=4, gen_length=8, block_length=4, kv_cache=kv_cache)
    seen = []
    guard = FiniteLogitsGuard()
    # the guard, or the sampler's own check (NonFiniteStateError, a NonFiniteLogitsError) where it sees NaN first
    with pytest.raises(NonFiniteLogitsError, match="non-finite|NaN"):
        sample_remask(bb, prompts(), cfg, generator=gen(0), callback=chain_callbacks(seen.append, guard))
    assert len(seen) <= 1  # stopped at the first step


def test_guard_fires_for_the_sde():
    model = tiny_dsl()
    broken(model.backbone, float("nan"))
    with pytest.raises(NonFiniteLogitsError):
        sample_sde(model, prompts(), SDEConfig(nfe=4, gen_length=8), generator=gen(0), callback=FiniteLogitsGuard())


@pytest.mark.parametrize("kv_cache", ["off", "prefix", "dual"])
def test_guard_is_silent_and_changes_nothing_on_a_healthy_model(kv_cache):
    bb = tiny_backbone()
    cfg = RemaskConfig(steps=4, gen_length=8, block_length=4, kv_cache=kv_cache)
    guard = FiniteLogitsGuard()
    out = sample_remask(bb, prompts(), cfg, generator=gen(3), callback=guard)
    assert guard.checked
    assert torch.equal(out.ids, sample_remask(bb, prompts(), cfg, generator=gen(3)).ids)


def test_chain_callbacks():
    calls = []
    assert chain_callbacks(None, None) is None
    one = calls.append
    assert chain_callbacks(None, one) is one
    both = chain_callbacks(lambda i: calls.append(("a", i)), lambda i: calls.append(("b", i)))
    both(7)
    assert calls == [("a", 7), ("b", 7)]


def test_no_forward_hooks_in_the_package():
    """Observers use the step callback; a forward hook would miss the cached forward paths."""
    from pathlib import Path

    src = Path(__file__).resolve().parents[1] / "src" / "dsl_llada"
    hooked = [str(p.relative_to(src)) for p in src.rglob("*.py") if "register_forward_hook" in p.read_text(encoding="utf-8")]
    assert hooked == []


def test_the_guard_checks_the_first_step_only_and_ignores_minus_inf():
    from dsl_llada.sampling import StepInfo

    ok = torch.zeros(1, 2, 5)
    ok[..., 4] = float("-inf")  # banned ids are -inf on purpose
    guard = FiniteLogitsGuard()
    guard(StepInfo(0, 2, torch.zeros(1, 2, dtype=torch.long), logits=ok))
    guard(StepInfo(1, 2, torch.zeros(1, 2, dtype=torch.long), logits=torch.full((1, 2, 5), float("nan"))))  # not checked
    for bad in (float("nan"), float("inf")):
        logits = ok.clone()
        logits[0, 1, 2] = bad
        with pytest.raises(NonFiniteLogitsError, match="non-finite"):
            FiniteLogitsGuard()(StepInfo(0, 2, torch.zeros(1, 2, dtype=torch.long), logits=logits))
