"""Native LLaDA implementation (no remote code) that reads Hugging Face LLaDA checkpoints as published.

Forward math (docs/provenance.md §8.2): pre-norm blocks with RMSNorm computed in fp32 (cast back, then scaled),
separate q/k/v projections, RoPE (rotate-half, theta from config) in fp32 on all head dims, fully
bidirectional SDPA with an optional padding mask, SwiGLU-style MLP with SiLU on `ff_proj` times `up_proj`,
final `ln_f`, untied LM head `ff_out` (or `wte` when weight_tying). Parameter names equal the checkpoint keys
(`model.transformer.*`).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ..checkpoint import CheckpointFolder, check_keys, opened
from .base import (Backbone, CheckpointError, KVCache, Positions, SpecialTokens, head_linear,
                   padding_to_additive_mask, select_positions)


@dataclass
class LLaDAConfig:
    """The fields of LLaDA's config.json this implementation honours (names exactly as in the file)."""

    d_model: int
    n_layers: int
    n_heads: int
    vocab_size: int
    n_kv_heads: int | None = None
    mlp_hidden_size: int | None = None
    mlp_ratio: int = 4
    embedding_size: int | None = None
    weight_tying: bool = False
    rope_theta: float = 500000.0
    max_sequence_length: int = 4096
    rms_norm_eps: float = 1e-5
    include_bias: bool = False
    include_qkv_bias: bool = False
    mask_token_id: int | None = None
    eos_token_id: int | None = None
    pad_token_id: int | None = None
    bos_token_id: int | None = None
    eot_token_id: int | None = None

    REQUIRED = ("d_model", "n_layers", "n_heads", "vocab_size")
    # Values the reference code supports but this implementation does not; refusing beats a silently wrong model.
    UNSUPPORTED = {
        "alibi": (False,), "rope": (True,), "block_type": ("llama",), "layer_norm_type": ("rms",),
        "activation_type": ("silu",), "attention_layer_norm": (False,), "input_emb_norm": (False,),
        "scale_logits": (False,), "layer_norm_with_affine": (True,), "bias_for_layer_norm": (False, None),
        "block_group_size": (1,), "multi_query_attention": (None, False),
    }

    # (field, lowest, highest) for the integer sizes: beyond these no model fits any machine.
    INT_RANGES = (("d_model", 1, 2**16), ("n_layers", 1, 2**12), ("n_heads", 1, 2**12), ("vocab_size", 1, 2**24),
                  ("n_kv_heads", 1, 2**12), ("mlp_hidden_size", 1, 2**20), ("mlp_ratio", 1, 2**8),
                  ("embedding_size", 1, 2**24), ("max_sequence_length", 1, 2**24))
    BOOLS = ("weight_tying", "include_bias", "include_qkv_bias")
    TOKEN_IDS = ("mask_token_id", "eos_token_id", "pad_token_id", "bos_token_id", "eot_token_id")

    def _validate(self) -> None:
        """Every field's type and range, so a damaged config.json is one error naming the field, not a traceback
        (or a silently different model: a NaN rope_theta, a token id past the vocabulary)."""
        def is_int(v: Any) -> bool:
            return isinstance(v, int) and not isinstance(v, bool)

        for name, lo, hi in self.INT_RANGES:
            v = getattr(self, name)
            if v is None and name in ("n_kv_heads", "mlp_hidden_size", "embedding_size"):
                continue
            if not is_int(v) or not lo <= v <= hi:
                raise ValueError(f"{name}={v!r} must be an integer in [{lo}, {hi}]")
        for name in self.BOOLS:
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name}={getattr(self, name)!r} must be true or false")
        for name, top in (("rope_theta", 1e12), ("rms_norm_eps", 1.0)):
            v = getattr(self, name)
            if not isinstance(v, (int, float)) or isinstance(v, bool) or not (0 < v <= top):  # NaN fails too
                raise ValueError(f"{name}={v!r} must be a finite number in (0, {top:g}]")
        for name in self.TOKEN_IDS:
            v = getattr(self, name)
            if v is not None and (not is_int(v) or not 0 <= v < self.vocab_size):
                raise ValueError(f"{name}={v!r} is outside the vocabulary: it must be a token id in "
                                 f"[0, vocab_size={self.vocab_size})")
        if self.embedding_size is not None and self.embedding_size < self.vocab_size:
            raise ValueError(f"embedding_size={self.embedding_size} is smaller than vocab_size={self.vocab_size}")

    def __post_init__(self) -> None:
        self._validate()
        if self.n_kv_heads is None:
            self.n_kv_heads = self.n_heads
        if self.embedding_size is None:
            self.embedding_size = self.vocab_size
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model={self.d_model} is not divisible by n_heads={self.n_heads}")
        if self.n_heads % self.kv_heads:
            raise ValueError(f"n_heads={self.n_heads} is not divisible by n_kv_heads={self.n_kv_heads}")
        if (self.d_model // self.n_heads) % 2:
            raise ValueError(f"head dim {self.d_model // self.n_heads} must be even for RoPE")

    @property
    def kv_heads(self) -> int:
        """Key/value heads (`n_kv_heads`, which defaults to `n_heads`)."""
        return self.n_kv_heads or self.n_heads

    @property
    def embedding_rows(self) -> int:
        """Rows of the embedding and output head (`embedding_size`, which defaults to `vocab_size`)."""
        return self.embedding_size or self.vocab_size

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    @property
    def ffn_hidden(self) -> int:
        return self.mlp_hidden_size if self.mlp_hidden_size else self.mlp_ratio * self.d_model

    @classmethod
    def from_hf_dict(cls, data: dict[str, Any], where: str = "config.json") -> "LLaDAConfig":
        missing = [k for k in cls.REQUIRED if data.get(k) is None]
        if missing:
            raise CheckpointError(f"{where} lacks required LLaDA field(s) {missing} (absent or null)")
        for k, allowed in cls.UNSUPPORTED.items():
            if k in data and data[k] not in allowed:
                raise CheckpointError(f"{where}: {k}={data[k]!r} is not supported (supported: {list(allowed)})")
        kwargs = {f.name: data[f.name] for f in fields(cls) if data.get(f.name) is not None}
        try:
            return cls(**kwargs)
        except ValueError as e:
            raise CheckpointError(f"{where}: {e}") from None

    def to_hf_dict(self) -> dict[str, Any]:
        d = {f.name: getattr(self, f.name) for f in fields(self)}
        d.update(model_type="llada", architectures=["LLaDAModelLM"], block_type="llama", layer_norm_type="rms",
                 activation_type="silu", rope=True, alibi=False, block_group_size=1, layer_norm_with_affine=True,
                 bias_for_layer_norm=False, attention_layer_norm=False, input_emb_norm=False, scale_logits=False,
                 use_cache=False)
        return d

    def special_tokens(self) -> SpecialTokens:
        missing = [k for k in ("mask_token_id", "eos_token_id") if getattr(self, k) is None]
        if missing or self.mask_token_id is None or self.eos_token_id is None:
            raise CheckpointError(
                f"LLaDA config lacks special token id(s) {missing}; add them to config.json or pass "
                f"special=SpecialTokens(mask=..., eos=...) explicitly")
        return SpecialTokens(mask=self.mask_token_id, eos=self.eos_token_id, eot=self.eot_token_id,
                             pad=self.pad_token_id, bos=self.bos_token_id)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        normed = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return normed.to(x.dtype) * self.weight


def rotate_half(t: torch.Tensor) -> torch.Tensor:
    t1, t2 = t.chunk(2, dim=-1)
    return torch.cat((-t2, t1), dim=-1)


class LLaDABlock(nn.Module):
    def __init__(self, cfg: LLaDAConfig):
        super().__init__()
        d, hd, bias = cfg.d_model, cfg.head_dim, cfg.include_bias
        qkv_bias = cfg.include_bias or cfg.include_qkv_bias
        self.n_heads, self.n_kv, self.head_dim = cfg.n_heads, cfg.kv_heads, hd
        self.attn_norm = RMSNorm(d, cfg.rms_norm_eps)
        self.q_proj = nn.Linear(d, cfg.n_heads * hd, bias=qkv_bias)
        self.k_proj = nn.Linear(d, cfg.kv_heads * hd, bias=qkv_bias)
        self.v_proj = nn.Linear(d, cfg.kv_heads * hd, bias=qkv_bias)
        self.attn_out = nn.Linear(d, d, bias=bias)
        self.ff_norm = RMSNorm(d, cfg.rms_norm_eps)
        self.ff_proj = nn.Linear(d, cfg.ffn_hidden, bias=bias)
        self.up_proj = nn.Linear(d, cfg.ffn_hidden, bias=bias)
        self.ff_out = nn.Linear(cfg.ffn_hidden, d, bias=bias)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, bias: torch.Tensor | None, *,
                kv: tuple[torch.Tensor, torch.Tensor] | None = None, start: int = 0,
                store: list[tuple[torch.Tensor, torch.Tensor]] | None = None) -> torch.Tensor:
        """x: (B, n, d) rows [start, start + n) of the sequence; cos/sin cover the whole sequence.

        kv: this layer's cached (K, V) of the whole sequence (RoPE applied, before GQA repetition); the rows computed
        here replace theirs, every other position's keys/values are taken from it. store: a list the rows' fresh
        (K, V) are appended to (building a cache)."""
        B, L, _ = x.shape
        h = self.attn_norm(x)
        q = self.q_proj(h).view(B, L, self.n_heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(h).view(B, L, self.n_kv, self.head_dim).transpose(1, 2)
        v = self.v_proj(h).view(B, L, self.n_kv, self.head_dim).transpose(1, 2)
        if start or cos.shape[2] != L:
            cos, sin = cos[:, :, start:start + L], sin[:, :, start:start + L]
        q = (q.float() * cos + rotate_half(q.float()) * sin).to(v.dtype)
        k = (k.float() * cos + rotate_half(k.float()) * sin).to(v.dtype)
        if store is not None:
            store.append((k, v))
        if kv is not None:
            K, V = kv
            k = torch.cat([K[:, :, :start], k, K[:, :, start + L:]], dim=2)
            v = torch.cat([V[:, :, :start], v, V[:, :, start + L:]], dim=2)
        if self.n_kv != self.n_heads:
            rep = self.n_heads // self.n_kv
            k = k.repeat_interleave(rep, dim=1)
            v = v.repeat_interleave(rep, dim=1)
        a = F.scaled_dot_product_attention(q, k, v, attn_mask=None if bias is None else bias.to(q.dtype), is_causal=False)
        x = x + self.attn_out(a.transpose(1, 2).reshape(B, L, -1))
        h = self.ff_norm(x)
        return x + self.ff_out(F.silu(self.ff_proj(h)) * self.up_proj(h))


class _Transformer(nn.Module):
    """`model.transformer`: the embedding, the blocks, the final norm and (untied) the output head."""

    def __init__(self, cfg: LLaDAConfig):
        super().__init__()
        self.wte = nn.Embedding(cfg.embedding_rows, cfg.d_model)
        self.blocks = nn.ModuleList(LLaDABlock(cfg) for _ in range(cfg.n_layers))
        self.ln_f = RMSNorm(cfg.d_model, cfg.rms_norm_eps)
        self.ff_out = None if cfg.weight_tying else nn.Linear(cfg.d_model, cfg.embedding_rows, bias=cfg.include_bias)


class _Outer(nn.Module):
    """`model`: holds `transformer`, so parameter names equal the checkpoint keys (`model.transformer.*`)."""

    def __init__(self, transformer: _Transformer):
        super().__init__()
        self.transformer = transformer


class LLaDABackbone(Backbone):
    """LLaDA (8B-Instruct layout, any size) with parameters named exactly as the HF checkpoint keys."""

    family = "llada"

    def __init__(self, cfg: LLaDAConfig, special: SpecialTokens | None = None):
        super().__init__()
        self.cfg = cfg
        self.special = special or cfg.special_tokens()
        self.special.validate(cfg.embedding_rows)
        self.model = _Outer(_Transformer(cfg))
        self.gradient_checkpointing = False
        self._rope_cache: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}

    # -- Backbone contract -------------------------------------------------------------------------
    @property
    def vocab_size(self) -> int:
        return self.cfg.embedding_rows

    @property
    def hidden_size(self) -> int:
        return self.cfg.d_model

    @property
    def max_length(self) -> int | None:
        return self.cfg.max_sequence_length

    def input_embeddings(self) -> nn.Embedding:
        return self.model.transformer.wte

    def config_dict(self) -> dict[str, Any]:
        return self.cfg.to_hf_dict()

    def init_weights(self, generator: torch.Generator | None = None, std: float = 0.02) -> None:
        """Random init for tests and benchmarks: N(0, std) weights, zero biases, unit norms. The draws are made on
        the generator's device (a CUDA generator fills a GPU model without a trip through the CPU), else on the
        parameter's; a CPU generator gives the same values on every device."""
        with torch.no_grad():
            for name, p in self.named_parameters():
                if name.endswith("norm.weight") or name.endswith("ln_f.weight"):
                    p.fill_(1.0)
                elif name.endswith(".bias"):
                    p.zero_()
                else:
                    where = generator.device if generator is not None else p.device
                    p.copy_(torch.randn(p.shape, generator=generator, device=where) * std)

    def _rope(self, L: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        key = (L, str(device))
        if key not in self._rope_cache:
            hd = self.cfg.head_dim
            inv = self.cfg.rope_theta ** (-torch.arange(0, hd, 2, dtype=torch.float32, device=device) / hd)
            freqs = torch.outer(torch.arange(L, dtype=torch.float32, device=device), inv)
            emb = torch.cat((freqs, freqs), dim=-1)
            self._rope_cache = {key: (emb.cos()[None, None], emb.sin()[None, None])}
        return self._rope_cache[key]

    def forward(self, inputs_embeds: torch.Tensor, attention_mask: torch.Tensor | None = None, *,
                positions: Positions = None) -> torch.Tensor:
        t = self.model.transformer
        x = inputs_embeds
        cos, sin = self._rope(x.shape[1], x.device)
        bias = padding_to_additive_mask(attention_mask, torch.float32)
        for blk in t.blocks:
            if self.gradient_checkpointing and self.training and torch.is_grad_enabled():
                x = torch.utils.checkpoint.checkpoint(blk, x, cos, sin, bias, use_reentrant=False)
            else:
                x = blk(x, cos, sin, bias)
        return self._logits(x, positions)

    def _logits(self, x: torch.Tensor, positions: Positions) -> torch.Tensor:
        """Final norm + output head on the `positions` rows of the last block's output only."""
        t = self.model.transformer
        x = t.ln_f(select_positions(x, positions))
        if t.ff_out is None:  # weight tying
            return head_linear(x, t.wte.weight)
        logits = head_linear(x, t.ff_out.weight)
        return logits if t.ff_out.bias is None else logits + t.ff_out.bias

    supports_kv_cache = True

    @torch.no_grad()
    def forward_cached(self, inputs_embeds: torch.Tensor, attention_mask: torch.Tensor | None = None, *,
                       positions: Positions = None, cache: KVCache | None = None,
                       start: int = 0) -> tuple[torch.Tensor, KVCache]:
        """Inference forward that builds or reuses a key/value cache (approximate caching, `sampling/kv_cache.py`).

        cache None: `inputs_embeds` is the whole sequence; returns its logits (at `positions`) and a cache of every
        layer's keys/values. cache given: `inputs_embeds` holds only rows [start, start + n) of that sequence;
        they attend to their own fresh keys/values and to the cached ones of every other position, and `positions`
        index these rows (0 = row `start`). Returns (logits, the cache) -- the cache itself is not updated.
        """
        t = self.model.transformer
        x = inputs_embeds
        total = x.shape[1] if cache is None else cache.length
        if cache is not None and not 0 <= start <= start + x.shape[1] <= total:
            raise ValueError(f"rows [{start}, {start + x.shape[1]}) are outside the cached sequence of {total}")
        cos, sin = self._rope(total, x.device)
        bias = padding_to_additive_mask(attention_mask, torch.float32)
        store: list[tuple[torch.Tensor, torch.Tensor]] = []  # filled only when building the cache
        for i, blk in enumerate(t.blocks):
            kv = None if cache is None else (cache.keys[i], cache.values[i])
            x = blk(x, cos, sin, bias, kv=kv, start=start, store=store if cache is None else None)
        logits = self._logits(x, positions)
        if cache is None:
            cache = KVCache(keys=[k for k, _ in store], values=[v for _, v in store], length=total)
        return logits, cache

    def output_embeddings(self) -> nn.Module:
        t = self.model.transformer
        return t.wte if t.ff_out is None else t.ff_out

    # -- checkpoint I/O ------------------------------------------------------------------------------
    @classmethod
    def from_pretrained(cls, path: str | Path | CheckpointFolder, *, dtype: torch.dtype = torch.float32,
                        device: str | torch.device = "cpu", special: SpecialTokens | None = None,
                        extra_keys_ok: tuple[str, ...] = ()) -> "LLaDABackbone":
        """Load a Hugging Face LLaDA checkpoint folder (config.json + safetensors, sharded or not), by path or
        already opened (`CheckpointFolder`: what it has read is not read again)."""
        with opened(path) as ckpt:
            return cls._load(ckpt, dtype=dtype, device=device, special=special, extra_keys_ok=extra_keys_ok)

    @classmethod
    def _load(cls, ckpt: CheckpointFolder, *, dtype: torch.dtype, device: str | torch.device,
              special: SpecialTokens | None, extra_keys_ok: tuple[str, ...]) -> "LLaDABackbone":
        path = ckpt.path
        data = ckpt.json("config.json", "LLaDA config")
        if data.get("model_type", "llada") != "llada":
            raise CheckpointError(f"{path}/config.json has model_type={data.get('model_type')!r}, expected 'llada'")
        cfg = LLaDAConfig.from_hf_dict(data, where=str(path / "config.json"))
        if special is None:
            special = special_tokens_from_folder(ckpt, cfg)
        with torch.device("meta"):
            model = cls(cfg, special)
        expected = list(model.state_dict().keys())
        files = ckpt.files
        found = [k for k in files if not any(k.startswith(p) for p in extra_keys_ok)]
        check_keys(expected, found, str(path))
        state = ckpt.read_tensors(expected, dtype=dtype, device=device)
        shapes = {k: v.shape for k, v in model.state_dict().items()}
        for k, v in state.items():
            if not v.is_floating_point():
                raise CheckpointError(f"{files[k]}: tensor {k} is {str(v.dtype).removeprefix('torch.')}; model weights "
                                      f"must be floating point (float32, bfloat16 or float16)")
            want = shapes[k]
            if tuple(v.shape) != tuple(want):
                raise CheckpointError(f"{path}: tensor {k} has shape {tuple(v.shape)}, config implies {tuple(want)}")
        model.load_state_dict(state, assign=True)
        return model.to(device=device)


def tiny_llada_config(vocab_size: int = 64, *, d_model: int = 32, n_layers: int = 2, n_heads: int = 4,
                      n_kv_heads: int | None = None, mlp_hidden_size: int | None = None, max_sequence_length: int = 256,
                      mask_token_id: int | None = None, eos_token_id: int | None = None, eot_token_id: int | None = None,
                      bos_token_id: int | None = None, rope_theta: float = 500000.0) -> LLaDAConfig:
    """A LLaDA-shaped config for tests, benchmarks and the toy world (special ids default to the last rows)."""
    mask = vocab_size - 1 if mask_token_id is None else mask_token_id
    eos = vocab_size - 2 if eos_token_id is None else eos_token_id
    return LLaDAConfig(d_model=d_model, n_layers=n_layers, n_heads=n_heads, n_kv_heads=n_kv_heads, vocab_size=vocab_size,
                       mlp_hidden_size=mlp_hidden_size or int(math.ceil(8 * d_model / 3 / 8) * 8),
                       max_sequence_length=max_sequence_length, mask_token_id=mask, eos_token_id=eos,
                       pad_token_id=eos, eot_token_id=eot_token_id, bos_token_id=bos_token_id, rope_theta=rope_theta)


def _added_token_ids(folder: CheckpointFolder) -> dict[str, int]:
    """token string -> id from tokenizer_config.json's added_tokens_decoder (empty when absent)."""
    raw = folder.raw("tokenizer_config.json")
    if raw is None:
        return {}
    try:
        dec = json.loads(raw).get("added_tokens_decoder", {})
    except (json.JSONDecodeError, UnicodeDecodeError):
        return {}
    return {v["content"]: int(k) for k, v in dec.items() if isinstance(v, dict) and "content" in v}


def special_tokens_from_folder(folder: Path | CheckpointFolder, cfg: LLaDAConfig) -> SpecialTokens:
    """Special ids from config.json, completed from generation_config.json (bos) and the tokenizer's added
    tokens (`<|eot_id|>`, `<|startoftext|>`) when the folder has them."""
    with opened(folder) as ckpt:
        base = cfg.special_tokens()
        added = _added_token_ids(ckpt)
        eot = base.eot if base.eot is not None else added.get("<|eot_id|>")
        bos = base.bos
        gen = ckpt.raw("generation_config.json")
        if bos is None and gen is not None:
            try:
                bos = json.loads(gen).get("bos_token_id")
            except (json.JSONDecodeError, UnicodeDecodeError):
                bos = None
    if bos is None:
        bos = added.get("<|startoftext|>")
    return SpecialTokens(mask=base.mask, eos=base.eos, eot=eot, pad=base.pad, bos=bos)
