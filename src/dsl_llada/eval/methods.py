"""The paper's named inference methods as sampler configs (Appendix 'Methods compared', docs/provenance.md §5).

| preset            | sampler    | settings                                                                  |
|-------------------|------------|---------------------------------------------------------------------------|
| dsl-sde           | sde        | Heun SDE, NFE = 2S solver evaluations, sensitive schedule, eta by NFE, beta x2 |
| block-sde         | block-sde  | blocks of B (default 32), NFE = (L/B)(2S+1) forward passes, eta 0.01, beta_inf 2.0 absolute |
| llada             | remask     | low-confidence remasking, one block of L, steps = NFE                      |
| llada-eos         | remask     | + EOS logit -inf                                                           |
| llada-block       | remask     | + block 32                                                                 |
| llada-star        | remask     | EOS -inf + block 32 (LLaDA*)                                               |
| remdm             | remdm      | ReMDM-conf-loop (t_on 0.55, t_off 0.05, alpha 0.9)                         |
| dsl-remask[-eos|-block] | remask | discrete remasking on the DSL model                                     |
| ar                | ar         | greedy decoding of a Hugging Face causal LM, max_new_tokens = L            |

Every preset's settings can be overridden per method with `options` (any field of its sampler's config).
"""

from __future__ import annotations

from dataclasses import fields
from typing import Any

from ..config import BLOCK_SDE, REMASK, REMDM, SDE, ConfigError
from ..sampling.registry import SamplerConfig, get_spec, sampler_config
from .eval_config import MethodSpec

_PRESETS: dict[str, tuple[str, dict[str, Any]]] = {
    "dsl-sde": (SDE, {}),
    BLOCK_SDE: (BLOCK_SDE, {"block_length": 32, "eta": 0.01, "beta_absolute": 2.0}),  # the preset is named after its sampler
    "llada": (REMASK, {}),
    "llada-eos": (REMASK, {"eos_inf": True}),
    "llada-block": (REMASK, {"block_length": 32}),
    "llada-star": (REMASK, {"eos_inf": True, "block_length": 32}),
    "remdm": (REMDM, {}),
    "dsl-remask": (REMASK, {}),
    "dsl-remask-eos": (REMASK, {"eos_inf": True}),
    "dsl-remask-block": (REMASK, {"block_length": 32}),
}
"""Every sampler preset: (registry sampler name, its settings before the method's `options`)."""


def _check_options(method: MethodSpec, cls: type) -> None:
    valid = {f.name for f in fields(cls)} - {"nfe", "steps", "gen_length"}
    bad = sorted(set(method.options) - valid)
    if bad:
        raise ConfigError(f"method {method.name!r}: unknown option(s) {bad} for preset {method.preset!r}; "
                          f"valid: {sorted(valid)}")


def sampler_for(method: MethodSpec, nfe: int, gen_length: int) -> SamplerConfig | dict[str, Any]:
    """The sampler config (or, for 'ar', a dict of generate() settings) that runs `method` at `nfe` on responses of
    `gen_length` tokens, built by the registry's parser. Raises ConfigError naming the method and the NFE values it
    can take."""
    p = method.preset
    if p == "ar":
        bad = sorted(set(method.options) - {"repetition_penalty", "use_cache"})
        if bad:
            raise ConfigError(f"method {method.name!r}: unknown option(s) {bad} for preset 'ar'; "
                              "valid: ['repetition_penalty', 'use_cache']")
        return {"max_new_tokens": gen_length, **method.options}
    name, preset_options = _PRESETS[p]
    _check_options(method, get_spec(name).config_class)
    opts = {**preset_options, **method.options}
    if name == SDE:
        if opts.get("block_length"):
            raise ConfigError(f"method {method.name!r}: use preset {BLOCK_SDE!r} for block_length > 0")
        if nfe < 2 or nfe % 2:
            raise ConfigError(f"method {method.name!r} ({p}) cannot take NFE {nfe}: the Heun sampler spends two model "
                              f"evaluations per step, so NFE must be even and >= 2")
        return sampler_config(SDE, {**opts, "nfe": nfe, "gen_length": gen_length})
    if name == BLOCK_SDE:
        B = int(opts["block_length"])
        if B < 1 or gen_length % B:
            raise ConfigError(f"method {method.name!r}: block_length={B} must divide gen_length={gen_length}")
        n_blocks = gen_length // B
        per_block = nfe / n_blocks
        if per_block != int(per_block) or int(per_block) < 3 or int(per_block) % 2 == 0:
            ok = [n_blocks * (2 * s + 1) for s in (1, 2, 4, 8, 16)]
            raise ConfigError(f"method {method.name!r} ({p}, {n_blocks} blocks of {B}) cannot take NFE {nfe}: NFE "
                              f"counts (L/B)(2S+1) forward passes, so it must be one of {n_blocks}*(2S+1), e.g. {ok}")
        S = (int(per_block) - 1) // 2
        return sampler_config(BLOCK_SDE, {**opts, "nfe": 2 * S, "gen_length": gen_length})
    name = REMDM if opts.pop("remdm", name == REMDM) else REMASK  # `options: {remdm: ...}` picks the loop on or off
    try:
        return sampler_config(name, {**opts, "steps": nfe, "gen_length": gen_length})
    except ConfigError as e:
        raise ConfigError(f"method {method.name!r} ({p}) cannot take NFE {nfe} with gen_length {gen_length}: {e}") from None


def needs_dsl(method: MethodSpec) -> bool:
    """Presets that need a DSL checkpoint (noise embedding + converter)."""
    return method.preset in _PRESETS and get_spec(_PRESETS[method.preset][0]).needs_dsl
