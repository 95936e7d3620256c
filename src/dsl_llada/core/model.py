"""DSLModel = backbone + noise embedding + converter; continuous and discrete paths; checkpoints.

Checkpoint layout (a Hugging Face-style folder), identical to the released DSL-LLaDA checkpoints:
    config.json          the backbone's own config (LLaDA: model_type "llada")
    dsl_config.json      DSLConfig (absent in released checkpoints: inferred from the tensors)
    *.safetensors        backbone keys unchanged (`model.transformer.*`) + `noise_embed.weight`
                         + `converter.{logit_bias, backbone_embedding.weight, backbone_embedding.bias, beta}`
                         [+ `converter.residual_proj.*`] [+ `converter.mask_key` for the paper layout]
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Literal, cast

import torch
from torch import nn

from .backbones import load_backbone
from .backbones.base import Backbone, Positions, SpecialTokens
from .checkpoint import DEFAULT_MAX_SHARD_BYTES, CheckpointFolder, copy_tokenizer_files, opened, write_safetensors
from ..config import ConverterConfig, DSLConfig
from .converter import Converter, NoiseEmbedding, posterior_mean
from .numerics import Workspace
from ..errors import CheckpointError
from ..artifacts.atomic import atomic_directory

DSL_CONFIG_NAME = "dsl_config.json"
DSL_PREFIXES = ("noise_embed.", "converter.", "log_snr_max")
# Keys some released checkpoints carry that hold nothing we need (a second reference to the noise table,
# and a vestigial frozen SNR maximum).
IGNORED_DSL_KEYS = ("converter.embed.weight", "log_snr_max")


class DSLModel(nn.Module):
    """A masked-diffusion backbone adapted to continuous DSL states."""

    def __init__(self, backbone: Backbone, config: DSLConfig | None = None):
        super().__init__()
        config = config or DSLConfig()
        if config.backbone_type is None:
            config = config.replace(backbone_type=backbone.family)
        elif config.backbone_type != backbone.family:
            raise CheckpointError(f"the DSL config was made for a {config.backbone_type!r} backbone but this backbone "
                                  f"is {backbone.family!r} ({type(backbone).__name__})")
        self.config = config
        self.backbone = backbone
        cc = self.config.converter
        self.noise_embed = NoiseEmbedding(backbone.vocab_size, cc.noise_dim, trainable=cc.trainable_noise_embed)
        self.converter = Converter(cc, backbone.vocab_size, backbone.hidden_size)

    # -- construction ------------------------------------------------------------------------------
    @classmethod
    def convert(cls, backbone: Backbone, config: DSLConfig | None = None) -> "DSLModel":
        """A fresh DSL model around a pretrained backbone (noise embedding + converter initialised)."""
        model = cls(backbone, config)
        cc = model.config.converter
        wte = backbone.input_embeddings().weight.detach()
        dev, dt = wte.device, wte.dtype
        model.noise_embed.to(dev)
        model.converter.to(device=dev, dtype=dt)
        with torch.no_grad():
            model.converter.beta.data = model.converter.beta.data.float()
            model.converter.logit_bias.data = model.converter.logit_bias.data.float()
        if cc.noise_init == "pca":
            model.noise_embed.init_pca(wte)
        else:
            model.noise_embed.init_random(torch.Generator().manual_seed(cc.noise_seed))
        model.converter.init_from_backbone(wte, backbone.special.mask)
        return model

    def to_compute_dtype(self, dtype: torch.dtype) -> "DSLModel":
        """Cast in place to the paper's precision recipe for `dtype` (as `from_pretrained(dtype=...)` loads): the
        backbone and the converter's value map W, c (and residual projection) in `dtype`; the noise table E, the
        converter's logit bias and beta stay fp32 (the (V+1)-way softmax and the posterior mean read them in
        fp32)."""
        self.backbone.to(dtype)
        for module in (self.converter.backbone_embedding, self.converter.residual_proj):
            if module is not None:
                module.to(dtype)
        if self.converter.mask_key is not None:
            self.converter.mask_key.data = self.converter.mask_key.data.to(dtype)
        return self

    # -- properties --------------------------------------------------------------------------------
    @property
    def special(self) -> SpecialTokens:
        return self.backbone.special

    @property
    def vocab_size(self) -> int:
        return self.backbone.vocab_size

    @property
    def noise_dim(self) -> int:
        return self.config.converter.noise_dim

    @property
    def trained_beta(self) -> float:
        return float(self.converter.beta.detach())

    def unit_noise(self) -> torch.Tensor:
        """E: the (V, d) unit-norm noise embedding, fp32."""
        return self.noise_embed.unit()

    # -- paths -------------------------------------------------------------------------------------
    def context_embed(self, ids: torch.Tensor) -> torch.Tensor:
        """Clean-token input embeddings for context / committed positions (per `context_embedding`)."""
        if self.config.context_embedding == "wte":
            return self.backbone.embed(ids)
        return self.converter.clean_embedding(ids).to(self.backbone.input_embeddings().weight.dtype)

    def mask_embed(self, ids: torch.Tensor) -> torch.Tensor:
        """Embeddings of not-yet-generated positions (Block SDE's future blocks): the converter's trained mask slot
        W[:, V] (+ c) with context_embedding='converter', else the backbone's wte[MASK] (authors)."""
        if self.config.context_embedding == "wte":
            return self.backbone.embed(torch.full_like(ids, self.special.mask))
        h = self.converter.clean_embedding(torch.full_like(ids, self.vocab_size))
        return h.to(self.backbone.input_embeddings().weight.dtype)

    def embed_inputs(self, ids: torch.Tensor, z: torch.Tensor | None = None, state_mask: torch.Tensor | None = None,
                     *, beta: float | torch.Tensor | None = None, E: torch.Tensor | None = None) -> torch.Tensor:
        """Backbone inputs: converter(z) where `state_mask` is True (all positions when None), clean elsewhere.

        `z` is (B, L, d) (only the masked positions are read) or already gathered (N, d) for the N True positions.
        """
        E = self.unit_noise() if E is None else E
        dtype = self.backbone.input_embeddings().weight.dtype
        if z is None:
            return cast(torch.Tensor, self.context_embed(ids))
        if state_mask is None:
            return cast(torch.Tensor, self.converter(z, E, beta)).to(dtype)
        h = self.context_embed(ids)
        zs = z[state_mask] if z.dim() == 3 else z
        hs = self.converter(zs, E, beta).to(dtype)
        return cast(torch.Tensor, h.index_put((state_mask,), hs))

    def logits_from_states(self, ids: torch.Tensor, z: torch.Tensor, state_mask: torch.Tensor | None = None,
                           attention_mask: torch.Tensor | None = None, *, beta: float | torch.Tensor | None = None,
                           E: torch.Tensor | None = None, positions: Positions = None) -> torch.Tensor:
        """Continuous path: states -> converter -> backbone (clean embeddings where state_mask is False).
        `positions` (a slice or 1-D index) restricts the returned logits (and the output head's work) to those positions."""
        h = self.embed_inputs(ids, z, state_mask, beta=beta, E=E)
        return cast(torch.Tensor, self.backbone(h, attention_mask, positions=positions))

    def logits_from_ids(self, ids: torch.Tensor, attention_mask: torch.Tensor | None = None, *,
                        positions: Positions = None) -> torch.Tensor:
        """Discrete path: token ids through the backbone's own input embedding (as the authors' remasking)."""
        return cast(torch.Tensor, self.backbone(self.backbone.embed(ids), attention_mask, positions=positions))

    def posterior_mean(self, logits: torch.Tensor, top_m: int = 512, E: torch.Tensor | None = None,
                       workspace: Workspace | None = None) -> torch.Tensor:
        """Denoiser: top-M renormalised posterior mean over the noise embedding, (..., V) -> (..., d)."""
        return posterior_mean(logits, self.unit_noise() if E is None else E, top_m, workspace=workspace)

    # -- checkpoints -------------------------------------------------------------------------------
    def dsl_state_dict(self) -> dict[str, torch.Tensor]:
        state: dict[str, torch.Tensor] = {"noise_embed.weight": self.noise_embed.weight}
        state.update({f"converter.{k}": v for k, v in self.converter.state_dict().items()})
        return state

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """Backbone keys unprefixed (as the backbone family publishes them) + the DSL keys."""
        state = dict(self.backbone.state_dict())
        state.update(self.dsl_state_dict())
        return state

    def save_pretrained(self, folder: str | Path, *, max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES,
                        extra_files: dict[str, str] | None = None, tokenizer_from: str | Path | None = None) -> Path:
        """Write config.json + dsl_config.json + safetensors atomically (sharded with an index when large), plus
        the tokenizer files (`checkpoint.TOKENIZER_FILES`) found in folder `tokenizer_from`."""
        folder = Path(folder)
        with atomic_directory(folder) as tmp:
            (tmp / "config.json").write_text(json.dumps(self.backbone.config_dict(), indent=2, sort_keys=True) + "\n")
            (tmp / DSL_CONFIG_NAME).write_text(self.config.to_json() + "\n")
            if tokenizer_from is not None:
                copy_tokenizer_files(tokenizer_from, tmp)
            for name, text in (extra_files or {}).items():
                (tmp / name).write_text(text)
            write_safetensors(self.full_state_dict(), tmp, max_shard_bytes=max_shard_bytes)
        return folder

    @classmethod
    def from_pretrained(cls, folder: str | Path | CheckpointFolder, *, dtype: torch.dtype = torch.float32,
                        device: str | torch.device = "cpu", special: SpecialTokens | None = None,
                        assume_released: bool = False) -> "DSLModel":
        """Load a DSL checkpoint written by `save_pretrained`, or (with `assume_released`) one in the released
        DSL-LLaDA layout, which has no dsl_config.json: its settings are then inferred (`infer_released_config`).
        Without `assume_released` a DSL checkpoint lacking dsl_config.json is refused rather than guessed.
        `folder` may be a `CheckpointFolder` already opened: what it has read is not read again."""
        with opened(folder) as ckpt:
            return cls._load(ckpt, dtype=dtype, device=device, special=special, assume_released=assume_released)

    @classmethod
    def _load(cls, ckpt: CheckpointFolder, *, dtype: torch.dtype, device: str | torch.device,
              special: SpecialTokens | None, assume_released: bool) -> "DSLModel":
        folder = ckpt.path
        names = set(ckpt.files)
        if "noise_embed.weight" not in names:
            raise CheckpointError(f"{folder} has no 'noise_embed.weight': it is not a DSL checkpoint "
                                  f"(use `dsl-llada convert` to make one from a backbone)")
        check_released_opt_in(folder, assume_released)
        cfg_path = folder / DSL_CONFIG_NAME
        config = DSLConfig.from_dict(ckpt.json(DSL_CONFIG_NAME, "DSL config")) if cfg_path.exists() else \
            infer_released_config(ckpt, names)
        backbone = load_backbone(ckpt, dtype=dtype, device=device, special=special, extra_keys_ok=DSL_PREFIXES)
        with torch.device("meta"):  # the noise table and converter are the checkpoint's tensors (assigned below): an
            model = cls(backbone, config)  # fp32 (H, V+1) converter is never allocated or initialised (2 GB at 8B)
        expected = set(model.dsl_state_dict())
        dsl_names = {k for k in names if k.startswith(DSL_PREFIXES)} - set(IGNORED_DSL_KEYS)
        unknown, missing = sorted(dsl_names - expected), sorted(expected - dsl_names)
        if unknown or missing:
            raise CheckpointError(f"unrecognised DSL keys in {folder}: unknown {unknown[:5]}, missing {missing[:5]}")
        tensors = ckpt.read_tensors(sorted(expected), device=device)
        for k, v in tensors.items():
            if k == "noise_embed.weight" or k in ("converter.beta", "converter.logit_bias"):
                tensors[k] = v.float()
            elif v.is_floating_point():
                tensors[k] = v.to(dtype)
        shapes = {k: tuple(v.shape) for k, v in model.dsl_state_dict().items()}
        for k, v in tensors.items():
            if tuple(v.shape) != shapes[k]:
                raise CheckpointError(f"{folder}: {k} has shape {tuple(v.shape)}, expected {shapes[k]} "
                                      f"(vocab {model.vocab_size}, hidden {backbone.hidden_size}, d {config.converter.noise_dim})")
        model.noise_embed.weight = nn.Parameter(tensors.pop("noise_embed.weight"),
                                                requires_grad=config.converter.trainable_noise_embed)
        model.converter.load_state_dict({k[len("converter."):]: v for k, v in tensors.items()}, assign=True)
        return model


def cast_for_inference(model: DSLModel | Backbone, dtype: torch.dtype) -> DSLModel | Backbone:
    """A trained model in the paper's precision recipe for `dtype` (DSL models keep E, the logit bias and beta in
    fp32, `DSLModel.to_compute_dtype`; a bare backbone is cast whole)."""
    return model.to_compute_dtype(dtype) if isinstance(model, DSLModel) else model.to(dtype)


def check_released_opt_in(folder: str | Path, assume_released: bool) -> None:
    """Refuse a DSL checkpoint without dsl_config.json (the released DSL-LLaDA layout) unless `assume_released`:
    its converter settings would be guessed, and a wrong guess changes the output. The one message every entry
    point gives, naming the opt-in as each spells it."""
    if assume_released or (Path(folder) / DSL_CONFIG_NAME).exists():
        return
    raise CheckpointError(f"{str(folder)!r} is a DSL checkpoint without {DSL_CONFIG_NAME}: its converter settings "
                          f"cannot be read, and guessing them changes the output; restore its {DSL_CONFIG_NAME}, or, "
                          f"if it is a released DSL-LLaDA checkpoint (settings inferred: context_embedding='wte', "
                          f"frozen noise embedding), opt in with assume_released: --assume-released on the command "
                          f"line, 'assume_released: true' in an evaluation's model entry, assume_released=true in "
                          f"lm-eval's model_args, assume_released=True in ModelSource")


def infer_released_config(folder: Path | CheckpointFolder, names: set[str]) -> DSLConfig:
    """DSLConfig for a released checkpoint (no dsl_config.json): released layout, sizes read from the tensors."""
    if {"converter.gate_temp", "converter.gate_bias"} & names:
        raise CheckpointError(f"{Path(folder)} uses the SNR-gated residual converter (gate_temp/gate_bias), which is "
                              f"not supported")
    with opened(folder) as ckpt:
        shape = ckpt.read_tensors(["noise_embed.weight"])["noise_embed.weight"].shape
    layout: Literal["released", "paper"] = "released" if "converter.backbone_embedding.bias" in names else "paper"
    conv = ConverterConfig(noise_dim=int(shape[1]), layout=layout, trainable_noise_embed=False,
                           residual="converter.residual_proj.weight" in names)
    return DSLConfig(converter=conv, context_embedding="wte")
