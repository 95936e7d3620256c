"""Hugging Face-style checkpoint folders: config JSON + safetensors, sharded with an index when large.

Only safetensors is read or written (never pickle). Writes are atomic at the folder level: a crash leaves
either the previous folder or the complete new one.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

from ..errors import CheckpointError
from ..artifacts.atomic import file_mode

WEIGHTS_NAME = "model.safetensors"
INDEX_NAME = "model.safetensors.index.json"
DEFAULT_MAX_SHARD_BYTES = 5 * 1024**3
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "generation_config.json",
                   "chat_template.jinja", "tokenizer.model", "vocab.json", "merges.txt", "added_tokens.json")
"""Every file of a Hugging Face tokenizer folder that travels with a model (the chat template included: without
`chat_template.jinja` a prompt is silently encoded without its template)."""


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def _save(tensors: dict[str, torch.Tensor], path: Path) -> None:
    """save_file with the umask's file mode (safetensors creates 0600) and a full disk reported as an OSError
    naming the file (safetensors wraps it in its own exception type)."""
    try:
        save_file(tensors, str(path), metadata={"format": "pt"})
    except SafetensorError as e:
        path.unlink(missing_ok=True)
        import re

        m = re.search(r"os error (\d+)", str(e))
        code = int(m.group(1)) if m else errno.ENOSPC if "No space" in str(e) else errno.EIO
        raise OSError(code, os.strerror(code) if m or code == errno.ENOSPC else str(e), str(path)) from None
    os.chmod(path, file_mode())


save_tensors_file = _save
"""Public name of `_save`: one safetensors file, umask mode, a full disk as an OSError naming the file."""


@contextlib.contextmanager
def _reading(path: Path) -> Iterator[None]:
    """Turn safetensors' own errors (truncated, zero-byte or random files) into one CheckpointError naming the file."""
    try:
        yield
    except SafetensorError as e:
        size = path.stat().st_size if path.exists() else 0
        raise CheckpointError(f"{str(path)!r} is not a readable safetensors file ({size} bytes: {e}); it is truncated "
                              f"or damaged — copy, convert or download it again") from None


def write_safetensors(state: Mapping[str, torch.Tensor], folder: Path, *, max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES) -> list[str]:
    """Write tensors into `folder` (which must already exist); shards + index when larger than `max_shard_bytes`.

    Tensors sharing storage are written as separate copies (safetensors forbids aliasing). Returns file names.
    """
    tensors = {k: v.detach().contiguous().cpu() for k, v in state.items()}
    seen: dict[tuple[int, int], str] = {}
    for k, v in tensors.items():
        key = (v.untyped_storage().data_ptr(), int(v.storage_offset()))
        if key in seen:
            tensors[k] = v.clone()
        else:
            seen[key] = k
    total = sum(_nbytes(v) for v in tensors.values())
    if total <= max_shard_bytes:
        _save(tensors, folder / WEIGHTS_NAME)
        return [WEIGHTS_NAME]
    shards: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for k in sorted(tensors):
        v = tensors[k]
        if shards[-1] and size + _nbytes(v) > max_shard_bytes:
            shards.append({})
            size = 0
        shards[-1][k] = v
        size += _nbytes(v)
    n = len(shards)
    weight_map: dict[str, str] = {}
    names = []
    for i, shard in enumerate(shards, start=1):
        name = f"model-{i:05d}-of-{n:05d}.safetensors"
        _save(shard, folder / name)
        names.append(name)
        weight_map.update({k: name for k in shard})
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (folder / INDEX_NAME).write_text(json.dumps(index, indent=2, sort_keys=True) + "\n")
    return names


def copy_tokenizer_files(src: str | Path, dst: str | Path) -> list[str]:
    """Copy the tokenizer files (`TOKENIZER_FILES`) present in folder `src` into the existing folder `dst`.
    Returns the names copied (none when `src` is not a folder)."""
    src, dst = Path(src), Path(dst)
    copied = []
    if src.is_dir():
        for name in TOKENIZER_FILES:
            if (src / name).is_file():
                shutil.copyfile(src / name, dst / name)
                copied.append(name)
    return copied


def _hub_blobs(folder: Path) -> Path | None:
    """The `blobs/` folder of a Hugging Face cache repository when `folder` is one of its snapshots (whose files
    are symlinks into it), else None."""
    blobs = folder.parent.parent / "blobs"
    return blobs.resolve() if folder.parent.name == "snapshots" and blobs.is_dir() else None


def confined_file(folder: Path, name: object, where: str) -> Path:
    """`folder / name` for a checkpoint file named in `where` (an index or config), refused unless it is a plain
    file name of a regular file inside `folder`: no `..`, absolute paths, sub-folders, devices, FIFOs, or
    symlinks leading out of the folder (a Hugging Face cache snapshot's links into its own `blobs/` excepted)."""
    if not isinstance(name, str) or not name or name != Path(name).name or name in (".", ".."):
        raise CheckpointError(f"{where} names the file {name!r}; checkpoint files must be plain file names inside "
                              f"{str(folder)!r} (no folders, '..' or absolute paths)")
    path = folder / name
    real, root = path.resolve(), folder.resolve()
    if real.parent != root and not ((blobs := _hub_blobs(folder)) is not None and real.parent == blobs):
        raise CheckpointError(f"{str(path)!r} (named in {where}) is a link to {str(real)!r}, outside the model "
                              f"folder; copy the file into the folder instead")
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        raise CheckpointError(f"{str(path)!r} (named in {where}) is missing") from None
    import stat

    if not stat.S_ISREG(mode):
        raise CheckpointError(f"{str(path)!r} (named in {where}) is not a regular file (a device, FIFO or folder); "
                              f"checkpoint files must be ordinary files")
    return path


def check_safetensors_header(path: Path, *, advice: str = "copy, convert or download it again") -> None:
    """Raise CheckpointError unless `path` is a complete safetensors file: its header parses and the tensor data it
    describes fits the file exactly (a truncated file fails here, before anything is loaded). `advice` ends the
    message (what the user can do about a damaged file of this kind)."""
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            head = f.read(8)
            n = int.from_bytes(head, "little") if len(head) == 8 else -1
            if n < 2 or 8 + n > size or n > 100 * 1024**2:
                raise ValueError("no valid header")
            header = json.loads(f.read(n))
        ends = [v["data_offsets"][1] for k, v in header.items() if k != "__metadata__"]
        if 8 + n + max(ends, default=0) != size:
            raise ValueError(f"the header describes {8 + n + max(ends, default=0)} bytes")
    except (ValueError, KeyError, TypeError, IndexError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{str(path)!r} is not a readable safetensors file ({size} bytes: {e}); it is truncated "
                              f"or damaged — {advice}") from None


class CheckpointFolder:
    """A model folder opened for loading, each file read once: the tensor map (the index, or the single weights
    file's header), `config.json` and any other JSON file are parsed on first use and kept, and each safetensors
    file stays open from its header read to its last tensor. Loaders take one of these in place of a folder path
    and pass it down, so opening a model reads each of its files once; it converts to the folder's path
    (`os.fspath`) for code that wants a path. Use it as a context manager (or call `close`) to release the files."""

    def __init__(self, folder: str | Path):
        self.path = Path(folder)
        self._files: dict[str, Path] | None = None
        self._json: dict[str, dict[str, Any]] = {}
        self._raw: dict[str, bytes | None] = {}
        self._handles: dict[Path, Any] = {}

    def __fspath__(self) -> str:
        return str(self.path)

    def __repr__(self) -> str:
        return f"CheckpointFolder({str(self.path)!r})"

    def __enter__(self) -> "CheckpointFolder":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Release the safetensors files held open (what was parsed stays readable)."""
        handles, self._handles = self._handles, {}
        for h in handles.values():
            h.__exit__(None, None, None)

    def json(self, name: str, what: str) -> dict[str, Any]:
        """The JSON object in file `name` of the folder (`read_json`'s checks), read on first use."""
        if name not in self._json:
            self._json[name] = read_json(self.path / name, what)
        return self._json[name]

    def raw(self, name: str) -> bytes | None:
        """The bytes of file `name` of the folder (None when it is not a file there), read on first use: the
        tokenizer files that the tokenizer check and the special-token lookup both parse."""
        if name not in self._raw:
            path = self.path / name
            self._raw[name] = path.read_bytes() if path.is_file() else None
        return self._raw[name]

    def config(self) -> dict[str, Any]:
        """The backbone's `config.json`, read on first use."""
        return self.json("config.json", "model config")

    def _handle(self, path: Path) -> Any:
        if path not in self._handles:
            with _reading(path):
                self._handles[path] = safe_open(str(path), framework="pt")
        return self._handles[path]

    @property
    def files(self) -> dict[str, Path]:
        """Every tensor name -> the safetensors file holding it (every file confined to the folder: see
        `confined_file`)."""
        if self._files is None:
            self._files = self._tensor_map()
        return self._files

    def _tensor_map(self) -> dict[str, Path]:
        folder = self.path
        if not folder.is_dir():
            raise CheckpointError(f"checkpoint folder {str(folder)!r} does not exist")
        index = folder / INDEX_NAME
        if index.exists():
            confined_file(folder, INDEX_NAME, "the model folder")
            weight_map = self.json(INDEX_NAME, "weight index").get("weight_map")
            if not isinstance(weight_map, dict):
                raise CheckpointError(f"{index} has no 'weight_map' object")
            files = {v: confined_file(folder, v, str(index)) for v in set(weight_map.values()) if isinstance(v, str)}
            bad = [v for v in weight_map.values() if not isinstance(v, str)]
            if bad:
                confined_file(folder, bad[0], str(index))
            return {k: files[v] for k, v in weight_map.items()}
        single = folder / WEIGHTS_NAME
        if single.exists() or single.is_symlink():
            single = confined_file(folder, WEIGHTS_NAME, "the model folder")
            with _reading(single):
                return {k: single for k in self._handle(single).keys()}
        found = sorted(p.name for p in folder.iterdir())
        hint = " (.bin/.pt pickles are not loaded: convert them to safetensors)" if any(
            n.endswith((".bin", ".pt", ".pth")) for n in found) else ""
        raise CheckpointError(f"no {WEIGHTS_NAME} or {INDEX_NAME} in {str(folder)!r}; found {found[:10]}{hint}")

    def read_tensors(self, names: Iterable[str] | None = None, *, dtype: torch.dtype | None = None,
                     device: str | torch.device = "cpu") -> dict[str, torch.Tensor]:
        """Read (a subset of) the folder's tensors onto `device`, optionally casting floating tensors to `dtype`."""
        files = self.files
        wanted = list(files) if names is None else list(names)
        missing = [k for k in wanted if k not in files]
        if missing:
            raise CheckpointError(f"checkpoint {str(self.path)!r} lacks tensor(s) {missing[:5]}")
        by_file: dict[Path, list[str]] = {}
        for k in wanted:
            by_file.setdefault(files[k], []).append(k)
        out: dict[str, torch.Tensor] = {}
        on_cpu = torch.device(device).type == "cpu"
        for path, keys in by_file.items():
            f = self._handle(path)
            with _reading(path):
                for k in keys:
                    t = f.get_tensor(k) if on_cpu else f.get_tensor(k).to(device)
                    if dtype is not None and t.is_floating_point():
                        t = t.to(dtype)
                    out[k] = t
        return out


@contextlib.contextmanager
def opened(folder: str | Path | CheckpointFolder) -> Iterator[CheckpointFolder]:
    """`folder` itself when it is already a `CheckpointFolder` (its owner closes it), else a new one closed on
    exit."""
    if isinstance(folder, CheckpointFolder):
        yield folder
        return
    with CheckpointFolder(folder) as ckpt:
        yield ckpt


def checkpoint_files(folder: str | Path | CheckpointFolder) -> dict[str, Path]:
    """Map every tensor name of a checkpoint folder to the safetensors file holding it (every file confined to the
    folder: see `confined_file`)."""
    with opened(folder) as ckpt:
        return ckpt.files


def read_tensors(folder: str | Path | CheckpointFolder, names: Iterable[str] | None = None, *,
                 dtype: torch.dtype | None = None, device: str | torch.device = "cpu") -> dict[str, torch.Tensor]:
    """Read (a subset of) the tensors of a checkpoint folder, optionally casting floating tensors to `dtype`."""
    with opened(folder) as ckpt:
        return ckpt.read_tensors(names, dtype=dtype, device=device)


def read_json(path: Path, what: str) -> dict[str, Any]:
    if not path.exists():
        raise CheckpointError(f"{what} {str(path)!r} is missing")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{what} {str(path)!r} is not valid JSON: {e}") from None
    if not isinstance(data, dict):
        raise CheckpointError(f"{what} {str(path)!r} must hold a JSON object")
    return data


def check_keys(expected: Iterable[str], found: Iterable[str], where: str, *, optional: Iterable[str] = ()) -> None:
    """Raise one clear error when a checkpoint has unknown keys or lacks required ones."""
    exp, got, opt = set(expected), set(found), set(optional)
    unknown = sorted(got - exp - opt)
    missing = sorted(exp - got)
    if unknown or missing:
        parts = []
        if unknown:
            parts.append(f"unknown key(s) {unknown[:5]}{' ...' if len(unknown) > 5 else ''}")
        if missing:
            parts.append(f"missing key(s) {missing[:5]}{' ...' if len(missing) > 5 else ''}")
        raise CheckpointError(f"unrecognised checkpoint layout in {where}: " + "; ".join(parts))
