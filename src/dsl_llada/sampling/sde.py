"""Embedding-space SDE sampling with the stochastic Heun solver (paper Algorithm 2) and Block SDE.

State: normalised y = z / gamma per response position (unit-norm random init). Each Heun step from gamma_s to
gamma_{s+1} (Delta = gamma_{s+1} - gamma_s) evaluates the denoiser twice:
    v_s  = (ê(y, gamma_s) - y) / gamma_s,           y_e = y + Delta v_s          [+ g_s dW: authors' predictor noise]
    v_e  = (ê(y_e, gamma_{s+1}) - y_e) / gamma_{s+1}
    y   <- y + Delta/2 (v_s + v_e) + 1/2 (eta/gamma_s + eta/gamma_{s+1}) dW,     dW = sqrt(|Delta|) xi
ê is the top-M renormalised posterior mean over the noise embedding. After S = NFE/2 steps one more forward at
the final SNR decodes by argmax: forward passes executed = 2S + 1 (reported separately from NFE = 2S).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F

from ..backbones.base import compiled
from ..config import SDEConfig
from ..model import DSLModel
from ..numerics import denormals_flushed_during
from ..snr import snr_schedule
from ..utils import progress as progress_bar
from .common import (ForwardCounter, PromptBatch, RowRNG, SampleOutput, StepCallback, StepInfo, check_prompt_fits,
                     stop_lengths)

Denoise = Callable[[torch.Tensor, float], tuple[torch.Tensor, torch.Tensor]]


def inference_beta(model: DSLModel, config: SDEConfig) -> float:
    """beta_inf: absolute when configured, else beta_scale x the trained beta (paper: 2 x)."""
    return config.beta_absolute if config.beta_absolute is not None else config.beta_scale * model.trained_beta


def heun_solve(denoise: Denoise, y: torch.Tensor, grid: torch.Tensor, *, eta: float, predictor_noise: bool,
               rng: RowRNG, on_step: Callable[[int, float, torch.Tensor], None] | None = None,
               show_progress: bool = False, desc: str = "SDE") -> torch.Tensor:
    """Integrate dy/dgamma = (ê - y)/gamma over `grid` with stochastic Heun steps; returns the final y.

    `denoise(y, gamma)` returns (ê, logits) for the response positions. `on_step(s, gamma_next, logits)` sees the
    corrector's logits after each step.
    """
    steps = len(grid) - 1
    for s in progress_bar(range(steps), total=steps, desc=desc, enabled=show_progress):
        g0, g1 = float(grid[s]), float(grid[s + 1])
        delta = g1 - g0
        dW = rng.randn(tuple(y.shape), device=y.device) * abs(delta) ** 0.5
        e0, _ = denoise(y, g0)
        v0 = (e0 - y) / g0
        y_pred = y + delta * v0
        if predictor_noise:
            y_pred = y_pred + (eta / g0) * dW
        e1, logits = denoise(y_pred, g1)
        v1 = (e1 - y_pred) / g1
        y = y + 0.5 * delta * (v0 + v1) + 0.5 * (eta / g0 + eta / g1) * dW
        if on_step is not None:
            on_step(s, g1, logits)
    return y


def _prepare(model: DSLModel, prompts: PromptBatch, config: SDEConfig, generator):
    """Shared set-up of the SDE samplers: device, context check, RNG, noise table, beta_inf, eta, schedule."""
    backbone = model.backbone
    prompts = prompts.to(backbone.input_embeddings().weight.device)
    check_prompt_fits(backbone, prompts, config.gen_length)
    grid = snr_schedule(config.schedule, config.steps, config.gamma_min, config.gamma_max)
    return (prompts, RowRNG(generator, prompts.batch_size), model.unit_noise(), inference_beta(model, config),
            config.resolved_eta(), grid, prompts.full_attention_mask(config.gen_length),
            ForwardCounter(compiled(backbone) if config.compile else backbone))


def decode_argmax(logits: torch.Tensor, mask_id: int) -> torch.Tensor:
    """Argmax over the vocabulary with [MASK] excluded (a decoded response never contains the mask token)."""
    logits = logits.clone()
    logits[..., mask_id] = float("-inf")
    return logits.argmax(-1)


def _unit_init(rng: RowRNG, shape: tuple[int, ...], device) -> torch.Tensor:
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
    prompts, rng, E, beta, eta, grid, attn, forward = _prepare(model, prompts, config, generator)
    L, B, P = config.gen_length, prompts.batch_size, prompts.length
    h_ctx = model.context_embed(prompts.ids)
    dtype = h_ctx.dtype

    def logits_at(y: torch.Tensor, gamma: float) -> torch.Tensor:
        h = model.converter(gamma * y, E, beta, tolerance=config.converter_tolerance).to(dtype)
        return forward(torch.cat([h_ctx, h], dim=1), attn, positions=slice(P, None))

    mask_id = model.special.mask

    def denoise(y: torch.Tensor, gamma: float) -> tuple[torch.Tensor, torch.Tensor]:
        logits = logits_at(y, gamma)
        return model.posterior_mean(logits, config.top_m, E), logits

    trajectory: list[torch.Tensor] | None = [] if return_trajectory else None

    def on_step(s: int, gamma: float, logits: torch.Tensor) -> None:
        if trajectory is None and callback is None:
            return
        tokens = decode_argmax(logits, mask_id)
        if trajectory is not None:
            trajectory.append(tokens.cpu())
        if callback is not None:
            callback(StepInfo(step=s, total_steps=config.steps, tokens=tokens, gamma=gamma))

    y0 = _unit_init(rng, (B, L, model.noise_dim), h_ctx.device)
    y = heun_solve(denoise, y0, grid, eta=eta, predictor_noise=config.predictor_noise, rng=rng, on_step=on_step,
                   show_progress=progress)
    ids = decode_argmax(logits_at(y, float(grid[-1])), mask_id)
    return _finish(model, ids, config, nfe=2 * config.steps, forwards=forward.count, trajectory=trajectory)


@torch.no_grad()
@denormals_flushed_during
def sample_block_sde(model: DSLModel, prompts: PromptBatch, config: SDEConfig, *,
                     generator: torch.Generator | Sequence[torch.Generator] | None = None,
                     callback: StepCallback | None = None, progress: bool = False,
                     return_trajectory: bool = False) -> SampleOutput:
    """Block SDE: blocks of B tokens left to right; committed blocks are clean context, future blocks are
    [MASK] embeddings, the current block runs the Heun loop then is decoded by argmax and committed.
    Forward passes = (L / B) (2S + 1)."""
    prompts, rng, E, beta, eta, grid, attn, forward = _prepare(model, prompts, config, generator)
    L, Bsz, P, blk = config.gen_length, prompts.batch_size, prompts.length, config.block_length
    mask_id = model.special.mask
    response = torch.full((Bsz, L), mask_id, dtype=torch.long, device=prompts.ids.device)
    n_blocks = L // blk
    trajectory: list[torch.Tensor] | None = [] if return_trajectory else None
    for k in range(n_blocks):
        lo, hi = k * blk, (k + 1) * blk
        before = model.context_embed(torch.cat([prompts.ids, response[:, :lo]], dim=1))
        after = model.mask_embed(response[:, hi:])

        def logits_at(y: torch.Tensor, gamma: float) -> torch.Tensor:
            h = model.converter(gamma * y, E, beta, tolerance=config.converter_tolerance).to(before.dtype)
            return forward(torch.cat([before, h, after], dim=1), attn, positions=slice(P + lo, P + hi))

        def denoise(y: torch.Tensor, gamma: float) -> tuple[torch.Tensor, torch.Tensor]:
            logits = logits_at(y, gamma)
            return model.posterior_mean(logits, config.top_m, E), logits

        def on_step(s: int, gamma: float, logits: torch.Tensor, k: int = k, lo: int = lo, hi: int = hi) -> None:
            if trajectory is None and callback is None:
                return
            tokens = response.clone()
            tokens[:, lo:hi] = decode_argmax(logits, mask_id)
            if trajectory is not None:
                trajectory.append(tokens.cpu())
            if callback is not None:
                callback(StepInfo(step=k * config.steps + s, total_steps=n_blocks * config.steps, tokens=tokens,
                                  gamma=gamma, extra={"block": k}))

        y0 = _unit_init(rng, (Bsz, blk, model.noise_dim), before.device)
        y = heun_solve(denoise, y0, grid, eta=eta, predictor_noise=config.predictor_noise, rng=rng, on_step=on_step,
                       show_progress=progress, desc=f"block {k + 1}/{n_blocks}")
        response[:, lo:hi] = decode_argmax(logits_at(y, float(grid[-1])), mask_id)
    nfe = n_blocks * 2 * config.steps
    return _finish(model, response, config, nfe=nfe, forwards=forward.count, trajectory=trajectory)


def _finish(model: DSLModel, ids: torch.Tensor, config: SDEConfig, *, nfe: int, forwards: int,
            trajectory: list[torch.Tensor] | None) -> SampleOutput:
    if config.truncate_at_eos:
        lengths = stop_lengths(ids, model.special.stop_ids())
    else:
        lengths = torch.full((ids.shape[0],), ids.shape[1], dtype=torch.long, device=ids.device)
    return SampleOutput(ids=ids.cpu(), lengths=lengths.cpu(), nfe=nfe, forward_passes=forwards,
                        trajectory=trajectory, config={"sampler": "sde", **config.to_dict()})
