"""The Backbone contract every model family implements.

A backbone is an ``nn.Module`` that
- embeds token ids (`embed`), exposing its input embedding table (`input_embeddings`),
- runs *bidirectionally* on ``inputs_embeds`` with an optional HF-style padding mask (1 = keep, 0 = pad),
- returns logits aligned to positions (``logits[:, i]`` predicts the token at position i),
- knows its special token ids by name (`special`), never as magic numbers in algorithms,
- saves/loads its weights under its family's published key names (`state_dict` keys are the checkpoint keys).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from ..config import ConfigBase
from ..errors import CheckpointError

__all__ = ["Backbone", "CheckpointError", "SpecialTokens", "padding_to_additive_mask"]


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
        return self.input_embeddings()(ids)

    def forward(self, inputs_embeds: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """(B, L, H) embeddings [+ (B, L) padding mask] -> (B, L, V) logits aligned to positions."""
        raise NotImplementedError

    def logits_from_ids(self, ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """Discrete path (same signature as DSLModel.logits_from_ids, so discrete samplers accept either)."""
        return self(self.embed(ids), attention_mask)

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
