"""Server-side request limits and request-field checks that run before anything is queued.

Every user-controlled size has an upper bound: solver/denoising steps (`max_nfe` for the SDE samplers, `max_steps`
for remasking), response tokens, prompt tokens, body bytes, prompts per request and a per-request deadline. The
defaults derive from the served model (its context length and size) so that one request's worst case stays in the
order of a minute on a small CPU; `--max-*` flags override them. Each check raises a `RequestError` naming the
field (400; 413 for the body size).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from ..config import RemaskConfig, SDEConfig
from ..sampling.registry import get_spec
from .schemas import RequestError

CPU_FLOPS = 2e10
"""Sustained matmul throughput assumed for the default limits (a few-core CPU; 20 GFLOP/s)."""
WORST_CASE_S = 60.0
"""One request's worst-case compute budget the default step limits aim at."""
SERVER_ONLY_FIELDS = {
    "compile": "torch.compile is a server start-up choice, not a request field",
    "threads": "the thread count is set when the server starts (--threads)",
    "dtype": "the dtype is set when the server starts (--dtype)",
    "device": "the device is set when the server starts (--device)",
}
UNSUPPORTED_OPENAI_FIELDS = (
    "best_of", "suffix", "logit_bias", "frequency_penalty", "presence_penalty", "tools", "tool_choice", "functions",
    "function_call", "parallel_tool_calls", "response_format", "audio", "modalities", "prediction",
    "reasoning_effort", "service_tier", "store", "metadata", "web_search_options",
)
"""Fields of OpenAI's completions / chat schemas these samplers do not implement: a request naming one gets 400
(accepting and ignoring them would return something else than what the client asked for)."""
NEUTRAL_VALUES: dict[str, tuple[Any, ...]] = {"frequency_penalty": (0, 0.0), "presence_penalty": (0, 0.0),
                                              "best_of": (1,), "logit_bias": ({},), "parallel_tool_calls": (True,),
                                              "store": (False,), "metadata": ({},)}
"""Values of unsupported fields that ask for exactly what the server does anyway (accepted)."""


@dataclass(frozen=True)
class Limits:
    """Upper bounds on what one request may ask for (see the module docstring)."""

    max_nfe: int
    """SDE samplers: most model evaluations (nfe = 2 x Heun steps) per request."""
    max_steps: int
    """Discrete samplers: most denoising steps per request."""
    max_tokens: int
    """Most response tokens (max_tokens / gen_length)."""
    max_prompt_tokens: int
    """Most prompt tokens (each prompt, after the chat template)."""
    max_body_bytes: int
    """Largest request body (HTTP 413 above it)."""
    request_timeout_s: float
    """A request not finished this long after it arrived is cancelled (HTTP 504 / a final stream error event)."""
    max_prompts: int = 64
    """Most prompts (a completions prompt list) x n per request."""

    @classmethod
    def for_model(cls, context: int | None, n_params: int | None = None, **overrides: Any) -> "Limits":
        """Defaults for a model with `context` tokens and `n_params` parameters; `overrides` (None = keep) win."""
        ctx = int(context) if context else 4096
        # one forward over the whole context costs ~2 x params x context FLOPs; the step limits keep the worst case
        # (every step over a full context) near WORST_CASE_S at CPU_FLOPS, but never below the paper's defaults
        # (nfe 64 / 64 steps: a default request always passes) nor above 1024
        per_forward = 2.0 * max(n_params or 0, 1) * ctx / CPU_FLOPS
        budget = int(WORST_CASE_S / per_forward) if per_forward > 0 else 1024
        default_nfe, default_steps = SDEConfig().nfe, RemaskConfig().steps
        values: dict[str, Any] = dict(max_nfe=min(1024, max(default_nfe, 2 * (budget // 2))),
                      max_steps=min(1024, max(default_steps, budget)),
                      max_tokens=ctx, max_prompt_tokens=max(1, ctx - 1),
                      max_body_bytes=max(1 << 20, 64 * ctx),  # 64 bytes per context token, at least 1 MiB
                      request_timeout_s=600.0)
        values.update({k: v for k, v in overrides.items() if v is not None})
        limits = cls(**values)
        for k, v in asdict(limits).items():
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0):
                raise ValueError(f"limit {k}={v!r} must be a positive number")
        return limits

    def describe(self) -> str:
        return ", ".join(f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}" for k, v in asdict(self).items())


def _too_large(field: str, value: int, bound: int, flag: str) -> RequestError:
    return RequestError(f"{field}={value} exceeds this server's limit of {bound} (set by {flag} when the server "
                        f"starts)", field, code="limit_exceeded")


def check_request_fields(extra: dict[str, Any]) -> None:
    """Server-only switches and unsupported OpenAI fields in a request (its fields beyond the declared ones)."""
    for key, value in extra.items():
        if key in SERVER_ONLY_FIELDS:
            raise RequestError(f"{key!r} is not a request field: {SERVER_ONLY_FIELDS[key]}", key,
                               code="unsupported_field")
        if key in UNSUPPORTED_OPENAI_FIELDS and value is not None and value not in NEUTRAL_VALUES.get(key, ()):
            raise RequestError(f"{key!r} is not supported by this server (diffusion samplers); leave it out",
                               key, code="unsupported_field")
        bad = non_finite_path(value)
        if bad is not None:
            raise RequestError(f"{key}{bad} is not a finite number", key)


def non_finite_path(value: Any, path: str = "") -> str | None:
    """Where a NaN/Infinity sits inside a JSON value ('' = the value itself), or None."""
    if isinstance(value, float) and not math.isfinite(value):
        return path
    if isinstance(value, dict):
        for k, v in value.items():
            got = non_finite_path(v, f"{path}.{k}")
            if got is not None:
                return got
    if isinstance(value, list):
        for i, v in enumerate(value):
            got = non_finite_path(v, f"{path}[{i}]")
            if got is not None:
                return got
    return None


def check_sampling_limits(name: str, config: SDEConfig | RemaskConfig, limits: Limits, *, param_steps: str) -> None:
    """The built sampler config against the step and length limits (before the request is queued)."""
    if isinstance(config, SDEConfig):
        nfe = config.nfe * (config.gen_length // config.block_length if config.block_length else 1)
        if nfe > limits.max_nfe:
            raise _too_large("nfe", nfe, limits.max_nfe, "--max-nfe")
    elif config.steps > limits.max_steps:
        raise _too_large(param_steps, config.steps, limits.max_steps, "--max-steps")
    if config.gen_length > limits.max_tokens:
        raise _too_large("max_tokens", config.gen_length, limits.max_tokens, "--max-tokens")


def check_raw_sizes(req: Any, limits: Limits) -> None:
    """Sizes given in the request, checked before any config is built (so `nfe: 10**9` never reaches a config)."""
    for field, flag, bound in (("nfe", "--max-nfe", limits.max_nfe), ("steps", "--max-steps", limits.max_steps),
                               ("max_tokens", "--max-tokens", limits.max_tokens),
                               ("max_completion_tokens", "--max-tokens", limits.max_tokens),
                               ("gen_length", "--max-tokens", limits.max_tokens)):
        value = getattr(req, field, None)
        if isinstance(value, int) and value > bound:
            raise _too_large(field, value, bound, flag)


def check_prompts(prompts: list[list[int]], n: int, limits: Limits, param: str) -> None:
    """Prompt count and lengths (after tokenization, before queueing)."""
    if len(prompts) * n > limits.max_prompts:
        raise RequestError(f"{len(prompts)} prompt(s) x n={n} = {len(prompts) * n} responses exceed this server's "
                           f"limit of {limits.max_prompts} per request", param, code="limit_exceeded")
    for ids in prompts:
        if len(ids) > limits.max_prompt_tokens:
            raise RequestError(f"the prompt is {len(ids)} tokens, more than this server's limit of "
                               f"{limits.max_prompt_tokens} (--max-prompt-tokens)", param, code="limit_exceeded")


def default_max_tokens(name: str, prompts: list[list[int]], context: int | None, block_length: int | None) -> int | None:
    """The response length for a request that gives none: the sampler's default, or what fits the context after
    the longest prompt when the default would not (rounded down to whole blocks). None = keep the default."""
    default = get_spec(name).config_class().gen_length
    if context is None or not prompts:
        return None
    fit = context - max(len(p) for p in prompts)
    if fit >= default:
        return None
    if block_length and fit >= block_length:
        fit -= fit % block_length
    return max(fit, 1)
