"""What a cached or resumed result depends on, as short hashes: the weights, the tokenizer and the code that
samples. Caches and resumable runs key on these (with the sampler config), not on a config or a path alone, so a
retrained checkpoint at the same path, another tokenizer or a change of the sampling code is never mixed with
results made before it.
"""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

__all__ = ["CODE_PARTS", "code_fingerprint", "files_fingerprint", "folder_fingerprints", "sampling_key",
           "tokenizer_fingerprint", "tokenizer_object_fingerprint", "weights_fingerprint"]

CODE_PARTS = ("sampling", "core/backbones", "core/converter.py", "core/model.py", "snr.py", "core/numerics.py", "config.py",
              "generate/generation.py", "core/checkpoint.py", "core/loading.py")
"""The package parts that decide which tokens a sampler writes (a change elsewhere, e.g. the CLI or the reports,
does not invalidate cached samples)."""

_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.json", "vocab.txt",
                    "merges.txt", "tokenizer.model", "added_tokens.json", "chat_template.jinja", "chat_template.json")
_CHUNK = 1 << 20


def files_fingerprint(paths: Iterable[Path], root: Path | None = None) -> str:
    """sha256 (16 hex) over the files' names (relative to `root`) and contents, in name order."""
    h = hashlib.sha256()
    for p in sorted(Path(x) for x in paths):
        h.update(str(p.relative_to(root) if root is not None else p.name).encode())
        h.update(b"\0")
        with open(p, "rb") as f:
            for chunk in iter(lambda: f.read(_CHUNK), b""):
                h.update(chunk)
        h.update(b"\0")
    return h.hexdigest()[:16]


def weights_fingerprint(folder: str | Path) -> str | None:
    """Hash of a checkpoint folder's weight files (*.safetensors, *.gguf, *.bin); None when it has none."""
    folder = Path(folder)
    files = [p for ext in ("*.safetensors", "*.gguf", "*.bin") for p in folder.glob(ext) if p.is_file()]
    return files_fingerprint(files, folder) if files else None


def tokenizer_fingerprint(folder: str | Path) -> str | None:
    """Hash of a folder's tokenizer files (vocabulary, merges, special tokens, chat template); None when none."""
    folder = Path(folder)
    files = [folder / n for n in _TOKENIZER_FILES if (folder / n).is_file()]
    return files_fingerprint(files, folder) if files else None


def folder_fingerprints(model: str | Path, tokenizer: str | Path | None = None) -> dict[str, Any]:
    """{'weights', 'tokenizer'} of a model folder (and its tokenizer folder, default the same)."""
    return {"weights": weights_fingerprint(model), "tokenizer": tokenizer_fingerprint(tokenizer or model)}


@functools.lru_cache(maxsize=1)
def code_fingerprint() -> str:
    """Package version + hash of the source of `CODE_PARTS` (the code that decides sampled tokens)."""
    from .. import __version__

    root = Path(__file__).resolve().parents[1]  # the package root: CODE_PARTS are relative to it
    files = [p for part in CODE_PARTS for p in ((root / part).rglob("*.py") if (root / part).is_dir() else [root / part])
             if p.is_file()]
    return f"{__version__}+{files_fingerprint(files, root)}"


def tokenizer_object_fingerprint(tokenizer: Any) -> str:
    """Hash of an in-memory tokenizer: its vocabulary with ids, special tokens and chat template."""
    vocab = sorted(tokenizer.get_vocab().items(), key=lambda kv: kv[1])
    payload = {"vocab": vocab, "special": sorted(str(t) for t in getattr(tokenizer, "all_special_tokens", [])),
               "chat_template": getattr(tokenizer, "chat_template", None)}
    return hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()[:16]


def sampling_key(weights_id: str, tokenizer: Any) -> dict[str, str]:
    """The part of a cached sample's key that is not its sampler config: weights, tokenizer and code."""
    return {"weights": weights_id, "tokenizer": tokenizer_object_fingerprint(tokenizer), "code": code_fingerprint()}
