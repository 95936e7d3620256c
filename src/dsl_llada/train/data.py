"""Training data: documents -> tokens -> fixed blocks, rank-sharded, shuffled, exactly resumable.

Pipeline (``format="text"``, continued pretraining)::

    records (HF dataset | local files | in-memory texts)
      -> optional validation hold-out: document i is held out iff i % validation_every == 0
         (validation_every=100 is the "i mod 100" rule); i counts *all* source records
      -> tokenise each document with add_special_tokens=False (no BOS/EOS inside documents)
      -> append the EOS id after every document (insert_eos_separator=True; False reproduces
         the reference packing, which concatenates documents with no separator)
      -> pack into blocks of block_size; the remainder carries over into the next document
         (never dropped per group); the final partial block is dropped (drop_remainder=True)
         or EOS-padded
      -> global block j goes to rank j % world_size (disjoint, covering)
      -> per-rank buffer shuffle (shuffle_buffer, numpy Generator seeded by (seed, epoch, rank))
      -> {"input_ids": LongTensor[block_size]}

Note the shuffle acts on *blocks after sharding* (the reference shuffles documents in the
HF stream with a 10,000 buffer); with a 10,000-block buffer each rank tokenises about
``shuffle_buffer * world_size`` blocks before yielding its first one.

``format="sft"``: one conversation per block, see :mod:`dsl_llada.train.sft`; output adds
``prompt_length``; conversations (not blocks) are dealt round-robin to ranks. ``toy_world``: the
embedded toy world's conversations, already in blocks (from the world registered in
:mod:`dsl_llada.train.world_source`), dealt and shuffled the same way.

Local files: ``.txt`` (documents are blank-line-separated paragraphs by default,
``txt_documents="file"`` makes each file one document), ``.jsonl`` (one JSON object per
line, text in ``text_field``), ``.parquet`` (needs pyarrow).  Files are read in the
given order (glob patterns expanded and sorted).

Resume: :meth:`TokenBlockDataset.state_dict` snapshots the exact position -- source record
index, carried-over tokens, the shuffle buffer's contents and the RNG state -- so a fresh
dataset given ``load_state_dict(state)`` yields exactly what an uninterrupted run would
yield next.  Trade-off versus "regenerate and skip n blocks": the state holds the buffer
(``shuffle_buffer * block_size`` int32, ~82 MB per rank at 10,000 x 2048), but resuming
only re-reads (never re-tokenises) the consumed records.  The state only contains tensors
and plain Python values, so ``torch.load(weights_only=True)`` accepts it.  Iterating again
without a pending ``load_state_dict`` restarts from the beginning.  Keep ``num_workers=0``
and do not pass the loader through ``accelerator.prepare`` (it re-shards/dispatches
iterable datasets and prefetches a batch ahead, which would shift the saved position).
"""

from __future__ import annotations

import copy
import itertools
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from .data_config import DataConfig
from .sft import RenderPrompt, build_sft_example, normalize_sft_record
from .sources import expand_files, make_encoder, read_file, text_of

__all__ = ["DataConfig", "TokenBlockDataset", "make_encoder", "collate_blocks", "make_dataloader"]

_STATE_VERSION = 1
_ENCODE_CHUNK = 64  # documents per batched tokenizer call (does not affect the output)
Item = tuple[np.ndarray, int]  # (block ids int32, prompt_length or -1)


def _is_int(v: Any) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, bool)


class TokenBlockDataset(IterableDataset):
    """Resumable, rank-sharded stream of fixed-length training blocks (see module docstring).

    ``eos_id`` defaults to ``tokenizer.eos_token_id``; it is required for the EOS separator,
    EOS padding of a final partial block, and SFT padding.  ``render_prompt`` (SFT only)
    overrides the tokenizer's chat template.  One live iterator per object.
    """

    def __init__(self, config: DataConfig | Mapping[str, Any], tokenizer: Any, *, rank: int = 0, world_size: int = 1,
                 texts: Iterable[Any] | None = None, eos_id: int | None = None,
                 render_prompt: RenderPrompt | None = None) -> None:
        if not _is_int(world_size) or world_size < 1:
            raise ValueError(f"world_size must be an int >= 1, got {world_size!r}")
        if not _is_int(rank) or not 0 <= rank < world_size:
            raise ValueError(f"rank must be an int in [0, {world_size - 1}] for world_size={world_size}, got {rank!r}")
        if isinstance(config, Mapping):
            config = DataConfig.from_dict(dict(config))
        self.config, self.tokenizer, self.rank, self.world_size = config, tokenizer, int(rank), int(world_size)
        self.render_prompt = render_prompt
        self._encode = make_encoder(tokenizer)
        self.eos_id = eos_id if eos_id is not None else getattr(tokenizer, "eos_token_id", None)
        if self.eos_id is None and (config.format == "sft" or config.insert_eos_separator or not config.drop_remainder):
            why = ("format='sft' (EOS padding)" if config.format == "sft" else "insert_eos_separator=True"
                   if config.insert_eos_separator else "drop_remainder=False (EOS padding)")
            raise ValueError(f"no EOS id: the tokenizer has no eos_token_id and eos_id was not given, but {why} "
                             f"needs one; pass eos_id=... or set the tokenizer's eos_token")
        if self.eos_id is not None and (not _is_int(self.eos_id) or self.eos_id < 0):
            raise ValueError(f"eos_id must be a non-negative int, got {self.eos_id!r}")
        self.eos_id = None if self.eos_id is None else int(self.eos_id)
        given = [n for n, v in (("texts=", texts), ("DataConfig.source", config.source),
                                ("DataConfig.files", config.files), ("DataConfig.toy_world", config.toy_world))
                 if v is not None]
        if len(given) != 1:
            raise ValueError(f"give exactly one data source (DataConfig.source = HF dataset id, DataConfig.files "
                             f"= local .txt/.jsonl/.parquet, DataConfig.toy_world, or texts= list of strings/records); "
                             f"got {given or 'none'}")
        if isinstance(texts, (str, bytes)):
            raise ValueError("texts= must be a list of documents (strings or records), got a single string")
        self._texts = None if texts is None else list(texts)
        self._files = expand_files(config.files) if config.files is not None else None
        self._toy: tuple[torch.Tensor, torch.Tensor] | None = None
        if config.toy_world is not None:  # the conversations, already in blocks (the registered world)
            from .world_source import world_training

            self._toy = world_training().corpus(config.toy_world).blocks(config.block_size)
        self._resume_pending = False
        self._reset(0)

    # ------------------------------------------------------------------ source
    def _describe(self) -> str:
        if self._toy is not None:
            return f"the toy world ({self._toy[0].shape[0]} conversations)"
        if self._texts is not None:
            return f"texts= ({len(self._texts)} records)"
        return f"files {self._files}" if self._files is not None else f"HF dataset {self.config.source!r}"

    def _records(self) -> Iterator[tuple[Any, str]]:
        cfg = self.config
        if self._toy is not None:
            yield from ((i, f"toy world conversation {i}") for i in range(self._toy[0].shape[0]))
        elif self._texts is not None:
            yield from ((t, f"texts[{i}]") for i, t in enumerate(self._texts))
        elif self._files is not None:
            for path in self._files:
                yield from read_file(path, cfg.txt_documents)
        else:
            try:
                import datasets
            except ImportError:
                raise ImportError(f"DataConfig.source={cfg.source!r} is a Hugging Face dataset id, which needs the "
                                  f"`datasets` package: pip install datasets (or use DataConfig.files / texts=)") from None
            ds = datasets.load_dataset(cfg.source, cfg.dataset_config, split=cfg.split, streaming=cfg.streaming)
            yield from ((r, f"{cfg.source}[{cfg.split}] record {i}") for i, r in enumerate(ds))

    def _kept_records(self) -> Iterator[tuple[int, Any, str]]:
        """Records from ``self._doc_index`` on, with their source index, after the hold-out filter."""
        k, want_held = self.config.validation_every, self.config.subset == "validation"
        start = self._doc_index
        for i, (rec, where) in enumerate(itertools.islice(self._records(), start, None), start):
            if k is None or (i % k == 0) == want_held:
                yield i, rec, where

    # ------------------------------------------------------------------ state
    def _reset(self, epoch: int) -> None:
        self._epoch, self._doc_index, self._block_index = epoch, 0, 0
        self._pending: list[int] = []
        self._pending_pos = 0
        self._buffer: list[Item] = []
        self._rng = np.random.default_rng(np.random.SeedSequence([self.config.seed, epoch, self.rank]))
        self._source_done, self._tokens_seen, self._epoch_items = False, 0, 0

    def _fingerprint(self) -> dict[str, Any]:
        keys = ("format", "block_size", "insert_eos_separator", "drop_remainder", "shuffle_buffer", "seed",
                "validation_every", "subset", "text_field", "txt_documents", "split", "dataset_config",
                "sft_overflow", "sft_response_suffix")
        fp = {k: getattr(self.config, k) for k in keys}
        fp["toy_world"] = None if self.config.toy_world is None else self.config.toy_world.to_dict()
        fp.update(rank=self.rank, world_size=self.world_size, eos_id=self.eos_id)
        return fp

    def state_dict(self) -> dict[str, Any]:
        """Exact position after the last yielded sample (tensors + plain values only)."""
        bs = self.config.block_size
        buf = np.stack([b for b, _ in self._buffer]) if self._buffer else np.zeros((0, bs), np.int32)
        return {
            "version": _STATE_VERSION, "fingerprint": self._fingerprint(), "epoch": self._epoch,
            "doc_index": self._doc_index, "block_index": self._block_index,
            "pending": torch.tensor(self._pending[self._pending_pos:], dtype=torch.long),
            "buffer": torch.from_numpy(buf.astype(np.int32)),
            "buffer_prompt_lengths": torch.tensor([p for _, p in self._buffer], dtype=torch.long),
            "rng": copy.deepcopy(self._rng.bit_generator.state), "source_done": self._source_done,
            "tokens_seen": self._tokens_seen, "epoch_items": self._epoch_items,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore a :meth:`state_dict`; the next iteration continues from there."""
        if state.get("version") != _STATE_VERSION:
            raise ValueError(f"data state version {state.get('version')!r} is not supported (expected {_STATE_VERSION})")
        saved, now = state["fingerprint"], self._fingerprint()
        diff = [f"{k}: saved {saved.get(k)!r}, now {v!r}" for k, v in now.items() if saved.get(k) != v]
        if diff:
            raise ValueError("cannot resume the data stream exactly, settings differ from the checkpoint: "
                             + "; ".join(diff))
        self._reset(int(state["epoch"]))
        self._doc_index, self._block_index = int(state["doc_index"]), int(state["block_index"])
        self._pending = [int(t) for t in state["pending"].tolist()]
        buf = state["buffer"].numpy().astype(np.int32)
        lens = state["buffer_prompt_lengths"].tolist()
        self._buffer = [(buf[i].copy(), int(lens[i])) for i in range(buf.shape[0])]
        self._rng = np.random.Generator(np.random.PCG64())
        self._rng.bit_generator.state = copy.deepcopy(state["rng"])
        self._source_done = bool(state["source_done"])
        self._tokens_seen, self._epoch_items = int(state["tokens_seen"]), int(state["epoch_items"])
        self._resume_pending = True

    # ------------------------------------------------------------------ stream
    def __iter__(self) -> Iterator[dict[str, Any]]:
        info = get_worker_info()
        if info is not None:
            raise RuntimeError(f"TokenBlockDataset needs DataLoader(num_workers=0), got {info.num_workers}: its "
                               f"resumable state lives in this process and workers would each replay the stream")
        if not self._resume_pending:
            self._reset(0)
        self._resume_pending = False
        return self._generate()

    def _generate(self) -> Iterator[dict[str, Any]]:
        while True:
            yield from self._epoch_stream()
            if not self.config.repeat:
                return
            self._reset(self._epoch + 1)

    def _epoch_stream(self) -> Iterator[dict[str, Any]]:
        # Every state mutation happens before the corresponding yield, so state_dict() taken
        # between samples is always consistent.
        if not self._source_done:
            items = self._sft_items() if self.config.format == "sft" else self._text_items()
            for item in items:
                self._epoch_items += 1
                out = self._shuffle(item)
                if out is not None:
                    yield self._sample(out)
            self._source_done = True
            self._check_nonempty()
        while self._buffer:
            j = int(self._rng.integers(len(self._buffer)))
            self._buffer[j], self._buffer[-1] = self._buffer[-1], self._buffer[j]
            yield self._sample(self._buffer.pop())

    def _shuffle(self, item: Item) -> Item | None:
        size = self.config.shuffle_buffer
        if size <= 1:
            return item
        if len(self._buffer) < size:
            self._buffer.append(item)
            return None
        j = int(self._rng.integers(size))
        out, self._buffer[j] = self._buffer[j], item
        return out

    def _sample(self, item: Item) -> dict[str, Any]:
        ids, prompt_length = item
        out: dict[str, Any] = {"input_ids": torch.from_numpy(ids.astype(np.int64))}
        if self.config.format == "sft":
            out["prompt_length"] = prompt_length
        return out

    def _eos(self) -> int:
        """The EOS id where the config needs one (the EOS separator, EOS padding, SFT): its absence was refused
        at construction."""
        if self.eos_id is None:
            raise ValueError("this data configuration needs an EOS id")
        return self.eos_id

    def _take_block(self, block: Sequence[int] | np.ndarray) -> Item | None:
        index = self._block_index
        self._block_index += 1
        return (np.asarray(block, dtype=np.int32), -1) if index % self.world_size == self.rank else None

    def _flush(self) -> Iterator[Item]:
        bs = self.config.block_size
        while len(self._pending) - self._pending_pos >= bs:
            start = self._pending_pos
            self._pending_pos += bs
            item = self._take_block(self._pending[start:start + bs])
            if item is not None:
                yield item
        self._pending, self._pending_pos = self._pending[self._pending_pos:], 0

    def _text_items(self) -> Iterator[Item]:
        cfg = self.config
        sep = [self._eos()] if cfg.insert_eos_separator else []
        yield from self._flush()  # a resumed state may still hold full blocks
        records = ((i, text_of(r, w, cfg.text_field)) for i, r, w in self._kept_records())
        chunks = iter(lambda: list(itertools.islice(records, _ENCODE_CHUNK)), [])
        for chunk in chunks:
            for (i, _), ids in zip(chunk, self._encode([t for _, t in chunk])):
                self._doc_index = i + 1
                if not ids:
                    continue
                self._tokens_seen += len(ids)
                self._pending = self._pending[self._pending_pos:] + list(ids) + sep
                self._pending_pos = 0
                yield from self._flush()
        rest = self._pending[self._pending_pos:]
        if rest and not cfg.drop_remainder:
            self._pending, self._pending_pos = [], 0
            item = self._take_block(rest + [self._eos()] * (cfg.block_size - len(rest)))
            if item is not None:
                yield item

    def _sft_items(self) -> Iterator[Item]:
        cfg = self.config
        for i, rec, where in self._kept_records():
            self._doc_index = i + 1
            index = self._block_index
            self._block_index += 1
            if index % self.world_size != self.rank:
                continue
            if self._toy is not None:
                ids, plen = self._toy[0][rec].numpy(), int(self._toy[1][rec])
            else:
                messages, response = normalize_sft_record(rec, where)
                ids, plen = build_sft_example(
                    messages, response, where, encode=self._encode, tokenizer=self.tokenizer,
                    render_prompt=self.render_prompt, block_size=cfg.block_size, eos_id=self._eos(),
                    overflow=cfg.sft_overflow, response_suffix=cfg.sft_response_suffix)
            self._tokens_seen += plen
            yield ids.astype(np.int32), plen

    def _check_nonempty(self) -> None:
        cfg = self.config
        held = f" (subset={cfg.subset!r}, validation_every={cfg.validation_every})" if cfg.validation_every else ""
        if cfg.format == "text" and self._tokens_seen == 0:
            raise ValueError(f"dataset produced no tokens: {self._describe()}{held} has no non-empty documents; "
                             f"check the source, text_field={cfg.text_field!r} and the tokenizer")
        if cfg.format == "sft" and self._block_index == 0:
            raise ValueError(f"dataset produced no examples: {self._describe()}{held} has no records")
        if self._epoch_items == 0:
            tail = ", and the final partial block is dropped (drop_remainder=True)" if cfg.drop_remainder else ""
            raise ValueError(f"rank {self.rank} of world_size={self.world_size} received no blocks: the dataset gave "
                             f"{self._block_index} block(s) of block_size={cfg.block_size} from {self._tokens_seen} "
                             f"tokens{tail}; use more data, a smaller block_size or fewer ranks")


def collate_blocks(samples: Sequence[Mapping[str, Any]]) -> dict[str, torch.Tensor]:
    """Stack samples: ``input_ids (B, block_size)`` and, for SFT, ``prompt_length (B,)``."""
    out = {"input_ids": torch.stack([s["input_ids"] for s in samples])}
    if "prompt_length" in samples[0]:
        out["prompt_length"] = torch.tensor([int(s["prompt_length"]) for s in samples], dtype=torch.long)
    return out


def make_dataloader(config: DataConfig, tokenizer: Any, *, batch_size: int, rank: int = 0, world_size: int = 1,
                    texts: Iterable[Any] | None = None, eos_id: int | None = None,
                    render_prompt: RenderPrompt | None = None, num_workers: int = 0, drop_last: bool = True,
                    pin_memory: bool = False) -> DataLoader:
    """A plain ``torch.utils.data.DataLoader`` over a :class:`TokenBlockDataset`.

    Checkpoint with ``loader.dataset.state_dict()`` and resume with
    ``loader.dataset.load_state_dict(state)`` before iterating again.
    """
    if not _is_int(batch_size) or batch_size < 1:
        raise ValueError(f"batch_size must be an int >= 1, got {batch_size!r}")
    if num_workers != 0:
        raise ValueError(f"num_workers must be 0 (got {num_workers}): the resumable stream state lives in the "
                         f"dataset object in this process; tokenisation is cheap next to an 8B forward pass")
    ds = TokenBlockDataset(config, tokenizer, rank=rank, world_size=world_size, texts=texts, eos_id=eos_id,
                           render_prompt=render_prompt)
    return DataLoader(ds, batch_size=batch_size, collate_fn=collate_blocks, num_workers=0, drop_last=drop_last,
                      pin_memory=pin_memory)
