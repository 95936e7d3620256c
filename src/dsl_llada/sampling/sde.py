"""Embedding-space SDE sampling with the stochastic Heun solver (paper Algorithm 2) and Block SDE.

State: normalised y = z / gamma per response position (unit-norm random init). Each Heun step from gamma_s to
gamma_{s+1} (Delta = gamma_{s+1} - gamma_s) evaluates the denoiser twice:
    v_s  = (ê(y, gamma_s) - y) / gamma_s,           y_e = y + Delta v_s + g_s dW  (g_s = eta/gamma_s; predictor noise)
    v_e  = (ê(y_e, gamma_{s+1}) - y_e) / gamma_{s+1}
    y   <- y + Delta/2 (v_s + v_e) + 1/2 (eta/gamma_s + eta/gamma_{s+1}) dW,     dW = sqrt(|Delta|) xi
Predictor noise (the authors' code, default) makes the explicit noise per step (eta/gamma_{s+1}) dW; without it
('Algorithm 2 as printed', predictor_noise=False) it is 1/2 (eta/gamma_s + eta/gamma_{s+1}) dW (docs/samplers.md).
ê is the top-M renormalised posterior mean over the noise embedding (`denoiser.Denoiser`). After S = NFE/2 steps
one more forward at the final SNR decodes by argmax: forward passes executed = 2S + 1 (reported separately from
NFE = 2S).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F

from ..config import FP32_MAX, SDEConfig
from ..errors import ConfigError
from ..model import DSLModel
from ..numerics import denormals_flushed_during
from ..snr import snr_schedule
from ..utils import progress as progress_bar
from .common import PromptBatch, RowRNG, SampleOutput, StepCallback, StepInfo, check_prompt_fits, stop_lengths
from .denoiser import Denoiser
from .guards import WEIGHTS_MESSAGE, NonFiniteLogitsError, check_finite_state, has_broken_logits
from .observers import with_progress

Denoise = Callable[[torch.Tensor, float], tuple[torch.Tensor, torch.Tensor]]
"""What `heun_solve` integrates against: (y, gamma) -> (ê, logits); a `Denoiser` or a test double."""


def inference_beta(model: DSLModel, config: SDEConfig) -> float:
    """beta_inf: absolute when configured, else beta_scale x the trained beta (paper: 2 x)."""
    return config.beta_absolute if config.beta_absolute is not None else config.beta_scale * model.trained_beta


def heun_solve(denoise: Denoise, y: torch.Tensor, grid: torch.Tensor, *, eta: float, predictor_noise: bool,
               rng: RowRNG, on_step: Callable[[int, float, torch.Tensor], None] | None = None,
               check_first: Callable[[torch.Tensor], None] | None = None,
               check_state: Callable[[torch.Tensor], None] | None = None,
               show_progress: bool = False, desc: str = "SDE") -> torch.Tensor:
    """Integrate dy/dgamma = (ê - y)/gamma over `grid` with stochastic Heun steps; returns the final y.

    `denoise(y, gamma)` returns (ê, logits) for the response positions. `on_step(s, gamma_next, logits)` sees the
    corrector's logits after each step. `check_first(logits)` sees the run's first forward pass (at the initial
    state: no setting has acted yet, so broken logits there mean broken weights) and `check_state(y)` each step's
    new state before `on_step` (a state the settings drove out of float32 is named as such).
    """
    steps = len(grid) - 1
    for s in progress_bar(range(steps), total=steps, desc=desc, enabled=show_progress):
        g0, g1 = float(grid[s]), float(grid[s + 1])
        delta = g1 - g0
        dW = rng.randn(tuple(y.shape), device=y.device) * abs(delta) ** 0.5
        e0, logits0 = denoise(y, g0)
        if s == 0 and check_first is not None:
            check_first(logits0)
        v0 = (e0 - y) / g0
        y_pred = y + delta * v0
        if predictor_noise:
            y_pred = y_pred + (eta / g0) * dW
        e1, logits = denoise(y_pred, g1)
        v1 = (e1 - y_pred) / g1
        y = y + 0.5 * delta * (v0 + v1) + 0.5 * (eta / g0 + eta / g1) * dW
        if check_state is not None:
            check_state(y)
        if on_step is not None:
            on_step(s, g1, logits)
    return y


def _prepare(model: DSLModel, prompts: PromptBatch, config: SDEConfig,
             generator: torch.Generator | Sequence[torch.Generator] | None
             ) -> tuple[PromptBatch, RowRNG, torch.Tensor, Denoiser]:
    """Shared set-up of the SDE samplers: device, context check, RNG, schedule, and the denoiser (noise table,
    beta_inf, top-M, attention mask, forward counter) around the clean prompt context."""
    backbone = model.backbone
    prompts = prompts.to(backbone.input_embeddings().weight.device)
    check_prompt_fits(backbone.max_length, prompts, config.gen_length)
    grid = snr_schedule(config.schedule, config.steps, config.gamma_min, config.gamma_max)
    beta = inference_beta(model, config)
    # the converter's logits beta * gamma * (ê . k), |ê . k| <= 1, must be finite in float32 (a NaN beta is damaged
    # weights: the first-forward guard's case)
    if beta * config.gamma_max > FP32_MAX:
        which = "beta_absolute" if config.beta_absolute is not None else "beta_scale"
        raise ConfigError(f"beta_inf={beta:g} ({which}; trained beta {model.trained_beta:g}) times "
                          f"gamma_max={config.gamma_max:g} exceeds float32's largest value {FP32_MAX:.4g}: the "
                          f"converter's logits would overflow; lower {which} or gamma_max")
    denoiser = Denoiser.for_model(model, model.context_embed(prompts.ids), beta=beta,
                                  top_m=config.top_m, attention_mask=prompts.full_attention_mask(config.gen_length),
                                  tolerance=config.converter_tolerance, compile=config.compile,
                                  kv_cache=config.kv_cache, cache_refresh=config.cache_refresh)
    return prompts, RowRNG(generator, prompts.batch_size), grid, denoiser


def decode_argmax(logits: torch.Tensor, mask_id: int) -> torch.Tensor:
    """Argmax over the vocabulary with [MASK] excluded (a decoded response never contains the mask token)."""
    logits = logits.clone()
    logits[..., mask_id] = float("-inf")
    return logits.argmax(-1)


def _settings(model: DSLModel, config: SDEConfig) -> dict[str, object]:
    """The settings a non-finite SDE state is blamed on (named in NonFiniteStateError)."""
    return {"gamma_min": config.gamma_min, "gamma_max": config.gamma_max, "eta": config.resolved_eta(),
            "nfe": config.nfe, "schedule": config.schedule, "beta_inf": inference_beta(model, config)}


def _checks(model: DSLModel, config: SDEConfig) -> dict[str, Callable[[torch.Tensor], None]]:
    """heun_solve's checks: broken first-pass logits blame the weights, a non-finite state names the settings."""
    settings = _settings(model, config)

    def first(logits: torch.Tensor) -> None:
        if has_broken_logits(logits):
            raise NonFiniteLogitsError(WEIGHTS_MESSAGE)

    return {"check_first": first, "check_state": lambda y: check_finite_state(y, "SDE state", settings)}


def _decode_final(denoise: Denoiser, y: torch.Tensor, gamma: float, mask_id: int, config: SDEConfig,
                  model: DSLModel) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids, logits): argmax decode of the solved state and the logits it came from; a NaN/inf state or NaN logits
    raise NonFiniteStateError naming the settings (never token 0 decoded from NaN logits)."""
    settings = _settings(model, config)
    check_finite_state(y, "SDE state", settings)
    logits = denoise.logits(y, gamma)
    if bool(torch.isnan(logits).any()):
        check_finite_state(torch.tensor(float("nan")), "converter/backbone logits at the final SNR", settings)
    return decode_argmax(logits, mask_id), logits


def _unit_init(rng: RowRNG, shape: tuple[int, ...], device: torch.device) -> torch.Tensor:
    return F.normalize(rng.randn(shape, device=device), dim=-1)


@torch.no_grad()
@denormals_flushed_during
def sample_sde(model: DSLModel, prompts: PromptBatch, config: SDEConfig | None = None, *,
               generator: torch.Generator | Sequence[torch.Generator] | None = None,
               callback: StepCallback | None = None, progress: bool = False,
               return_trajectory: bool = False) -> SampleOutput:
    """DSL-LLaDA-SDE: continuous generation of `gen_length` tokens after each prompt (Block SDE when
    `config.block_length > 0`)."""
    config = config or SDEConfig()
    if config.block_length:
        return sample_block_sde(model, prompts, config, generator=generator, callback=callback, progress=progress,
                                return_trajectory=return_trajectory)
    callback = with_progress(callback, progress, "SDE")
    prompts, rng, grid, denoise = _prepare(model, prompts, config, generator)
    L, B = config.gen_length, prompts.batch_size
    mask_id = model.special.mask
    trajectory: list[torch.Tensor] | None = [] if return_trajectory else None

    none = torch.zeros((B, L), dtype=torch.bool, device=prompts.ids.device) if callback is not None else None

    def on_step(s: int, gamma: float, logits: torch.Tensor) -> None:
        if trajectory is None and callback is None:
            return
        tokens: torch.Tensor | None = None
        if trajectory is not None:
            tokens = decode_argmax(logits, mask_id)
            trajectory.append(tokens.cpu())
        if callback is not None:
            lazy = tokens if tokens is not None else (lambda: decode_argmax(logits, mask_id))
            callback(StepInfo(step=s, total_steps=config.steps, tokens=lazy, gamma=gamma, committed=none,
                              logits=logits, window=(0, L)))

    y0 = _unit_init(rng, (B, L, model.noise_dim), denoise.context.device)
    checks = _checks(model, config)
    y = heun_solve(denoise, y0, grid, eta=config.resolved_eta(), predictor_noise=config.predictor_noise, rng=rng,
                   on_step=on_step, check_first=checks["check_first"], check_state=checks["check_state"])
    ids, final_logits = _decode_final(denoise, y, float(grid[-1]), mask_id, config, model)
    if callback is not None:
        everything = torch.ones((B, L), dtype=torch.bool, device=ids.device)
        callback(StepInfo(step=config.steps - 1, total_steps=config.steps, tokens=ids, gamma=float(grid[-1]),
                          committed=everything, newly_committed=everything, logits=final_logits, window=(0, L),
                          decode=True))
    return _finish(model, ids, config, nfe=2 * config.steps, forwards=denoise.forward_passes, trajectory=trajectory)


@torch.no_grad()
@denormals_flushed_during
def sample_block_sde(model: DSLModel, prompts: PromptBatch, config: SDEConfig, *,
                     generator: torch.Generator | Sequence[torch.Generator] | None = None,
                     callback: StepCallback | None = None, progress: bool = False,
                     return_trajectory: bool = False) -> SampleOutput:
    """Block SDE: blocks of B tokens left to right; committed blocks are clean context, future blocks are
    [MASK] embeddings, the current block runs the Heun loop then is decoded by argmax and committed.
    Forward passes = (L / B) (2S + 1)."""
    callback = with_progress(callback, progress, "block SDE")
    prompts, rng, grid, first = _prepare(model, prompts, config, generator)
    L, Bsz, blk = config.gen_length, prompts.batch_size, config.block_length
    mask_id = model.special.mask
    response = torch.full((Bsz, L), mask_id, dtype=torch.long, device=prompts.ids.device)
    n_blocks = L // blk
    trajectory: list[torch.Tensor] | None = [] if return_trajectory else None
    checks = _checks(model, config)
    for k in range(n_blocks):
        lo, hi = k * blk, (k + 1) * blk
        # committed blocks are clean context, future blocks the converter's [MASK] slot (paper §3, Block SDE)
        denoise = first.with_context(model.context_embed(torch.cat([prompts.ids, response[:, :lo]], dim=1)),
                                     future=model.mask_embed(response[:, hi:]))

        def on_step(s: int, gamma: float, logits: torch.Tensor, k: int = k, lo: int = lo, hi: int = hi) -> None:
            if trajectory is None and callback is None:
                return

            def current() -> torch.Tensor:
                tokens = response.clone()
                tokens[:, lo:hi] = decode_argmax(logits, mask_id)
                return tokens

            tokens: torch.Tensor | None = None
            if trajectory is not None:
                tokens = current()
                trajectory.append(tokens.cpu())
            if callback is not None:
                callback(StepInfo(step=k * config.steps + s, total_steps=n_blocks * config.steps,
                                  tokens=tokens if tokens is not None else current,
                                  gamma=gamma, extra={"block": k}, committed=_prefix_mask(Bsz, L, lo, response.device),
                                  logits=logits, window=(lo, hi)))

        y0 = _unit_init(rng, (Bsz, blk, model.noise_dim), denoise.context.device)
        y = heun_solve(denoise, y0, grid, eta=config.resolved_eta(), predictor_noise=config.predictor_noise, rng=rng,
                       on_step=on_step, check_state=checks["check_state"],
                       check_first=checks["check_first"] if k == 0 else None)
        response[:, lo:hi], final_logits = _decode_final(denoise, y, float(grid[-1]), mask_id, config, model)
        if callback is not None:
            newly = _prefix_mask(Bsz, L, hi, response.device) & ~_prefix_mask(Bsz, L, lo, response.device)
            callback(StepInfo(step=(k + 1) * config.steps - 1, total_steps=n_blocks * config.steps,
                              tokens=response.clone(), gamma=float(grid[-1]), extra={"block": k},
                              committed=_prefix_mask(Bsz, L, hi, response.device), newly_committed=newly,
                              logits=final_logits, window=(lo, hi), decode=True))
    nfe = n_blocks * 2 * config.steps
    return _finish(model, response, config, nfe=nfe, forwards=first.forward_passes, trajectory=trajectory)


def _prefix_mask(rows: int, length: int, upto: int, device: torch.device) -> torch.Tensor:
    """(rows, length) bool, True on the first `upto` positions (the Block SDE's committed blocks)."""
    return (torch.arange(length, device=device) < upto).expand(rows, length)


def _finish(model: DSLModel, ids: torch.Tensor, config: SDEConfig, *, nfe: int, forwards: int,
            trajectory: list[torch.Tensor] | None) -> SampleOutput:
    if config.truncate_at_eos:
        lengths = stop_lengths(ids, model.special.stop_ids())
    else:
        lengths = torch.full((ids.shape[0],), ids.shape[1], dtype=torch.long, device=ids.device)
    return SampleOutput(ids=ids.cpu(), lengths=lengths.cpu(), nfe=nfe, forward_passes=forwards,
                        trajectory=trajectory, config={"sampler": config.sampler_name, **config.to_dict()})
