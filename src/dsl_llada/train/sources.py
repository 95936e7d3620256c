"""Where training text comes from: local files (.txt / .jsonl / .parquet) and tokenizer adapters."""

from __future__ import annotations

import glob
import json
import os
from collections.abc import Callable, Iterator, Mapping
from typing import Any

def make_encoder(tokenizer: Any) -> Callable[[list[str]], list[list[int]]]:
    """Batch encoder ``list[str] -> list[list[int]]`` without special tokens.

    Accepts a transformers tokenizer, a ``tokenizers.Tokenizer``, or a callable ``str -> ids``.
    """
    if callable(tokenizer) and hasattr(tokenizer, "eos_token_id"):  # transformers tokenizer
        return lambda texts: [list(x) for x in tokenizer(texts, add_special_tokens=False)["input_ids"]]
    if hasattr(tokenizer, "encode_batch"):  # tokenizers.Tokenizer
        return lambda texts: [e.ids for e in tokenizer.encode_batch(texts, add_special_tokens=False)]
    if callable(tokenizer):
        return lambda texts: [[int(t) for t in tokenizer(x)] for x in texts]
    raise TypeError(f"tokenizer must be a transformers tokenizer, a tokenizers.Tokenizer or a callable "
                    f"str -> token ids, got {type(tokenizer).__name__}")


def expand_files(patterns: list[str]) -> list[str]:
    """Glob patterns expanded and sorted; plain paths must exist; every file must be a regular file (a FIFO or
    device would block or never end)."""
    paths: list[str] = []
    for p in patterns:
        if glob.has_magic(p):
            hits = sorted(glob.glob(p))
            if not hits:
                raise FileNotFoundError(f"DataConfig.files pattern {p!r} matched no files")
            paths += hits
        elif not os.path.exists(p):
            raise FileNotFoundError(f"DataConfig.files: no such file {p!r}")
        else:
            paths.append(p)
    for p in paths:
        if not os.path.isfile(p):
            kind = "a folder" if os.path.isdir(p) else "not a regular file (a FIFO, device or socket)"
            raise ValueError(f"DataConfig.files: {p!r} is {kind}; training data must be regular .txt, .jsonl or "
                             f".parquet files")
    return paths


def read_file(path: str, txt_documents: str) -> Iterator[tuple[Any, str]]:
    """(record, "where") pairs from a .txt (paragraphs or whole file), .jsonl or .parquet file."""
    ext = os.path.splitext(path)[1].lower()
    if ext == ".parquet":
        try:
            import pyarrow.parquet as pq
        except ImportError:
            raise ImportError(f"reading {path!r} needs pyarrow: pip install pyarrow") from None
        row = 0
        for batch in pq.ParquetFile(path).iter_batches(batch_size=1024):
            for rec in batch.to_pylist():
                yield rec, f"{path} row {row}"
                row += 1
        return
    try:
        yield from _read_text_file(path, ext, txt_documents)
    except UnicodeDecodeError as e:
        raise ValueError(f"{path}: not UTF-8 text (byte {e.object[e.start:e.start + 1]!r}: {e.reason}); convert the "
                         f"file to UTF-8") from None


def _read_text_file(path: str, ext: str, txt_documents: str) -> Iterator[tuple[Any, str]]:
    with open(path, encoding="utf-8") as f:
        if ext == ".jsonl":
            for lineno, line in enumerate(f, 1):
                if line.strip():
                    try:
                        yield json.loads(line), f"{path} line {lineno}"
                    except json.JSONDecodeError as e:
                        raise ValueError(f"{path} line {lineno}: invalid JSON ({e.msg})") from None
        elif txt_documents == "file":
            yield f.read(), path
        else:  # blank-line-separated paragraphs
            para: list[str] = []
            start = 0
            for lineno, line in enumerate(f, 1):
                if line.strip():
                    start = start if para else lineno
                    para.append(line.rstrip("\r\n"))
                elif para:
                    yield "\n".join(para), f"{path} line {start}"
                    para = []
            if para:
                yield "\n".join(para), f"{path} line {start}"


def text_of(rec: Any, where: str, field: str) -> str:
    """The text of a record (a string, or a mapping holding `field`), with errors naming file and line."""
    if isinstance(rec, str):
        return rec
    if isinstance(rec, Mapping):
        if field not in rec:
            raise ValueError(f"{where}: missing text field {field!r} (keys present: {sorted(rec)[:20]}); "
                             f"set DataConfig.text_field")
        value = rec[field]
        if value is None or isinstance(value, str):
            return value or ""
        raise ValueError(f"{where}: text field {field!r} must be a string, got {type(value).__name__}")
    raise ValueError(f"{where}: expected a string or a dict with field {field!r}, got {type(rec).__name__}")
