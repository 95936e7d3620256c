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
from ..core.model import DSLModel
from ..core.numerics import denormals_flushed_during
from .progress import progress as progress_bar
from .common import (LiveRows, PromptBatch, RowRNG, SampleOutput, StepCallback, StepInfo, check_prompt_fits,
                     stop_lengths)
from .denoiser import Denoiser
from .guards import WEIGHTS_MESSAGE, NonFiniteLogitsError, check_finite_state, has_broken_logits
from .observers import with_progress

Denoise = Callable[[torch.Tensor, float], tuple[torch.Tensor, torch.Tensor]]
"""What `heun_solve` integrates against: (y, gamma) -> (ê, logits); a `Denoiser` or a test double."""


def inference_beta(model: DSLModel, config: SDEConfig) -> float:
    """beta_inf: absolute when configured, else beta_scale x the trained beta (paper: 2 x)."""
    return config.beta_absolute if config.beta_absolute is not None else config.beta_scale * model.trained_beta


def checked_beta(model: DSLModel, config: SDEConfig) -> float:
    """beta_inf (`inference_beta`), after checking that the converter's logits beta * gamma * (ê . k), |ê . k| <= 1,
    stay finite in float32 up to gamma_max (a NaN beta is damaged weights: the first-forward guard's case)."""
    beta = inference_beta(model, config)
    if beta * config.gamma_max > FP32_MAX:
        which = "beta_absolute" if config.beta_absolute is not None else "beta_scale"
        raise ConfigError(f"beta_inf={beta:g} ({which}; trained beta {model.trained_beta:g}) times "
                          f"gamma_max={config.gamma_max:g} exceeds float32's largest value {FP32_MAX:.4g}: the "
                          f"converter's logits would overflow; lower {which} or gamma_max")
    return beta


def brownian_increment(rng: RowRNG, y: torch.Tensor, g0: float, g1: float) -> torch.Tensor:
    """dW = sqrt(|gamma_1 - gamma_0|) xi, xi ~ N(0, I) of y's shape from the rows' generators: the one random draw
    of a Heun step from g0 to g1, made before its predictor."""
    return rng.randn(tuple(y.shape), device=y.device) * float(abs(g1 - g0) ** 0.5)


def heun_predict(y: torch.Tensor, e0: torch.Tensor, g0: float, g1: float, dW: torch.Tensor, *, eta: float,
                 predictor_noise: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """The predictor of a Heun step from g0 to g1: (y_pred, v0) with v0 = (ê(y, g0) - y) / g0 and
    y_pred = y + (g1 - g0) v0, plus (eta / g0) dW with `predictor_noise`. `e0` is ê(y, g0)."""
    v0 = (e0 - y) / g0
    y_pred = y + (g1 - g0) * v0
    if predictor_noise:
        y_pred = y_pred + (eta / g0) * dW
    return y_pred, v0


def heun_correct(y: torch.Tensor, y_pred: torch.Tensor, v0: torch.Tensor, e1: torch.Tensor, g0: float, g1: float,
                 dW: torch.Tensor, *, eta: float) -> torch.Tensor:
    """The corrector of a Heun step from g0 to g1: the new state y + (g1 - g0)/2 (v0 + v1) + 1/2 (eta/g0 + eta/g1)
    dW, with v1 = (ê(y_pred, g1) - y_pred) / g1. `e1` is ê(y_pred, g1); `v0` and `dW` are the predictor's."""
    v1 = (e1 - y_pred) / g1
    return y + 0.5 * (g1 - g0) * (v0 + v1) + 0.5 * (eta / g0 + eta / g1) * dW


def heun_solve(denoise: Denoise, y: torch.Tensor, grid: Sequence[float] | torch.Tensor, *, eta: float, predictor_noise: bool,
               rng: RowRNG, on_step: Callable[[int, float, torch.Tensor], torch.Tensor | None] | None = None,
               check_first: Callable[[torch.Tensor], None] | None = None,
               check_state: Callable[[torch.Tensor], None] | None = None,
               show_progress: bool = False, desc: str = "SDE") -> torch.Tensor:
    """Integrate dy/dgamma = (ê - y)/gamma over `grid` with stochastic Heun steps; returns the final y.

    `denoise(y, gamma)` returns (ê, logits) for the response positions. `on_step(s, gamma_next, logits)` sees the
    corrector's logits after each step; when it returns an index tensor, only those rows of y go on (rows left the
    batch: `on_step` has selected the same rows of `denoise` and `rng`), and an empty one ends the solve.
    `check_first(logits)` sees the run's first forward pass (at the initial state: no setting has acted yet, so
    broken logits there mean broken weights) and `check_state(y)` each step's new state before `on_step` (a state
    the settings drove out of float32 is named as such).
    """
    steps = len(grid) - 1
    for s in progress_bar(range(steps), total=steps, desc=desc, enabled=show_progress):
        g0, g1 = float(grid[s]), float(grid[s + 1])
        dW = brownian_increment(rng, y, g0, g1)
        e0, logits0 = denoise(y, g0)
        if s == 0 and check_first is not None:
            check_first(logits0)
        y_pred, v0 = heun_predict(y, e0, g0, g1, dW, eta=eta, predictor_noise=predictor_noise)
        e1, logits = denoise(y_pred, g1)
        y = heun_correct(y, y_pred, v0, e1, g0, g1, dW, eta=eta)
        if check_state is not None:
            check_state(y)
        if on_step is not None:
            keep = on_step(s, g1, logits)
            if keep is not None:
                y = y[keep]
                if y.shape[0] == 0:
                    break
    return y


def _prepare(model: DSLModel, prompts: PromptBatch, config: SDEConfig,
             generator: torch.Generator | Sequence[torch.Generator] | None
             ) -> tuple[PromptBatch, RowRNG, tuple[float, ...], Denoiser]:
    """Shared set-up of the SDE samplers: device, context check, RNG, the config's SNR grid (`SDEConfig.snr_grid`),
    and the denoiser (noise table, beta_inf, top-M, attention mask, forward counter) around the clean prompt
    context."""
    backbone = model.backbone
    prompts = prompts.to(backbone.input_embeddings().weight.device)
    check_prompt_fits(model, prompts, config.gen_length)
    grid = config.snr_grid
    beta = checked_beta(model, config)
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


class _LiveDenoiser:
    """The Denoiser of a run whose rows may leave the batch: calls (and attribute reads) go to `current`, which
    `drop` replaces by its `select_rows` copy together with the generators' rows."""

    def __init__(self, denoiser: Denoiser, rng: RowRNG):
        self.current, self.rng = denoiser, rng

    def __call__(self, y: torch.Tensor, gamma: float) -> tuple[torch.Tensor, torch.Tensor]:
        return self.current(y, gamma)

    def __getattr__(self, name: str) -> object:
        return getattr(self.current, name)

    def drop(self, live: LiveRows, info: StepInfo) -> torch.Tensor | None:
        """After the callbacks saw `info`: select the remaining rows (None when no row was dropped)."""
        keep = live.after(info, self.rng, self.current.context.device)
        if keep is not None:
            self.current = self.current.select_rows(keep)
        return keep


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
    prompts, rng, grid, first = _prepare(model, prompts, config, generator)
    L, B = config.gen_length, prompts.batch_size
    mask_id = model.special.mask
    trajectory: list[torch.Tensor] | None = [] if return_trajectory else None
    live = LiveRows(B)
    denoise = _LiveDenoiser(first, rng)

    none = torch.zeros((B, L), dtype=torch.bool, device=prompts.ids.device)

    def on_step(s: int, gamma: float, logits: torch.Tensor) -> torch.Tensor | None:
        if trajectory is None and callback is None:
            return None
        tokens: torch.Tensor | None = None
        if trajectory is not None:
            tokens = decode_argmax(logits, mask_id)
            trajectory.append(live.expand(tokens.cpu(), mask_id))
        if callback is None:
            return None
        lazy = tokens if tokens is not None else (lambda: decode_argmax(logits, mask_id))
        info = StepInfo(step=s, total_steps=config.steps, tokens=lazy, gamma=gamma, committed=none[: logits.shape[0]],
                        logits=logits, window=(0, L), rows=live.rows)
        callback(info)
        return denoise.drop(live, info)

    y0 = _unit_init(rng, (B, L, model.noise_dim), first.context.device)
    checks = _checks(model, config)
    y = heun_solve(denoise, y0, grid, eta=config.resolved_eta(), predictor_noise=config.predictor_noise, rng=rng,
                   on_step=on_step, check_first=checks["check_first"], check_state=checks["check_state"])
    if live.empty:  # every row was dropped: no decode
        ids = torch.full((0, L), mask_id, dtype=torch.long, device=y.device)
    else:
        ids, final_logits = _decode_final(denoise.current, y, float(grid[-1]), mask_id, config, model)
    if callback is not None and not live.empty:
        everything = torch.ones(tuple(ids.shape), dtype=torch.bool, device=ids.device)
        info = StepInfo(step=config.steps - 1, total_steps=config.steps, tokens=ids, gamma=float(grid[-1]),
                        committed=everything, newly_committed=everything, logits=final_logits, window=(0, L),
                        decode=True, rows=live.rows)
        callback(info)
        keep = denoise.drop(live, info)
        if keep is not None:
            ids = ids[keep]
    return _finish(model, ids, config, nfe=2 * config.steps, forwards=first.forward_passes, trajectory=trajectory,
                   live=live)


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
    L, blk = config.gen_length, config.block_length
    mask_id = model.special.mask
    prompt_ids = prompts.ids
    response = torch.full((prompts.batch_size, L), mask_id, dtype=torch.long, device=prompt_ids.device)
    n_blocks = L // blk
    trajectory: list[torch.Tensor] | None = [] if return_trajectory else None
    checks = _checks(model, config)
    live = LiveRows(prompts.batch_size)

    def drop(denoise: _LiveDenoiser, info: StepInfo) -> torch.Tensor | None:
        nonlocal response, prompt_ids
        keep = denoise.drop(live, info)
        if keep is not None:
            response, prompt_ids = response[keep], prompt_ids[keep]
        return keep

    for k in range(n_blocks):
        if live.empty:
            break
        lo, hi = k * blk, (k + 1) * blk
        # committed blocks are clean context, future blocks the converter's [MASK] slot (paper §3, Block SDE)
        denoise = _LiveDenoiser(first.with_context(model.context_embed(torch.cat([prompt_ids, response[:, :lo]], dim=1)),
                                                   future=model.mask_embed(response[:, hi:])), rng)

        def on_step(s: int, gamma: float, logits: torch.Tensor, k: int = k, lo: int = lo, hi: int = hi,
                    denoise: _LiveDenoiser = denoise) -> torch.Tensor | None:
            if trajectory is None and callback is None:
                return None

            def current() -> torch.Tensor:
                tokens = response.clone()
                tokens[:, lo:hi] = decode_argmax(logits, mask_id)
                return tokens

            tokens: torch.Tensor | None = None
            if trajectory is not None:
                tokens = current()
                trajectory.append(live.expand(tokens.cpu(), mask_id))
            if callback is None:
                return None
            info = StepInfo(step=k * config.steps + s, total_steps=n_blocks * config.steps,
                            tokens=tokens if tokens is not None else current, gamma=gamma, extra={"block": k},
                            committed=_prefix_mask(len(live.rows), L, lo, response.device), logits=logits,
                            window=(lo, hi), rows=live.rows)
            callback(info)
            return drop(denoise, info)

        y0 = _unit_init(rng, (len(live.rows), blk, model.noise_dim), prompt_ids.device)
        y = heun_solve(denoise, y0, grid, eta=config.resolved_eta(), predictor_noise=config.predictor_noise, rng=rng,
                       on_step=on_step, check_state=checks["check_state"],
                       check_first=checks["check_first"] if k == 0 else None)
        if live.empty:
            break
        response[:, lo:hi], final_logits = _decode_final(denoise.current, y, float(grid[-1]), mask_id, config, model)
        if callback is not None:
            n = len(live.rows)
            newly = _prefix_mask(n, L, hi, response.device) & ~_prefix_mask(n, L, lo, response.device)
            info = StepInfo(step=(k + 1) * config.steps - 1, total_steps=n_blocks * config.steps,
                            tokens=response.clone(), gamma=float(grid[-1]), extra={"block": k},
                            committed=_prefix_mask(n, L, hi, response.device), newly_committed=newly,
                            logits=final_logits, window=(lo, hi), decode=True, rows=live.rows)
            callback(info)
            drop(denoise, info)
        first = denoise.current  # the remaining rows' attention mask (context and future are rebuilt per block)
    nfe = n_blocks * 2 * config.steps
    return _finish(model, response, config, nfe=nfe, forwards=first.forward_passes, trajectory=trajectory,
                   live=live)


def _prefix_mask(rows: int, length: int, upto: int, device: torch.device) -> torch.Tensor:
    """(rows, length) bool, True on the first `upto` positions (the Block SDE's committed blocks)."""
    return (torch.arange(length, device=device) < upto).expand(rows, length)


def _finish(model: DSLModel, ids: torch.Tensor, config: SDEConfig, *, nfe: int, forwards: int,
            trajectory: list[torch.Tensor] | None, live: LiveRows) -> SampleOutput:
    """The output over the original rows (`live.dropped` ones: [MASK] ids, length 0)."""
    if config.truncate_at_eos:
        lengths = stop_lengths(ids, model.special.stop_ids())
    else:
        lengths = torch.full((ids.shape[0],), ids.shape[1], dtype=torch.long, device=ids.device)
    return SampleOutput(ids=live.expand(ids.cpu(), model.special.mask), lengths=live.expand(lengths.cpu(), 0), nfe=nfe,
                        forward_passes=forwards, trajectory=trajectory,
                        config={"sampler": config.sampler_name, **config.to_dict()}, dropped=live.dropped)
