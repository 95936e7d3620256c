"""The Backbone contract every model family implements.

A backbone is an ``nn.Module`` that
- embeds token ids (`embed`), exposing its input embedding table (`input_embeddings`),
- runs *bidirectionally* on ``inputs_embeds`` with an optional HF-style padding mask (1 = keep, 0 = pad),
- returns logits aligned to positions (``logits[:, i]`` predicts the token at position i), and only for the
  positions asked for (`positions`): the final norm and output head run on those rows alone, so a sampler that
  reads the response (or one block) does not pay the head for the prompt,
- knows its special token ids by name (`special`), never as magic numbers in algorithms,
- saves/loads its weights under its family's published key names (`state_dict` keys are the checkpoint keys).
"""

from __future__ import annotations

import enum
import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Union, cast

import torch
import torch.nn.functional as F
from torch import nn

from ...config import ConfigBase
from ...errors import CheckpointError

__all__ = ["END_OF_TURN_SPELLINGS", "Backbone", "CheckpointError", "KVCache", "Positions", "SpecialTokens",
           "context_limit", "model_device", "padding_to_additive_mask"]

Positions = Union[slice, torch.Tensor, None]
"""Which sequence positions' logits a forward returns: None = all; a `slice` (contiguous, the cheapest: a view);
or a 1-D integer tensor of positions shared by every row. The result is (B, K, V) for the K selected positions."""


def select_positions(x: torch.Tensor, positions: Positions) -> torch.Tensor:
    """x[:, positions] for a (B, L, ...) tensor (x itself when positions is None)."""
    if positions is None:
        return x
    if isinstance(positions, slice):
        return x[:, positions]
    if not isinstance(positions, torch.Tensor) or positions.dim() != 1 or positions.is_floating_point():
        raise ValueError(f"positions must be None, a slice or a 1-D integer tensor, got {positions!r}")
    return x.index_select(1, positions.to(x.device))


HEAD_CHUNK_BYTES = 4 << 20
"""`head_linear` runs the output head over vocabulary chunks whose weight rows take at most this many bytes."""
HEAD_CHUNK_MIN_ROWS = 16
"""...for inputs of at least this many rows (MKL takes other kernels for a few rows; not measured there)."""
HEAD_CHUNK_MAX_WIDTH = 1024
"""...and hidden sizes up to this (the range checked bit for bit; wider heads run as one product)."""


def head_linear(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """`F.linear(x, weight)` for an output head weight (V, H), bit for bit. On a CPU in fp32 at inference (from
    HEAD_CHUNK_MIN_ROWS rows, H <= HEAD_CHUNK_MAX_WIDTH) it runs as one product per chunk of vocabulary rows
    (HEAD_CHUNK_BYTES of weight each) written into one (..., V) result: each logit is the same length-H dot product
    in the same order (tests/test_speed_paths.py), and the chunk's packed weight stays in cache. A quantized weight
(a tensor subclass, e.g. torchao's int8) always takes `F.linear`. At 128 rows,
    H 256, V 32,768 (2-core AMD EPYC, MKL) this took 6 % less CPU time than one product at 1 thread, 15 % at 2."""
    H, V = x.shape[-1], weight.shape[0]
    step = max(16, HEAD_CHUNK_BYTES // max(1, H * weight.element_size()) // 16 * 16)
    rows = x.numel() // max(1, H)
    plain = type(weight) in (torch.Tensor, torch.nn.Parameter) and type(weight.data) is torch.Tensor
    if (not plain or x.device.type != "cpu" or x.dtype != torch.float32 or weight.dtype != torch.float32 or V <= step
            or rows < HEAD_CHUNK_MIN_ROWS or H > HEAD_CHUNK_MAX_WIDTH
            or (torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad))):
        return F.linear(x, weight)
    flat = x.reshape(rows, H)
    out = torch.empty(rows, V, dtype=x.dtype, device=x.device)
    for s in range(0, V, step):
        torch.mm(flat, weight[s: s + step].T, out=out[:, s: s + step])
    return out.view(*x.shape[:-1], V)


def position_index(positions: Positions, length: int, device: torch.device | str | None = None) -> torch.Tensor:
    """The selected positions of a length-`length` sequence as a 1-D long tensor (non-negative indices)."""
    if positions is None:
        return torch.arange(length, device=device)
    if isinstance(positions, slice):
        return torch.arange(length, device=device)[positions]
    idx = positions.to(device=device, dtype=torch.long)
    return torch.where(idx < 0, idx + length, idx)


def with_positions(fn: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    """`fn(ids_or_embeds, attention_mask, positions=...)` for a logits function that may not take `positions`
    (duck-typed models): such a function computes every position and the wanted ones are selected afterwards."""
    params: Mapping[str, inspect.Parameter]
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        params = {}
    if "positions" in params or any(p.kind is p.VAR_KEYWORD for p in params.values()):
        return fn

    def selected(*args: Any, positions: Positions = None, **kwargs: Any) -> torch.Tensor:
        return select_positions(fn(*args, **kwargs), positions)

    return selected


def compiled(module: nn.Module) -> Callable[..., torch.Tensor]:
    """`torch.compile(module)`, built once and kept on the module (not registered: never in its state_dict).
    Compilation happens on the first call and again for each new input shape or `positions` value."""
    fn = module.__dict__.get("_compiled_call")
    if fn is None:
        fn = torch.compile(module)
        object.__setattr__(module, "_compiled_call", fn)
    return fn



@dataclass
class KVCache:
    """Every layer's attention keys and values of one sequence, (B, n_kv_heads, length, head_dim) each, with
    RoPE applied (what `Backbone.forward_cached` builds and reuses)."""

    keys: list[torch.Tensor]
    values: list[torch.Tensor]
    length: int


END_OF_TURN_SPELLINGS = ("<|eot_id|>", "<|im_end|>")
"""How tokenizers spell their end-of-turn token (LLaDA and the toy world, Dream); the first one a vocabulary holds is
its end of turn."""


@dataclass(frozen=True)
class SpecialTokens(ConfigBase):
    """Named special token ids of a backbone's tokenizer."""

    mask: int
    """The [MASK] id used by masked diffusion (LLaDA 126336)."""
    eos: int
    """End of text (LLaDA 126081; also the SFT padding token)."""
    eot: int | None = None
    """End of turn (LLaDA `<|eot_id|>` 126348); None when the tokenizer has none."""
    pad: int | None = None
    """Padding id for left padding of prompts (LLaDA uses EOS)."""
    bos: int | None = None
    """Beginning of text."""

    def __post_init__(self) -> None:
        for name in ("mask", "eos"):
            v = getattr(self, name)
            if not isinstance(v, int) or v < 0:
                raise ValueError(f"special token id {name}={v!r} must be a non-negative int")
        if self.pad is not None and self.pad == self.mask:
            raise ValueError(f"pad id {self.pad} equals the mask id; left padding with [MASK] would be ambiguous")

    @property
    def pad_id(self) -> int:
        return self.eos if self.pad is None else self.pad

    def stop_ids(self) -> tuple[int, ...]:
        """Ids at which a response ends (EOS and, when present, EoT)."""
        return (self.eos,) if self.eot is None else (self.eos, self.eot)

    def validate(self, vocab_size: int) -> None:
        for name in ("mask", "eos", "eot", "pad", "bos"):
            v = getattr(self, name)
            if v is not None and not 0 <= v < vocab_size:
                raise ValueError(f"special token id {name}={v} is outside the vocabulary [0, {vocab_size})")


class Backbone(nn.Module):
    """Base class for bidirectional masked-diffusion backbones."""

    special: SpecialTokens
    family: str = "base"

    @property
    def vocab_size(self) -> int:
        """Width of the logits (= rows of the input embedding)."""
        raise NotImplementedError

    @property
    def hidden_size(self) -> int:
        raise NotImplementedError

    @property
    def max_length(self) -> int | None:
        """Longest sequence the model supports (None = unbounded)."""
        return None

    def input_embeddings(self) -> nn.Embedding:
        raise NotImplementedError

    def output_embeddings(self) -> nn.Module:
        """The LM head (output projection); the input embedding itself when weights are tied."""
        raise NotImplementedError

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        """(B, L) ids -> (B, L, H) input embeddings."""
        return cast(torch.Tensor, self.input_embeddings()(ids))

    def forward(self, inputs_embeds: torch.Tensor, attention_mask: torch.Tensor | None = None, *,
                positions: Positions = None) -> torch.Tensor:
        """(B, L, H) embeddings [+ (B, L) padding mask] -> (B, K, V) logits aligned to positions, for the K positions
        selected by `positions` (all L when None). Every position still attends to the whole sequence; only the
        final norm and output head are restricted, so the selected rows equal those of the full computation."""
        raise NotImplementedError

    supports_kv_cache: bool = False
    """Whether `forward_cached` is implemented (approximate KV caching in the samplers)."""

    def forward_cached(self, inputs_embeds: torch.Tensor, attention_mask: torch.Tensor | None = None, *,
                       positions: Positions = None, cache: KVCache | None = None,
                       start: int = 0) -> tuple[torch.Tensor, KVCache]:
        """Build (cache None) or reuse a key/value cache; see `LLaDABackbone.forward_cached`."""
        raise NotImplementedError(f"the {self.family} backbone has no key/value cache")

    def logits_from_ids(self, ids: torch.Tensor, attention_mask: torch.Tensor | None = None, *,
                        positions: Positions = None) -> torch.Tensor:
        """Discrete path (same signature as DSLModel.logits_from_ids, so discrete samplers accept either)."""
        return cast(torch.Tensor, self(self.embed(ids), attention_mask, positions=positions))

    def config_dict(self) -> dict[str, Any]:
        """The backbone's own config (e.g. LLaDA config.json contents) for saving next to the weights."""
        raise NotImplementedError


def padding_to_additive_mask(attention_mask: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor | None:
    """HF (B, L) keep-mask -> additive (B, 1, 1, L) float mask, or None when nothing is padded."""
    if attention_mask is None:
        return None
    if attention_mask.dim() != 2:
        raise ValueError(f"attention_mask must be (batch, length), got shape {tuple(attention_mask.shape)}")
    keep = attention_mask.to(torch.bool)
    if bool(keep.all()):
        return None
    neg = torch.finfo(dtype).min
    add = torch.zeros(keep.shape, dtype=dtype, device=keep.device).masked_fill(~keep, neg)
    return add[:, None, None, :]


class FromModel(enum.Enum):
    """Where a context limit may be passed in, its default: read it from the model (`context_limit`)."""

    TOKEN = "from-model"


FROM_MODEL = FromModel.TOKEN


def context_limit(model: Any) -> int | None:
    """Longest sequence (prompt + response) a model accepts: `max_length` of its backbone (a DSL model's
    `.backbone`, or the model itself when it is a backbone); None when unbounded or unknown."""
    for obj in (getattr(model, "backbone", None), model):
        if obj is not None and hasattr(obj, "max_length"):
            limit: int | None = obj.max_length
            return limit
    return None


def model_device(model: Any, fallback: torch.device | str = "cpu") -> torch.device:
    """The device of a model's first parameter (`fallback` for an object without parameters)."""
    if isinstance(model, nn.Module):
        p = next(model.parameters(), None)
        if p is not None:
            return p.device
    return torch.device(fallback)
