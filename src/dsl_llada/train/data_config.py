"""DataConfig: where the training data comes from and how it becomes blocks (frozen, validated, JSON round trip).

The pipeline it configures is described in :mod:`dsl_llada.train.data`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from ..config import ConfigBase, _check, _choice
from .toy_config import ToyWorldData

__all__ = ["DataConfig", "FILE_TYPES", "FORMATS", "SFT_OVERFLOW", "SUBSETS", "TXT_DOCUMENTS"]

FORMATS = ("text", "sft")
FILE_TYPES = (".txt", ".jsonl", ".parquet")
TXT_DOCUMENTS = ("paragraph", "file")
SUBSETS = ("train", "validation")
SFT_OVERFLOW = ("error", "truncate")


def _is_int(v: Any) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, bool)


@dataclass(frozen=True)
class DataConfig(ConfigBase):
    """Where the data comes from and how it becomes training blocks.

    Exactly one source: ``source`` (a Hugging Face dataset id), ``files`` (local paths/globs), ``toy_world`` (the
    embedded toy world's conversations), or ``texts=`` given to the dataset/loader.
    """

    source: str | None = None
    """Hugging Face dataset id (e.g. "HuggingFaceFW/fineweb-edu", the paper's corpus); needs the `datasets` package."""
    dataset_config: str | None = None
    """The dataset's configuration name (e.g. "sample-10BT")."""
    split: str = "train"
    """Dataset split to read."""
    streaming: bool = True
    """Stream the Hugging Face dataset instead of downloading it whole."""
    files: tuple[str, ...] | None = None
    """Local .txt / .jsonl / .parquet files or glob patterns (expanded and sorted), read in the given order."""
    text_field: str = "text"
    """Record field holding the document text (.jsonl / .parquet / dataset records)."""
    txt_documents: str = "paragraph"
    """.txt files: 'paragraph' = blank-line-separated paragraphs are documents; 'file' = each file is one document."""
    format: str = "text"
    """'text' (continued pretraining: documents packed into blocks) or 'sft' (one conversation per block)."""
    block_size: int = 2048
    """Tokens per training block (paper: 2,048)."""
    max_context: int | None = None
    """The model's context length, when known: block_size must not exceed it."""
    insert_eos_separator: bool = True
    """Append EOS after every document; False reproduces the reference packing (documents concatenated)."""
    drop_remainder: bool = True
    """Drop the final partial block (False: EOS-pad it)."""
    shuffle_buffer: int = 10_000
    """Per-rank buffer shuffle of blocks (<= 1 disables shuffling)."""
    seed: int = 0
    """Seed of the shuffle (combined with epoch and rank)."""
    repeat: bool = False
    """Loop over the data forever, reshuffling each epoch."""
    validation_every: int | None = None
    """Hold out document i when i % validation_every == 0 (100 = the 'i mod 100' rule); None = no hold-out."""
    subset: str = "train"
    """Which side of the `validation_every` hold-out to read: 'train' or 'validation'."""
    sft_overflow: str = "error"
    """SFT only: a conversation longer than block_size is an 'error' or is 'truncate'd."""
    sft_response_suffix: str = ""
    """SFT only: text appended to every response (e.g. an end-of-turn token)."""
    toy_world: ToyWorldData | None = None
    """Train on the embedded toy world's conversations (`ToyWorldData`: seed, n_topics, max_sentences, gen_length,
    n_train) with its own tokenizer; needs format='sft'. The only source `eval_bayes_floor` accepts."""

    _nested: ClassVar[dict[str, type[ConfigBase]]] = {"toy_world": ToyWorldData}

    def __post_init__(self) -> None:
        if isinstance(self.toy_world, dict):
            object.__setattr__(self, "toy_world", ToyWorldData.from_dict(self.toy_world))
        _check(self.toy_world is None or isinstance(self.toy_world, ToyWorldData),
               f"DataConfig.toy_world must be a mapping of toy-world settings or None, got {self.toy_world!r}")
        _choice("DataConfig.format", self.format, FORMATS)
        _choice("DataConfig.txt_documents", self.txt_documents, TXT_DOCUMENTS)
        _choice("DataConfig.subset", self.subset, SUBSETS)
        _choice("DataConfig.sft_overflow", self.sft_overflow, SFT_OVERFLOW)
        for name in ("streaming", "insert_eos_separator", "drop_remainder", "repeat"):
            _check(isinstance(getattr(self, name), bool), f"DataConfig.{name}={getattr(self, name)!r} must be true or false")
        _check(_is_int(self.block_size) and self.block_size >= 2,
              f"DataConfig.block_size must be an int >= 2, got {self.block_size!r}")
        if self.max_context is not None:
            _check(_is_int(self.max_context) and self.max_context >= 2,
                  f"DataConfig.max_context must be None or an int >= 2, got {self.max_context!r}")
            _check(self.block_size <= self.max_context, f"DataConfig.block_size={self.block_size} exceeds "
                  f"max_context={self.max_context}; use block_size <= {self.max_context}")
        _check(_is_int(self.shuffle_buffer) and self.shuffle_buffer >= 0,
              f"DataConfig.shuffle_buffer must be an int >= 0, got {self.shuffle_buffer!r}")
        _check(_is_int(self.seed) and self.seed >= 0, f"DataConfig.seed must be an int >= 0, got {self.seed!r}")
        _check(self.validation_every is None or (_is_int(self.validation_every) and self.validation_every >= 2),
              f"DataConfig.validation_every must be None or an int >= 2, got {self.validation_every!r}")
        _check(self.subset != "validation" or self.validation_every is not None,
              "DataConfig.subset='validation' needs validation_every (e.g. 100); got None")
        _check(isinstance(self.text_field, str) and bool(self.text_field),
              f"DataConfig.text_field must be a non-empty string, got {self.text_field!r}")
        _check(isinstance(self.sft_response_suffix, str),
              f"DataConfig.sft_response_suffix must be a string, got {self.sft_response_suffix!r}")
        files = self.files
        if isinstance(files, (str, os.PathLike)):
            files = [files]
        if files is not None:
            _check(isinstance(files, (list, tuple)) and all(isinstance(f, (str, os.PathLike)) for f in files),
                   f"DataConfig.files must be a path or a list of paths (or glob patterns), got {files!r}")
            files = tuple(os.fspath(f) for f in files)
            _check(bool(files), "DataConfig.files is an empty list; give at least one path or use None")
            object.__setattr__(self, "files", files)
        _check(self.source is None or files is None,
              f"DataConfig: give either source={self.source!r} (HF dataset id) or files, not both")
        _check(self.source is None or (isinstance(self.source, str) and bool(self.source.strip())),
              f"DataConfig.source must be a Hugging Face dataset id string, got {self.source!r}")
        if self.toy_world is not None:
            _check(self.source is None and files is None,
                   f"DataConfig: give either toy_world or source={self.source!r} / files={files!r}, not both")
            _check(self.format == "sft", f"DataConfig.format={self.format!r} is not valid with toy_world: the toy "
                                         f"world's conversations are SFT blocks; set format='sft'")
        for f in files or ():
            ext = os.path.splitext(f)[1].lower()
            _check(ext in FILE_TYPES, f"DataConfig.files: unsupported file type {ext or '(none)'!r} for {f!r}; "
                  f"valid: {list(FILE_TYPES)}")
            _check(ext != ".txt" or self.format != "sft",
                  f"DataConfig.files: format='sft' needs structured records (.jsonl/.parquet), got {f!r}")
