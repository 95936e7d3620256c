"""Backbone registry: native LLaDA, Dream and generic Hugging Face bidirectional models.

`load_backbone(path)` reads `config.json` and dispatches on its `model_type`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import torch

from ..checkpoint import CheckpointFolder, opened
from .base import Backbone, CheckpointError, SpecialTokens
from .llada import LLaDABackbone, LLaDAConfig, tiny_llada_config

Loader = Callable[..., Backbone]
_LOADERS: dict[str, Loader] = {"llada": LLaDABackbone.from_pretrained}


def register_backbone(model_type: str, loader: Loader) -> None:
    """Make `load_backbone` dispatch `config.json` files with this `model_type` to `loader`, called as
    `loader(folder, dtype=, device=, special=, extra_keys_ok=)`; `folder` is a `checkpoint.CheckpointFolder`
    (`Path(folder)` is its path; its `config()`, `files` and `read_tensors` reuse what was already read)."""
    _LOADERS[model_type.lower()] = loader


def _generic_loader() -> Loader | None:
    try:
        from .hf import load_hf_backbone
    except ImportError:
        return None
    return load_hf_backbone


def _dream_loader() -> Loader | None:
    try:
        from .hf import DreamBackbone
    except ImportError:
        return None
    return DreamBackbone.from_pretrained


def load_backbone(path: str | Path | CheckpointFolder, *, dtype: torch.dtype = torch.float32,
                  device: str | torch.device = "cpu", special: SpecialTokens | None = None,
                  extra_keys_ok: tuple[str, ...] = ()) -> Backbone:
    """Load a backbone folder by local path (hub downloads are the caller's choice: see `resolve_model_path`), or
    from a `CheckpointFolder` already opened (its config and tensor map are read once, and the loader gets it)."""
    with opened(path) as ckpt:
        return _load_backbone(ckpt, dtype=dtype, device=device, special=special, extra_keys_ok=extra_keys_ok)


def _load_backbone(ckpt: CheckpointFolder, *, dtype: torch.dtype, device: str | torch.device,
                   special: SpecialTokens | None, extra_keys_ok: tuple[str, ...]) -> Backbone:
    path = ckpt.path
    cfg = ckpt.config()
    if not isinstance(cfg.get("model_type", ""), str):
        raise CheckpointError(f"{path}/config.json: model_type={cfg['model_type']!r} must be a string such as 'llada'")
    model_type = str(cfg.get("model_type", "")).lower()
    loader = _LOADERS.get(model_type)
    if loader is None and model_type == "dream":
        loader = _dream_loader()
    if loader is None:
        loader = _generic_loader()
    if loader is None:
        raise CheckpointError(f"no backbone loader for model_type={model_type!r} in {path}/config.json; "
                              f"known: {sorted(_LOADERS)} (+ 'dream' and generic transformers models)")
    return loader(ckpt, dtype=dtype, device=device, special=special, extra_keys_ok=extra_keys_ok)


def resolve_model_path(name_or_path: str, *, allow_download: bool = False) -> Path:
    """A local folder as is; a hub id only when `allow_download` (then via huggingface_hub.snapshot_download)."""
    p = Path(name_or_path)
    if p.is_dir():
        return p
    if p.exists():
        parent = str(p.parent)
        raise CheckpointError(f"{name_or_path!r} is a file, not a model folder; give the folder that holds config.json "
                              f"and the weights (e.g. {parent!r})")
    if not allow_download:
        raise CheckpointError(f"checkpoint folder {name_or_path!r} does not exist (to fetch a Hugging Face hub id instead, "
                              f"pass --allow-download)")
    return _download(name_or_path)


def _download(repo_id: str) -> Path:
    """The local snapshot of a hub model (fetched, or from the hub cache); every way it can fail is one
    CheckpointError naming `repo_id`."""
    from huggingface_hub import constants, snapshot_download
    from huggingface_hub.errors import HFValidationError, LocalEntryNotFoundError, RepositoryNotFoundError

    try:
        return Path(snapshot_download(repo_id, allow_patterns=["*.json", "*.safetensors", "*.txt", "*.model"]))
    except HFValidationError as e:
        raise CheckpointError(f"{repo_id!r} is neither a local folder nor a Hugging Face hub id ({e})") from None
    except LocalEntryNotFoundError as e:  # no way to the hub, and nothing cached
        if constants.HF_HUB_OFFLINE:
            why = "downloads are turned off on this machine (HF_HUB_OFFLINE is set)"
        else:
            first = str(e).splitlines()[0].removeprefix("Got: ") if str(e) else type(e).__name__
            why = f"the hub cannot be reached from this machine ({first})"
        raise CheckpointError(f"cannot fetch {repo_id!r} from the Hugging Face hub: {why} and it is not in the local "
                              f"hub cache; download it where the hub can be reached and pass its folder instead") from None
    except RepositoryNotFoundError:  # also gated and private models this machine may not read
        raise CheckpointError(f"{repo_id!r} is not a model this machine may read on the Hugging Face hub (no such "
                              f"model, or a private or gated one: log in first); check the id") from None
    except (OSError, ValueError) as e:
        first = str(e).splitlines()[0] if str(e) else ""
        raise CheckpointError(f"cannot fetch {repo_id!r} from the Hugging Face hub: {type(e).__name__}: {first}") from None


__all__ = ["Backbone", "CheckpointError", "LLaDABackbone", "LLaDAConfig", "SpecialTokens", "load_backbone", "save_backbone",
           "register_backbone", "resolve_model_path", "tiny_llada_config"]


def save_backbone(backbone: Backbone, folder: str | Path, *, max_shard_bytes: int | None = None) -> Path:
    """Write a backbone as a Hugging Face-style folder (config.json + safetensors under its own key names)."""
    import json

    from ..checkpoint import DEFAULT_MAX_SHARD_BYTES, write_safetensors
    from ...artifacts.atomic import atomic_directory

    folder = Path(folder)
    with atomic_directory(folder) as tmp:
        (tmp / "config.json").write_text(json.dumps(backbone.config_dict(), indent=2, sort_keys=True, default=str) + "\n")
        write_safetensors(backbone.state_dict(), tmp, max_shard_bytes=max_shard_bytes or DEFAULT_MAX_SHARD_BYTES)
    return folder
