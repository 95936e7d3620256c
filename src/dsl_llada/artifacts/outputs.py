"""Output folders that never cost the user anything: check a destination before the long work starts.

Every command that writes a folder calls `prepare_output_dir` first (convert, train's output_dir, demo --out;
eval should too):

    from dsl_llada.artifacts.outputs import prepare_output_dir
    prepare_output_dir(a.output, overwrite=a.overwrite, sources=[a.backbone], kind="checkpoint")          # replaces
    prepare_output_dir(config.output_dir, overwrite=False, kind="training run", reuse=True)              # continues

The rules (each refusal is an `OutputError`, a ValueError, so the CLI prints one `error: ...` line, exit 2):

1. never the source itself, nor a folder that contains a source (writing there would replace the input) —
   refused even with ``overwrite``; a path *inside* a source is refused unless ``overwrite``;
2. an existing non-folder (a regular file, a socket, ...) is refused, even with ``overwrite``;
3. a missing or empty folder is fine;
4. a non-empty folder must be one of ours, of this `kind`, recognised by its files (`is_own_artifact`):
   with ``reuse=True`` (the command continues or updates it: train resume, the demo's cache) it is accepted;
   otherwise it is accepted only with ``overwrite`` (the writer then replaces it atomically). A folder holding
   anything we did not write (`unknown_entries`) is refused even with ``overwrite``, naming what it holds;
5. a path that is (or passes through) a symbolic link loop is refused: it can never be a folder;
6. the destination must be writable: a temp file is created and removed in the folder (or its nearest existing
   ancestor), so `/proc/x` or a read-only mount fails here, not after an hour of work.

Nothing here deletes anything: replacing an accepted folder is the writer's job (`atomic.atomic_directory`, which
itself refuses to replace a folder `is_own_artifact(path, "model")` does not recognise).

Kinds are registered with `register_kind(name, marker=..., allowed=...)`: `marker(folder) -> bool` says "this is
one of ours", `allowed` is a regex every entry name must match for the folder to be replaceable (None = reuse
only; such a folder is never replaced). Built in: "checkpoint" (a DSL checkpoint as convert writes it), "model"
(any model folder we write: backbone or DSL, optional tokenizer files), "training run", "demo".
"""

from __future__ import annotations

import errno
import os
import re
import tempfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

__all__ = ["ArtifactKind", "OutputError", "check_writable", "is_own_artifact", "prepare_output_dir", "register_kind",
           "resolve_output", "unknown_entries"]


class OutputError(ValueError):
    """A destination that would cost the user something (their files, their input) or cannot be written."""


@dataclass(frozen=True)
class ArtifactKind:
    """How to recognise a folder this package wrote."""

    name: str
    """Human name used in messages ("checkpoint", "training run", ...)."""
    marker: Callable[[Path], bool]
    """True when the folder carries this kind's identifying file(s)."""
    allowed: re.Pattern[str] | None
    """Every entry name of a replaceable folder matches this; None = never replaced (reuse only)."""


_TOKENIZER = r"tokenizer\.json|tokenizer_config\.json|special_tokens_map\.json|generation_config\.json|" \
             r"chat_template\.jinja|tokenizer\.model|vocab\.json|merges\.txt|added_tokens\.json"
_WEIGHTS = r"model\.safetensors|model-\d+-of-\d+\.safetensors|model\.safetensors\.index\.json"
_MODEL_ALLOWED = re.compile(rf"^(config\.json|dsl_config\.json|{_WEIGHTS}|{_TOKENIZER}|loss_curve\.json|checksums\.json)$")


def _has_weights(p: Path) -> bool:
    return (p / "model.safetensors").is_file() or (p / "model.safetensors.index.json").is_file()


_KINDS: dict[str, ArtifactKind] = {}


def register_kind(name: str, *, marker: Callable[[Path], bool], allowed: str | re.Pattern[str] | None) -> ArtifactKind:
    """Register (or replace) an artifact kind for `prepare_output_dir(kind=name)`."""
    kind = ArtifactKind(name, marker, re.compile(allowed) if isinstance(allowed, str) else allowed)
    _KINDS[name] = kind
    return kind


register_kind("checkpoint", allowed=_MODEL_ALLOWED,
              marker=lambda p: (p / "config.json").is_file() and (p / "dsl_config.json").is_file() and _has_weights(p))
register_kind("model", allowed=_MODEL_ALLOWED, marker=lambda p: (p / "config.json").is_file())
register_kind("training run", allowed=None,
              marker=lambda p: (p / "train_config.json").is_file() or any(
                  re.match(r"^checkpoint-\d+$", e.name) for e in p.iterdir()))
register_kind("demo", allowed=None, marker=lambda p: (p / "cache").is_dir() or (p / "report.md").is_file())


def _kind(name: str) -> ArtifactKind:
    if name not in _KINDS:
        raise ValueError(f"kind={name!r} is not a registered artifact kind; expected one of {sorted(_KINDS)}")
    return _KINDS[name]


def unknown_entries(folder: str | Path, kind: str) -> list[str]:
    """Entry names of `folder` that a replaceable artifact of `kind` never holds (all of them when the kind is
    reuse-only or the folder lacks the kind's marker)."""
    folder, k = Path(folder), _kind(kind)
    names = sorted(e.name + ("/" if e.is_dir() else "") for e in folder.iterdir())
    if k.allowed is None or not k.marker(folder):
        return names
    return [n for n in names if n.endswith("/") or not k.allowed.match(n)]


def is_own_artifact(folder: str | Path, kind: str, *, replaceable: bool = True) -> bool:
    """True when `folder` is a folder of `kind` we wrote (marker present; with `replaceable`, nothing else in it)."""
    folder = Path(folder)
    if not folder.is_dir() or folder.is_symlink():
        return False
    k = _kind(kind)
    if not k.marker(folder):
        return False
    return not replaceable or (k.allowed is not None and not unknown_entries(folder, kind))


def _within(inner: Path, outer: Path) -> bool:
    return inner == outer or outer in inner.parents


def resolve_output(path: str | Path, *, what: str = "output") -> Path:
    """The absolute path `path` names with every symbolic link followed (a missing path is fine). Raises
    OutputError when a link on the way leads back to itself (a link loop, or a chain too long to follow): no folder
    can ever be created there, and every command says so the same way."""
    try:
        return Path(os.path.abspath(path)).resolve()
    except RuntimeError:  # Python before 3.13: "Symlink loop from ..."
        pass
    except OSError as e:
        if e.errno != errno.ELOOP:
            raise
    raise OutputError(f"{what} {str(path)!r} goes through a symbolic link loop (a link that leads back to itself), "
                      f"so no folder can be made there; remove the link or choose another path")


def check_writable(path: str | Path, *, what: str = "output") -> None:
    """Raise OutputError unless a file can be created in `path` (a folder) or, when it does not exist yet, in its
    nearest existing ancestor. Leaves nothing behind."""
    path = Path(path).absolute()
    probe_dir = path
    while not probe_dir.exists():
        if probe_dir.parent == probe_dir:
            break
        probe_dir = probe_dir.parent
    if not probe_dir.is_dir():
        raise OutputError(f"{what} {str(path)!r} cannot be created: {str(probe_dir)!r} is a file, not a folder; "
                          f"choose another path")
    try:
        fd, tmp = tempfile.mkstemp(dir=probe_dir, prefix=".dsl-llada-write-test.", suffix=".tmp")
    except OSError as e:
        raise OutputError(f"{what} {str(path)!r} is not writable ({e.strerror or e} in {str(probe_dir)!r}); "
                          f"choose a folder you can write to") from None
    os.close(fd)
    os.unlink(tmp)


def prepare_output_dir(path: str | Path, *, overwrite: bool = False, sources: Iterable[str | Path | None] = (),
                       kind: str = "checkpoint", reuse: bool = False, what: str = "output folder") -> Path:
    """Check that the folder `path` may receive an artifact of `kind` (see the module docstring for the rules).

    `sources`: the command's inputs (folders or files; None entries are ignored). `overwrite`: the user's
    --overwrite. `reuse`: the command continues an existing artifact of this kind instead of replacing it.
    Returns the absolute path. Creates and deletes nothing (except a probe file). Raises OutputError.
    """
    k = _kind(kind)
    raw = Path(path)
    out = Path(os.path.abspath(raw))
    real = resolve_output(raw, what=what)
    if out.is_symlink() and real.is_dir():  # a link to a folder is judged (and written) as the folder it names
        out = real
    for s in sources:
        if s is None:
            continue
        src = Path(s).resolve()
        if _within(src, real):
            rel = "is" if src == real else "contains"
            raise OutputError(f"{what} {str(raw)!r} {rel} the input {str(s)!r}; writing there would replace it — "
                              f"choose another {what}")
        if _within(real, src) and not overwrite:
            raise OutputError(f"{what} {str(raw)!r} is inside the input {str(s)!r}; choose a folder outside it "
                              f"(or pass --overwrite to write into the input folder anyway)")
    if out.exists() or out.is_symlink():
        if not out.is_dir():
            raise OutputError(f"{what} {str(raw)!r} exists and is not a folder; it is left alone even with "
                              f"--overwrite — remove it yourself or choose another path")
        entries = list(out.iterdir())
        if entries:
            if is_own_artifact(out, kind, replaceable=False) and (reuse or is_own_artifact(out, kind)):
                if not reuse and not overwrite:
                    raise OutputError(f"{what} {str(raw)!r} already holds a {k.name}; pass --overwrite to replace "
                                      f"it, or choose another {what}")
            else:
                unknown = unknown_entries(out, kind)
                shown = ", ".join(unknown[:3]) + (f" and {len(unknown) - 3} more" if len(unknown) > 3 else "")
                even = ", even with --overwrite" if k.allowed is not None else ""
                raise OutputError(f"{what} {str(raw)!r} is not empty and is not a {k.name} written by dsl-llada "
                                  f"(it holds {shown}); nothing there is replaced{even} — choose a new or empty folder")
    check_writable(out, what=what)
    return out
