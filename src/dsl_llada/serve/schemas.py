"""OpenAI-style request bodies, and their translation into a sampler name + typed sampler config.

The sampler settings are extra request fields (ignored by, and invisible to, standard OpenAI clients):
`sampler`, `nfe` / `steps`, `gen_length` (defaults to `max_tokens`), `block_length`, `eta`, `seed`, and any other
field of the chosen sampler's config dataclass (`SDEConfig` for sde/block-sde, `RemaskConfig` for remask/remdm).
Every value not given keeps that dataclass's default, i.e. the paper's settings.
"""

from __future__ import annotations

import typing
import re
from typing import Annotated, Any, Literal

import pydantic
from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from ..config import RemaskConfig, SDEConfig
from ..sampling.registry import SAMPLERS, SamplerSettingError, get_spec, sampler_config
from ..core.text import not_text

# request fields handled explicitly (not passed through as config fields)
_EXPLICIT = {"nfe", "steps", "gen_length", "block_length", "eta", "temperature", "remdm"}


class RequestError(ValueError):
    """An invalid request: HTTP `status` with an OpenAI-style error body naming `param`."""

    def __init__(self, message: str, param: str | None = None, *, status: int = 400, code: str | None = None,
                 type: str = "invalid_request_error"):
        super().__init__(message)
        self.message, self.param, self.status, self.code, self.type = message, param, status, code, type

    def body(self) -> dict[str, Any]:
        return error_body(self.message, self.type, self.param, self.code)


def error_body(message: str, type: str, param: str | None = None, code: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


class SamplingFields(BaseModel):
    """Fields shared by /v1/completions and /v1/chat/completions (OpenAI's, then the sampler extension)."""

    model_config = ConfigDict(extra="allow", allow_inf_nan=False)

    model: str | None = None
    """Served model name (optional; when given it must match GET /v1/models)."""
    max_tokens: int | None = Field(None, ge=1)
    """OpenAI's response length; used as `gen_length` when that is not given."""
    n: int = Field(1, ge=1, le=16)
    """Responses per prompt; response j uses seed + j."""
    stream: bool = False
    stream_options: dict[str, Any] | None = None
    seed: int | None = Field(None, ge=0, le=2**63 - 1)
    """Seed of the per-request torch.Generator (random when absent; echoed in the response)."""
    stop: str | Annotated[list[str], Field(max_length=4)] | None = None
    """Cut the final text at the first occurrence of any of these strings (at most 4, as OpenAI's)."""
    temperature: float | None = Field(None, ge=0)
    """remask/remdm: the Gumbel sampling temperature. Not used by the SDE samplers (their noise scale is `eta`)."""
    top_p: float | None = Field(None, gt=0, le=1)
    """Accepted for client compatibility only when 1 (no nucleus truncation: what these samplers do)."""
    user: str | None = None
    # -- extension: the sampler and its main settings ------------------------------------------------------------------
    sampler: Literal[SAMPLERS] | None = None  # type: ignore[valid-type]  # the registry's names
    """Default: 'sde' for a DSL checkpoint, 'remask' for a bare backbone."""
    nfe: int | None = Field(None, ge=1)
    steps: int | None = Field(None, ge=1)
    gen_length: int | None = Field(None, ge=1)
    block_length: int | None = Field(None, ge=0)
    eta: float | None = Field(None, ge=0)


def _text_only(value: Any) -> Any:
    """A string (or each string of a list) must be text: a lone surrogate (a ``\\ud800`` escape in the JSON body)
    cannot be tokenised, so it is refused here (400) instead of failing inside the tokenizer."""
    for s in (value if isinstance(value, list) else [value]):
        bad = not_text(s) if isinstance(s, str) else None
        if bad:
            raise ValueError(bad)
    return value


class CompletionRequest(SamplingFields):
    prompt: Annotated[str | list[str] | list[int], AfterValidator(_text_only)]
    """A string, a list of strings (one choice set each), or one prompt as token ids."""
    chat_template: bool = False
    """Extension: wrap each prompt string as one user turn with the tokenizer's chat template."""
    echo: bool = False
    logprobs: int | None = Field(None, ge=0, le=5)
    """OpenAI's completions logprobs: each token's log-probability and this many alternatives (docs/serving.md)."""


class ContentPart(BaseModel):
    type: Literal["text"]
    text: Annotated[str, AfterValidator(_text_only)]


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="forbid")

    role: Literal["system", "developer", "user", "assistant"]
    content: Annotated[str | list[ContentPart], AfterValidator(_text_only)]
    name: str | None = None
    """OpenAI's participant name: accepted, not rendered (the chat templates have no place for it)."""

    def text(self) -> str:
        return self.content if isinstance(self.content, str) else "".join(p.text for p in self.content)


class ChatRequest(SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool = False
    """Each token's log-probability under the sampler's final distribution (docs/serving.md)."""
    top_logprobs: int | None = Field(None, ge=0, le=20)
    """With logprobs: this many most likely alternatives per token."""


# -- request -> (sampler, config) --------------------------------------------------------------------------------------
def sampler_fields(name: str) -> list[str]:
    """Config fields a request may set for sampler `name` (besides the explicit ones)."""
    return get_spec(name).fields()


def _coerce_extra(cls: type, key: str, value: Any) -> Any:
    hint = typing.get_type_hints(cls)[key]
    try:
        return pydantic.TypeAdapter(hint).validate_python(value)
    except pydantic.ValidationError as e:
        raise RequestError(f"{key}={value!r} is not valid: {e.errors()[0]['msg']}", key) from None


def _pick(a: int | None, b: int | None, names: tuple[str, str]) -> int | None:
    if a is not None and b is not None and a != b:
        raise RequestError(f"{names[0]}={a} and {names[1]}={b} disagree; give one of them", names[0])
    return a if a is not None else b


def build_sampling(req: SamplingFields, *, default_sampler: str, has_converter: bool,
                   max_tokens: int | None = None, has_kv_cache: bool = True) -> tuple[str, SDEConfig | RemaskConfig]:
    """The sampler name and its validated config for a request (the registry's parser builds it); RequestError (400)
    naming the field otherwise. `has_kv_cache`: whether the served backbone supports the samplers' approximate
    key/value caching."""
    name = req.sampler or default_sampler
    spec = get_spec(name)
    if spec.needs_dsl and not has_converter:
        raise RequestError(f"sampler={name!r} needs a DSL checkpoint (noise embedding + converter); this server's "
                           f"model is a bare backbone: use 'remask' or 'remdm'", "sampler")
    valid = set(spec.fields())
    kwargs: dict[str, Any] = {}
    for key, value in (req.model_extra or {}).items():
        if key not in valid or key in _EXPLICIT:
            raise RequestError(f"unknown field {key!r} for sampler {name!r}; besides the OpenAI fields, valid fields are "
                               f"{sorted(valid | {'sampler', 'nfe', 'steps', 'seed'})}", key)
        kwargs[key] = _coerce_extra(spec.config_class, key, value)
    gen_length = _pick(req.gen_length, max_tokens if max_tokens is not None else req.max_tokens, ("gen_length", "max_tokens"))
    if gen_length is not None:
        kwargs["gen_length"] = gen_length
    if req.block_length is not None:
        kwargs["block_length"] = req.block_length
    if spec.steps_field == "nfe":  # the SDE samplers: two model evaluations per step
        nfe = _pick(req.nfe, None if req.steps is None else 2 * req.steps, ("nfe", "2*steps"))
        if nfe is not None:
            kwargs["nfe"] = nfe
        if req.eta is not None:
            kwargs["eta"] = req.eta
    else:
        steps = _pick(req.steps, req.nfe, ("steps", "nfe"))
        if steps is not None:
            kwargs["steps"] = steps
        if req.temperature is not None:
            kwargs["temperature"] = req.temperature
        if req.eta is not None:
            raise RequestError(f"eta is a setting of the SDE samplers, not of {name!r}", "eta")
    if kwargs.get("kv_cache", "off") != "off" and not has_kv_cache:
        raise RequestError(f"kv_cache={kwargs['kv_cache']!r} needs a backbone with a key/value cache (the native LLaDA "
                           f"backbone); this server's model has none: use kv_cache='off'", "kv_cache")
    try:
        return name, sampler_config(name, kwargs)
    except SamplerSettingError as e:
        param = "nfe" if e.field == "steps" and spec.steps_field == "nfe" else e.field
        raise RequestError(str(e), param) from None


_UNION_MEMBER = re.compile(r"^(str|int|float|bool|none|list\[.*\]|dict\[.*\]|literal\[.*\]|function-.*)$", re.I)


def validation_error_param(loc: tuple) -> str | None:
    """'messages.0.content' from a pydantic/FastAPI error location (without the leading 'body' and the union member
    tags pydantic adds, e.g. 'stop.list[str]' -> 'stop')."""
    parts = [str(p) for p in loc if p != "body" and not (isinstance(p, str) and _UNION_MEMBER.match(p))]
    return ".".join(parts) or None
