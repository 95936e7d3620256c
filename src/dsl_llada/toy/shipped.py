"""The pretrained toy masked DLM that ships with the package (the demo's stand-in for LLaDA-8B-Instruct).

`toy/pretrained/` holds its `config.json`, `model.safetensors` and `recipe.json`: the demo configuration it was
trained for (world, architecture, seed, corpus size, pretraining stage), the SHA-256 of each file and how it was made.
The default demo starts from it, as the paper starts from LLaDA, whenever its own configuration is that one;
`dsl-llada demo --from-scratch` pretrains instead.
"""

from __future__ import annotations

import hashlib
import json
from importlib import resources
from pathlib import Path
from typing import Any

from ..core.backbones.base import SpecialTokens
from ..core.backbones.llada import LLaDABackbone
from ..errors import CheckpointError
from ..core.loading import open_model
from ..core.model_source import ModelSource

__all__ = ["load_pretrained", "recipe", "shipped_dir"]


def shipped_dir() -> Path:
    return Path(str(resources.files("dsl_llada.toy") / "pretrained"))


def recipe() -> dict[str, Any]:
    """The recipe record (`key`, `sha256`, `trained`)."""
    return dict(json.loads((shipped_dir() / "recipe.json").read_text()))


def load_pretrained(key: dict[str, Any], special: SpecialTokens) -> LLaDABackbone | None:
    """The shipped backbone when `key` (the demo's pretraining-stage cache key) is the one it was trained for, else
    None. Each file's SHA-256 is checked first: a changed file is an error, never a silently different model."""
    rec = recipe()
    if json.dumps(rec["key"], sort_keys=True) != json.dumps(key, sort_keys=True):
        return None
    folder = shipped_dir()
    for name, digest in rec["sha256"].items():
        got = hashlib.sha256((folder / name).read_bytes()).hexdigest()
        if got != digest:
            raise CheckpointError(f"the package's pretrained toy model file {folder / name} has SHA-256 {got}, not "
                                  f"the recorded {digest}: the installation is damaged (reinstall the package), or "
                                  f"run `dsl-llada demo --from-scratch`")
    source = ModelSource(path=str(folder), device="cpu", dtype="float32")  # its tokenizer is built from the world
    backbone = open_model(source, chat_template=False, special=special, tokenizer_optional=True).model
    assert isinstance(backbone, LLaDABackbone)
    return backbone
