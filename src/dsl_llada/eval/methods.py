"""The paper's named inference methods as sampler configs (Appendix 'Methods compared', official-impl §5).

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

Every preset's settings can be overridden per method with `options` (any SDEConfig/RemaskConfig field).
"""

from __future__ import annotations

from dataclasses import fields
from typing import Any

from ..config import ConfigError, RemaskConfig, SDEConfig
from .config import MethodSpec

_REMASK_PRESETS: dict[str, dict[str, Any]] = {
    "llada": {},
    "llada-eos": {"eos_inf": True},
    "llada-block": {"block_length": 32},
    "llada-star": {"eos_inf": True, "block_length": 32},
    "remdm": {"remdm": True},
    "dsl-remask": {},
    "dsl-remask-eos": {"eos_inf": True},
    "dsl-remask-block": {"block_length": 32},
}
_BLOCK_SDE_DEFAULTS: dict[str, Any] = {"block_length": 32, "eta": 0.01, "beta_absolute": 2.0}


def _check_options(method: MethodSpec, cls: type, extra: tuple[str, ...] = ()) -> None:
    valid = {f.name for f in fields(cls)} - {"nfe", "steps", "gen_length"}
    bad = sorted(set(method.options) - valid - set(extra))
    if bad:
        raise ConfigError(f"method {method.name!r}: unknown option(s) {bad} for preset {method.preset!r}; "
                          f"valid: {sorted(valid | set(extra))}")


def sampler_for(method: MethodSpec, nfe: int, gen_length: int):
    """The SamplerChoice (or, for 'ar', a dict of generate() settings) that runs `method` at `nfe` on responses of
    `gen_length` tokens. Raises ConfigError naming the method and the NFE values it can take."""
    from ..generation import SamplerChoice

    p = method.preset
    if p == "ar":
        bad = sorted(set(method.options) - {"repetition_penalty", "use_cache"})
        if bad:
            raise ConfigError(f"method {method.name!r}: unknown option(s) {bad} for preset 'ar'; "
                              "valid: ['repetition_penalty', 'use_cache']")
        return {"max_new_tokens": gen_length, **method.options}
    if p == "dsl-sde":
        _check_options(method, SDEConfig)
        if method.options.get("block_length"):
            raise ConfigError(f"method {method.name!r}: use preset 'block-sde' for block_length > 0")
        if nfe < 2 or nfe % 2:
            raise ConfigError(f"method {method.name!r} (dsl-sde) cannot take NFE {nfe}: the Heun sampler spends two model "
                              f"evaluations per step, so NFE must be even and >= 2")
        return SamplerChoice(SDEConfig(**{"nfe": nfe, "gen_length": gen_length, **method.options}))
    if p == "block-sde":
        _check_options(method, SDEConfig)
        opts = {**_BLOCK_SDE_DEFAULTS, **method.options}
        B = int(opts["block_length"])
        if B < 1 or gen_length % B:
            raise ConfigError(f"method {method.name!r}: block_length={B} must divide gen_length={gen_length}")
        n_blocks = gen_length // B
        per_block = nfe / n_blocks
        if per_block != int(per_block) or int(per_block) < 3 or int(per_block) % 2 == 0:
            ok = [n_blocks * (2 * s + 1) for s in (1, 2, 4, 8, 16)]
            raise ConfigError(f"method {method.name!r} (block-sde, {n_blocks} blocks of {B}) cannot take NFE {nfe}: NFE "
                              f"counts (L/B)(2S+1) forward passes, so it must be one of {n_blocks}*(2S+1), e.g. {ok}")
        S = (int(per_block) - 1) // 2
        return SamplerChoice(SDEConfig(**{**opts, "nfe": 2 * S, "gen_length": gen_length}))
    _check_options(method, RemaskConfig)
    opts = {**_REMASK_PRESETS[p], **method.options}
    try:
        cfg = RemaskConfig(**{**opts, "steps": nfe, "gen_length": gen_length})
    except ConfigError as e:
        raise ConfigError(f"method {method.name!r} ({p}) cannot take NFE {nfe} with gen_length {gen_length}: {e}") from None
    return SamplerChoice(cfg)


def needs_dsl(method: MethodSpec) -> bool:
    """Presets that need a DSL checkpoint (noise embedding + converter)."""
    return method.preset in ("dsl-sde", "block-sde")
