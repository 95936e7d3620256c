"""Generic Hugging Face backbones (masked LMs and bidirectional decoder LMs) and Dream-v0.

`HFBackbone` wraps a transformers model that accepts ``inputs_embeds``:

- masked LMs (``*ForMaskedLM``: BERT, RoBERTa, ModernBERT, ...) are bidirectional already and get the HF-style
  (B, L) padding mask they expect (their own mask code keeps e.g. ModernBERT's local-window layers intact);
- decoder LMs (``*ForCausalLM``: Llama, Qwen2, ...) are made bidirectional: ``config.is_causal=False``, every
  attention module's ``is_causal`` cleared, and an explicit 4-D additive float mask (zeros / finfo.min, shape
  (B, 1, L, L), built from the padding mask) is ALWAYS passed, so transformers never builds a causal mask.

The wrapped model's top-level children are adopted as this module's own children, so parameter names and
``state_dict()`` keys are exactly the model's checkpoint keys (tied copies such as ``lm_head.weight`` are left
out of ``state_dict()``, as ``save_pretrained`` leaves them out of the file).

`DreamBackbone` runs Dream-v0 (Qwen2 architecture, model_type "Dream") on ``transformers.Qwen2ForCausalLM``
and undoes Dream's one-position logit shift (docs/provenance.md §8.3) so that ``logits[:, i]`` predicts token i.

Everything loads from local folders only (config.json + safetensors; never pickles, never remote code, never
the hub: downloading is the caller's explicit choice, see `backbones.resolve_model_path`).
"""

from __future__ import annotations

import inspect
import json
import re
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..checkpoint import CheckpointFolder, check_keys, opened
from .base import (END_OF_TURN_SPELLINGS, Backbone, CheckpointError, Positions, SpecialTokens, position_index,
                   select_positions)

# Model types whose learned absolute positions start at pad_token_id + 1 (the fairseq convention).
_PADDING_OFFSET_POSITIONS = frozenset({"roberta", "xlm-roberta", "camembert", "roberta-prelayernorm", "xmod",
                                       "data2vec-text", "longformer", "ibert", "mpnet", "xlm-roberta-xl"})


def bidirectional_additive_mask(attention_mask: torch.Tensor | None, batch: int, length: int, dtype: torch.dtype,
                                device: torch.device) -> torch.Tensor:
    """(B, L) keep-mask (1 keep, 0 pad) or None -> additive (B, 1, L, L) float mask: 0 where a key may be
    attended, finfo(dtype).min where it is padding. No causal part. A row that is all padding attends everywhere
    (its outputs are meaningless, but stay finite)."""
    if attention_mask is None:
        return torch.zeros((1, 1, 1, 1), dtype=dtype, device=device).expand(batch, 1, length, length)
    if attention_mask.dim() != 2 or tuple(attention_mask.shape) != (batch, length):
        raise ValueError(f"attention_mask must be (batch, length) = {(batch, length)}, "
                         f"got shape {tuple(attention_mask.shape)}")
    keep = attention_mask.to(device=device, dtype=torch.bool)
    keep = keep | ~keep.any(dim=-1, keepdim=True)
    add = torch.zeros(keep.shape, dtype=dtype, device=device).masked_fill(~keep, torch.finfo(dtype).min)
    return add[:, None, None, :].expand(batch, 1, length, length)


def position_ids_from_mask(attention_mask: torch.Tensor, offset: int = 0) -> torch.Tensor:
    """Positions that skip left padding: cumsum(mask) - 1, clamped at 0 (pads get 0), plus `offset`."""
    m = attention_mask.to(torch.long)
    return (m.cumsum(-1) - 1).clamp_min(0) + offset


def _tied_targets(model: nn.Module) -> dict[str, str]:
    """target key -> source key for weights the model ties (e.g. lm_head.weight -> model.embed_tokens.weight)."""
    tied = getattr(model, "all_tied_weights_keys", None)
    if isinstance(tied, dict):
        return {str(k): str(v) for k, v in tied.items()}
    return {}


class HFBackbone(Backbone):
    """A transformers masked LM or (made bidirectional) decoder LM behind the Backbone contract."""

    family = "hf"
    _hf: Any
    """The wrapped transformers model (a `PreTrainedModel`: its config and methods are transformers', untyped)."""

    def __init__(self, model: Any, special: SpecialTokens, *, kind: str | None = None):
        super().__init__()
        if kind is None:
            kind = "masked" if type(model).__name__.endswith("ForMaskedLM") else "causal"
        if kind not in ("masked", "causal"):
            raise ValueError(f"kind={kind!r} must be 'masked' or 'causal'")
        self.kind = kind
        object.__setattr__(self, "_hf", model)  # not registered: its children are adopted below
        for name, child in model.named_children():
            self.add_module(name, child)
        for name, p in model.named_parameters(recurse=False):
            self.register_parameter(name, p)
        for name, b in model.named_buffers(recurse=False):
            self.register_buffer(name, b, persistent=name not in model._non_persistent_buffers_set)
        self._tied = _tied_targets(model)
        self._register_state_dict_hook(_drop_tied_keys)
        self.register_load_state_dict_post_hook(_forgive_tied_keys)
        if kind == "causal":
            make_bidirectional(model)
        emb = model.get_input_embeddings()
        out = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
        out_rows = getattr(getattr(out, "weight", None), "shape", (emb.num_embeddings,))[0]
        if out_rows != emb.num_embeddings:
            raise CheckpointError(f"{type(model).__name__}: the output head has {out_rows} rows but the input embedding "
                                  f"{emb.num_embeddings}; logits must be as wide as the embedding table")
        self.special = special
        self.special.validate(emb.num_embeddings)
        fwd = inspect.signature(model.forward).parameters
        self._takes_position_ids = "position_ids" in fwd
        self._takes_logits_to_keep = "logits_to_keep" in fwd  # the head then runs on the kept rows only
        cfg = model.config
        self._position_offset = (cfg.pad_token_id + 1 if getattr(cfg, "model_type", "") in _PADDING_OFFSET_POSITIONS
                                 and getattr(cfg, "pad_token_id", None) is not None else 0)
        self.train(model.training)

    # -- the wrapped model ---------------------------------------------------------------------------
    @property
    def hf_model(self) -> nn.Module:
        return self._hf

    @property
    def config(self) -> Any:
        return self._hf.config

    def train(self, mode: bool = True) -> "HFBackbone":
        super().train(mode)
        self._hf.training = mode
        return self

    def gradient_checkpointing_enable(self) -> None:
        self._hf.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})

    # -- Backbone contract -------------------------------------------------------------------------
    @property
    def vocab_size(self) -> int:
        return self.input_embeddings().num_embeddings

    @property
    def hidden_size(self) -> int:
        return self.input_embeddings().embedding_dim

    @property
    def max_length(self) -> int | None:
        m = getattr(self._hf.config, "max_position_embeddings", None)
        return None if m is None else int(m) - self._position_offset

    def input_embeddings(self) -> nn.Embedding:
        return self._hf.get_input_embeddings()

    def output_embeddings(self) -> nn.Module:
        return self._hf.get_output_embeddings()

    def config_dict(self) -> dict[str, Any]:
        d = self._hf.config.to_dict()
        if not d.get("architectures"):
            d["architectures"] = [type(self._hf).__name__]
        if d.get("mask_token_id") is None:  # decoder LMs: keep the caller's mask id with the weights
            d["mask_token_id"] = self.special.mask
        return d

    def _position_ids(self, attention_mask: torch.Tensor | None) -> torch.Tensor | None:
        if attention_mask is None or not self._takes_position_ids or bool(attention_mask.to(torch.bool).all()):
            return None
        return position_ids_from_mask(attention_mask, self._position_offset)

    def _raw_logits(self, inputs_embeds: torch.Tensor, attention_mask: torch.Tensor | None,
                    positions: Positions = None) -> torch.Tensor:
        B, L, _ = inputs_embeds.shape
        kwargs: dict[str, Any] = {"inputs_embeds": inputs_embeds, "return_dict": True}
        if self.kind == "causal":
            kwargs["attention_mask"] = bidirectional_additive_mask(attention_mask, B, L, inputs_embeds.dtype,
                                                                   inputs_embeds.device)
            kwargs["use_cache"] = False
        elif attention_mask is not None:
            kwargs["attention_mask"] = attention_mask.to(inputs_embeds.device)
        pos = self._position_ids(attention_mask)
        if pos is not None:
            kwargs["position_ids"] = pos.to(inputs_embeds.device)
        if positions is None:
            return self._hf(**kwargs).logits
        if self._takes_logits_to_keep:
            kwargs["logits_to_keep"] = position_index(positions, L, inputs_embeds.device)
            return self._hf(**kwargs).logits
        return select_positions(self._hf(**kwargs).logits, positions)  # no way to skip the head: select after it

    def forward(self, inputs_embeds: torch.Tensor, attention_mask: torch.Tensor | None = None, *,
                positions: Positions = None) -> torch.Tensor:
        return self._raw_logits(inputs_embeds, attention_mask, positions)


def _drop_tied_keys(module: HFBackbone, state_dict: dict, prefix: str, local_metadata: Any) -> None:
    for target in module._tied:
        state_dict.pop(prefix + target, None)


def _forgive_tied_keys(module: HFBackbone, incompatible: Any) -> None:
    tied = set(module._tied)
    for k in [k for k in incompatible.missing_keys if k in tied]:
        incompatible.missing_keys.remove(k)


def make_bidirectional(model: Any) -> None:
    """Clear every causal flag transformers consults (the explicit 4-D mask in forward does the rest)."""
    model.config.is_causal = False
    for mod in model.modules():
        if isinstance(getattr(mod, "is_causal", None), bool):
            setattr(mod, "is_causal", False)  # a plain attribute of transformers' attention modules


# -- loading -----------------------------------------------------------------------------------------
def _auto_class(config: Any, path: Path) -> tuple[Any, str]:
    from transformers import AutoModelForCausalLM, AutoModelForMaskedLM
    from transformers.models.auto.modeling_auto import (
        MODEL_FOR_CAUSAL_LM_MAPPING_NAMES, MODEL_FOR_MASKED_LM_MAPPING_NAMES)

    archs = list(getattr(config, "architectures", None) or [])
    if any(a.endswith("ForMaskedLM") for a in archs):
        return AutoModelForMaskedLM, "masked"
    if any(a.endswith(("ForCausalLM", "LMHeadModel")) for a in archs):
        return AutoModelForCausalLM, "causal"
    mt = getattr(config, "model_type", "")
    if not archs and mt in MODEL_FOR_MASKED_LM_MAPPING_NAMES:
        return AutoModelForMaskedLM, "masked"
    if not archs and mt in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        return AutoModelForCausalLM, "causal"
    raise CheckpointError(f"{path}/config.json: architectures={archs} (model_type={mt!r}) is neither a *ForMaskedLM "
                          f"nor a *ForCausalLM model; only masked LMs and decoder LMs can be backbones")


def _build_empty(auto_cls: Any, config: Any) -> Any:
    """The model with parameters on the meta device (buffers such as RoPE tables are real)."""
    from accelerate import init_empty_weights

    last: Exception | None = None
    for impl in ("sdpa", "eager"):
        try:
            with init_empty_weights(include_buffers=False):
                return auto_cls.from_config(config, attn_implementation=impl)
        except (ValueError, ImportError) as e:  # the model has no SDPA path: eager takes an additive mask too
            last = e
    raise CheckpointError(f"cannot build {getattr(config, 'model_type', '?')} with SDPA or eager attention: {last}")


def load_weights(model: Any, path: Path | CheckpointFolder, *, dtype: torch.dtype, device: str | torch.device,
                 extra_keys_ok: tuple[str, ...] = ()) -> None:
    """Fill a meta-initialised transformers model from the folder's safetensors, checking keys and shapes.

    Unknown keys (other than `extra_keys_ok` prefixes and the model class's own ignore patterns) and missing keys
    raise one CheckpointError; tied copies (e.g. ``lm_head.weight`` with tied embeddings) may be absent and are
    re-tied to their source after loading. Checkpoint keys must equal the model's state_dict keys: families whose
    files transformers renames while loading (legacy names, fused MoE experts) are reported, not converted."""
    with opened(path) as ckpt:
        _load_weights(model, ckpt, dtype=dtype, device=device, extra_keys_ok=extra_keys_ok)


def _load_weights(model: Any, ckpt: CheckpointFolder, *, dtype: torch.dtype, device: str | torch.device,
                  extra_keys_ok: tuple[str, ...]) -> None:
    path = ckpt.path
    tied = _tied_targets(model)
    full = model.state_dict()
    expected = [k for k in full if k not in tied]
    ignore = [re.compile(p) for p in (getattr(model, "_keys_to_ignore_on_load_unexpected", None) or [])]
    found = [k for k in ckpt.files
             if not k.startswith(tuple(extra_keys_ok)) and not any(p.search(k) for p in ignore)]
    check_keys(expected, found, str(path), optional=tied)
    state = ckpt.read_tensors(expected, dtype=dtype, device=device)
    for k, v in state.items():
        want = tuple(full[k].shape)
        if tuple(v.shape) != want:
            raise CheckpointError(f"{path}: tensor {k} has shape {tuple(v.shape)}, config implies {want}")
        if not full[k].is_floating_point():
            state[k] = v.to(full[k].dtype)
    model.load_state_dict(state, strict=False, assign=True)
    if tied:
        model.tie_weights()
    still_meta = [n for n, t in list(model.named_parameters()) + list(model.named_buffers()) if t.is_meta]
    if still_meta:
        raise CheckpointError(f"{path}: no tensor for {still_meta[:5]} (missing from the checkpoint and not tied)")
    model.to(device=device)
    model.eval()


def _token_ids_from_tokenizer_config(path: Path) -> dict[str, int]:
    """role -> id ('mask', 'eos', 'pad', 'bos', 'cls', 'sep', 'unk' and added token strings) from
    tokenizer_config.json, without building the tokenizer."""
    p = path / "tokenizer_config.json"
    if not p.exists():
        return {}
    try:
        data = json.loads(p.read_text())
    except json.JSONDecodeError:
        return {}
    dec = data.get("added_tokens_decoder", {}) or {}
    by_content = {v["content"]: int(k) for k, v in dec.items() if isinstance(v, dict) and "content" in v}
    out = dict(by_content)
    for role in ("mask", "eos", "pad", "bos", "cls", "sep", "unk"):
        tok = data.get(f"{role}_token")
        if isinstance(tok, dict):
            tok = tok.get("content")
        if isinstance(tok, str) and tok in by_content:
            out[role] = by_content[tok]
    return out


def _first_id(v: Any) -> int | None:
    if isinstance(v, (list, tuple)):
        v = v[0] if v else None
    return int(v) if isinstance(v, int) and not isinstance(v, bool) else None


def hf_special_tokens(config: Any, path: Path | None = None) -> SpecialTokens:
    """Special ids from config attributes, completed from tokenizer_config.json (no tokenizer is built)."""
    tok = _token_ids_from_tokenizer_config(path) if path is not None else {}

    def pick(*candidates: Any) -> int | None:
        for c in candidates:
            c = _first_id(c)
            if c is not None:
                return c
        return None

    cfg = lambda k: getattr(config, k, None)  # noqa: E731
    mask = pick(cfg("mask_token_id"), tok.get("mask"))
    eos = pick(cfg("eos_token_id"), tok.get("eos"), cfg("sep_token_id"), tok.get("sep"))
    where = f"{path}/config.json" if path is not None else "the model config"
    if mask is None:
        raise CheckpointError(
            f"{where} (model_type={cfg('model_type')!r}) has no mask token id (no mask_token_id, no mask_token in "
            f"tokenizer_config.json); decoder LMs have no [MASK] token, so pass special=SpecialTokens(mask=..., "
            f"eos=...) explicitly (e.g. a reserved or added token id)")
    if eos is None:
        raise CheckpointError(f"{where} has no eos/sep token id; pass special=SpecialTokens(mask=..., eos=...) explicitly")
    pad = pick(cfg("pad_token_id"), tok.get("pad"))
    if pad == mask:
        pad = None
    bos = pick(cfg("bos_token_id"), tok.get("bos"), cfg("cls_token_id"), tok.get("cls"))
    eot = pick(*(tok.get(spelling) for spelling in END_OF_TURN_SPELLINGS))
    return SpecialTokens(mask=mask, eos=eos, eot=eot, pad=pad, bos=bos)


def load_hf_backbone(path: str | Path | CheckpointFolder, *, dtype: torch.dtype = torch.float32,
                     device: str | torch.device = "cpu", special: SpecialTokens | None = None,
                     extra_keys_ok: tuple[str, ...] = ()) -> HFBackbone:
    """A transformers masked LM / decoder LM from a local folder (config.json + safetensors) as an HFBackbone; the
    folder by path or already opened (`CheckpointFolder`)."""
    with opened(path) as ckpt:
        return _load_hf_backbone(ckpt, dtype=dtype, device=device, special=special, extra_keys_ok=extra_keys_ok)


def _load_hf_backbone(ckpt: CheckpointFolder, *, dtype: torch.dtype, device: str | torch.device,
                      special: SpecialTokens | None, extra_keys_ok: tuple[str, ...]) -> HFBackbone:
    from transformers import AutoConfig

    path = ckpt.path
    cfg_json = ckpt.config()
    ckpt.files  # fail early (and name safetensors) when the folder has no weights we can read
    try:
        config = AutoConfig.from_pretrained(str(path), local_files_only=True, trust_remote_code=False)
    except (ValueError, KeyError, OSError, TypeError) as e:
        import transformers

        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise CheckpointError(
            f"{path}/config.json: model_type={str(cfg_json.get('model_type', ''))!r} is neither LLaDA, Dream nor a "
            f"model transformers {transformers.__version__} can build without remote code ({first})") from None
    auto_cls, kind = _auto_class(config, path)
    if kind == "causal":
        bad = [t for t in (getattr(config, "layer_types", None) or []) if t != "full_attention"]
        if bad:
            raise CheckpointError(f"{path}/config.json: layer_types {sorted(set(bad))} are not supported for a "
                                  f"bidirectional decoder backbone (only full attention)")
        config.is_causal = False
    if special is None:
        special = hf_special_tokens(config, path)
    model = _build_empty(auto_cls, config)
    load_weights(model, ckpt, dtype=dtype, device=device, extra_keys_ok=extra_keys_ok)
    return HFBackbone(model, special, kind=kind)


# -- Dream -------------------------------------------------------------------------------------------
DREAM_REQUIRED = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "vocab_size")
_DREAM_FIELDS = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                 "num_key_value_heads", "vocab_size", "rms_norm_eps", "tie_word_embeddings", "max_position_embeddings",
                 "hidden_act", "pad_token_id", "bos_token_id", "eos_token_id")
_DREAM_UNSUPPORTED = {"use_sliding_window": (False, None), "use_mrope": (False, None), "rope_scaling": (None,)}


def qwen2_config_from_dream(data: dict[str, Any], where: str = "config.json") -> Any:
    """A transformers Qwen2Config equivalent to a Dream config.json (bidirectional, SDPA, no cache)."""
    from transformers import Qwen2Config

    missing = [k for k in DREAM_REQUIRED if k not in data]
    if missing:
        raise CheckpointError(f"{where} lacks required Dream field(s) {missing}")
    for k, allowed in _DREAM_UNSUPPORTED.items():
        if k in data and data[k] not in allowed:
            raise CheckpointError(f"{where}: {k}={data[k]!r} is not supported (supported: {list(allowed)})")
    kwargs = {k: data[k] for k in _DREAM_FIELDS if data.get(k) is not None}
    kwargs["rope_theta"] = float(data.get("rope_theta", 10000.0))  # Qwen2Config takes it through **kwargs
    cfg = Qwen2Config(**kwargs, use_sliding_window=False, attention_dropout=0.0, use_cache=False)
    cfg.architectures = ["Qwen2ForCausalLM"]
    cfg.is_causal = False
    return cfg


def dream_config_from_qwen2(config: Any, mask_token_id: int) -> dict[str, Any]:
    """Dream config.json contents for a Qwen2Config (used when a DreamBackbone is built in memory)."""
    rope = getattr(config, "rope_parameters", None) or {}
    d = {k: getattr(config, k, None) for k in _DREAM_FIELDS}
    d.update(model_type="Dream", architectures=["DreamModel"], rope_theta=rope.get("rope_theta", 10000.0),
             rope_scaling=None, use_sliding_window=False, sliding_window=None, use_mrope=False,
             attention_dropout=0.0, mask_token_id=mask_token_id, use_cache=False)
    return d


class DreamBackbone(HFBackbone):
    """Dream-v0 (Qwen2 weights, `model.*` + `lm_head` keys) run bidirectionally with realigned logits."""

    family = "dream"

    def __init__(self, model: nn.Module, special: SpecialTokens, dream_config: dict[str, Any] | None = None):
        super().__init__(model, special, kind="causal")
        self.dream_config = dict(dream_config) if dream_config is not None else \
            dream_config_from_qwen2(model.config, special.mask)

    def config_dict(self) -> dict[str, Any]:
        return dict(self.dream_config)

    def _position_ids(self, attention_mask: torch.Tensor | None) -> torch.Tensor | None:
        # Dream's sampler skips left padding in the positions: cumsum(mask) - 1 (pads clamped to 0).
        if attention_mask is None or bool(attention_mask.to(torch.bool).all()):
            return None
        return position_ids_from_mask(attention_mask)

    def forward(self, inputs_embeds: torch.Tensor, attention_mask: torch.Tensor | None = None, *,
                positions: Positions = None) -> torch.Tensor:
        # Dream keeps the AR convention (raw[:, i] predicts token i+1): shift back so logits[:, i] predicts token i,
        # i.e. logits[:, i] = raw[:, i - 1]. The first position reuses its own logits (as Dream's sampler does), and
        # so does the first real token of a left-padded row, so padded rows match unpadded ones. Only the raw rows
        # i - 1 and i of the wanted positions i go through the head.
        L = inputs_embeds.shape[1]
        idx = position_index(positions, L, inputs_embeds.device)
        prev = (idx - 1).clamp_min(0)
        if positions is None:
            raw = self._raw_logits(inputs_embeds, attention_mask)
            at_prev, at_self = raw[:, prev], raw
        else:
            need = torch.unique(torch.cat([prev, idx]))  # sorted
            raw = self._raw_logits(inputs_embeds, attention_mask, need)
            at_prev = raw[:, torch.searchsorted(need, prev)]
            at_self = raw[:, torch.searchsorted(need, idx)]
        if attention_mask is None or bool(attention_mask.to(torch.bool).all()):
            return torch.where((idx > 0)[None, :, None], at_prev, at_self)
        keep = attention_mask.to(device=raw.device, dtype=torch.bool)
        prev_keep = keep[:, prev] & (idx > 0)[None, :]
        return torch.where(prev_keep[..., None], at_prev, at_self)

    @classmethod
    def from_pretrained(cls, path: str | Path | CheckpointFolder, *, dtype: torch.dtype = torch.float32,
                        device: str | torch.device = "cpu", special: SpecialTokens | None = None,
                        extra_keys_ok: tuple[str, ...] = ()) -> "DreamBackbone":
        """Load a Dream-v0 folder (Dream's config.json + safetensors, sharded or not), by path or already opened
        (`CheckpointFolder`); no remote code."""
        with opened(path) as ckpt:
            return cls._load(ckpt, dtype=dtype, device=device, special=special, extra_keys_ok=extra_keys_ok)

    @classmethod
    def _load(cls, ckpt: CheckpointFolder, *, dtype: torch.dtype, device: str | torch.device,
              special: SpecialTokens | None, extra_keys_ok: tuple[str, ...]) -> "DreamBackbone":
        from transformers import AutoModelForCausalLM

        path = ckpt.path
        data = ckpt.json("config.json", "Dream config")
        if str(data.get("model_type", "")).lower() != "dream":
            raise CheckpointError(f"{path}/config.json has model_type={data.get('model_type')!r}, expected 'Dream'")
        config = qwen2_config_from_dream(data, where=str(path / "config.json"))
        if special is None:
            special = dream_special_tokens(data, path)
        ckpt.files  # fail early when the folder has no weights we can read
        model = _build_empty(AutoModelForCausalLM, config)  # a Qwen2Config -> Qwen2ForCausalLM
        load_weights(model, ckpt, dtype=dtype, device=device, extra_keys_ok=extra_keys_ok)
        return cls(model, special, data)


def dream_special_tokens(data: dict[str, Any], path: Path | None = None) -> SpecialTokens:
    """Dream ids from config.json (mask 151666, eos = pad = bos 151643), eot `<|im_end|>` from the tokenizer."""
    mask, eos = _first_id(data.get("mask_token_id")), _first_id(data.get("eos_token_id"))
    if mask is None or eos is None:
        missing = [k for k, v in (("mask_token_id", mask), ("eos_token_id", eos)) if v is None]
        raise CheckpointError(f"Dream config lacks special token id(s) {missing}; add them to config.json or pass "
                              f"special=SpecialTokens(mask=..., eos=...) explicitly")
    tok = _token_ids_from_tokenizer_config(path) if path is not None else {}
    pad = _first_id(data.get("pad_token_id"))
    return SpecialTokens(mask=mask, eos=eos, eot=tok.get("<|im_end|>"), pad=None if pad == mask else pad,
                         bos=_first_id(data.get("bos_token_id")))


__all__ = ["DreamBackbone", "HFBackbone", "bidirectional_additive_mask", "dream_special_tokens", "hf_special_tokens",
           "load_hf_backbone", "load_weights", "make_bidirectional", "position_ids_from_mask", "qwen2_config_from_dream"]
