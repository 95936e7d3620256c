"""Error correction (paper T1, docs/provenance.md §5.1): Fix / Clean after one forward pass over a corrupted text.

A *case* is a pair of equal-length id sequences (original, corrupted). The model reads the corrupted ids once,
the prediction is the argmax at every position, and per case

* Fix   = #{corrupted positions predicted as the original token} / #corrupted,
* Clean = #{uncorrupted positions predicted as their (unchanged) input token} / #uncorrupted,

macro-averaged over cases; ``overcorrect = 1 - Clean`` and ``selective = Fix - overcorrect`` (the
realistic-correction suite). Rates are fractions in [0, 1].

Two input pathways (``path``):

* ``"discrete"`` — the authors' probe: ids through the backbone's own input embedding (wte), one forward;
  works for any backbone or DSL model (``logits_from_ids``);
* ``"converter"`` — DSL models only: the corrupted ids enter through the trained converter, either as clean
  one-hot inputs ``W[:, id] + c`` (``gamma=None``, infinite SNR) or as noisy states at SNR ``gamma``
  (z = gamma e_x + sqrt(gamma) eps, one noise draw per text from its own seeded generator).

Case sources: random-token corruption at a rate (:func:`random_token_cases`), the manual semantic set
(``semantic_corruption_manual.jsonl``) and ``correction_benchmark_50.jsonl`` (:func:`pair_cases`), and the
noisy-edit generator (:func:`noisy_edit_cases`).
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from ..core.backbones.base import model_device
from . import metrics as M

__all__ = ["PATHS", "CorrectionCase", "aggregate_fix_clean", "align_pair", "case_logits", "fix_clean_records",
           "noisy_edit_cases", "pair_cases", "predict_ids", "random_token_cases", "realistic_records", "score_cases",
           "special_ids"]

PATHS = ("discrete", "converter")


@dataclass(frozen=True)
class CorrectionCase:
    """One text to correct: original and corrupted ids of equal length, plus free-form metadata."""

    case_id: Any
    original: tuple[int, ...]
    corrupted: tuple[int, ...]
    meta: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self):
        if len(self.original) != len(self.corrupted):
            raise ValueError(f"case {self.case_id!r}: original has {len(self.original)} ids but corrupted has "
                             f"{len(self.corrupted)}")
        if not self.original:
            raise ValueError(f"case {self.case_id!r} is empty")


def special_ids(model: Any) -> set[int]:
    """The model's named special token ids (mask, eos, eot, pad, bos; whichever are set)."""
    sp = getattr(model, "special", None)
    out = set()
    for name in ("mask", "eos", "eot", "pad", "bos"):
        v = getattr(sp, name, None)
        if isinstance(v, int):
            out.add(v)
    return out


def _encode(tokenizer: Any, text: str | Sequence[int], max_tokens: int | None) -> list[int]:
    ids = list(text) if not isinstance(text, str) else list(tokenizer.encode(text, add_special_tokens=False))
    return ids[:max_tokens] if max_tokens else ids


# --------------------------------------------------------------------------- case sources

def random_token_cases(texts: Sequence[str | Sequence[int]], tokenizer: Any, *, rate: float, seed: int,
                       id_range: tuple[int, int], exclude: Iterable[int] = (),
                       text_ids: Sequence[Any] | None = None, max_tokens: int | None = None,
                       mode: str = "default") -> list[CorrectionCase]:
    """Random-token corruption: per text, ``numpy.random.default_rng(seed + text_id)`` picks
    ``max(1, floor(n * rate))`` positions and replaces each by a different uniformly random id from
    ``id_range`` (ids in ``exclude`` are re-drawn; :func:`dsl_llada.eval.metrics.corrupt_random_tokens`).
    ``text_id`` is the text's index unless ``text_ids`` (integers) are given, so a text's corruption does not
    depend on which other texts are evaluated. Empty texts are skipped.

    ``mode="authors"``: :func:`dsl_llada.eval.authors.corrupt_random_tokens` with ``RandomState(seed + text_id)``,
    ``max(1, int(n * rate))`` positions sorted ascending and their replacements drawn in that order, and no
    excluded ids (they only re-draw the original id)."""
    ids_list = [_encode(tokenizer, t, max_tokens) for t in texts]
    tids = list(range(len(ids_list))) if text_ids is None else list(text_ids)
    if len(tids) != len(ids_list):
        raise ValueError(f"text_ids has {len(tids)} entries but texts has {len(ids_list)}")
    low, high = id_range
    ex = {int(x) for x in exclude}
    cases = []
    for tid, ids in zip(tids, ids_list):
        if not ids:
            continue
        if mode == "authors":
            from .authors import corrupt_random_tokens

            corrupted, positions = corrupt_random_tokens(ids, rate, seed + int(tid), low=low, high=high)
        else:
            rng = np.random.default_rng(seed + int(tid))
            drawn, pos = M.corrupt_random_tokens(ids, rate, rng, low, high, exclude=ex)
            corrupted, positions = drawn.tolist(), pos.tolist()
        cases.append(CorrectionCase(tid, tuple(ids), tuple(int(x) for x in corrupted),
                                    {"rate": rate, "positions": positions}))
    return cases


def align_pair(original: Sequence[int], corrupted: Sequence[int], *, mode: str = "default"
               ) -> tuple[list[int], list[int]] | None:
    """Make a tokenised (original, corrupted) pair comparable position by position.

    ``default``: align with ``difflib.SequenceMatcher`` (no autojunk); usable only when every difference is an
    equal-length replacement (then both sequences are returned whole), else ``None`` (the case is skipped —
    a re-tokenisation that changes the length cannot be scored per position).
    ``authors``: their manual-semantic rule — positional comparison over the common prefix length
    ``min(len)``; tokens beyond it are dropped (a length change shifts every later position).
    """
    o, c = list(original), list(corrupted)
    if mode == "authors":
        m = min(len(o), len(c))
        return (o[:m], c[:m]) if m else None
    if mode != "default":
        raise ValueError(f"mode must be one of ('default', 'authors'), got {mode!r}")
    ops = difflib.SequenceMatcher(None, o, c, autojunk=False).get_opcodes()
    for tag, i1, i2, j1, j2 in ops:
        if tag != "equal" and not (tag == "replace" and i2 - i1 == j2 - j1):
            return None
    return o, c


def pair_cases(rows: Iterable[Mapping[str, Any]], tokenizer: Any, *, original_key: str = "original",
               corrupted_key: str = "corrupted", id_key: str = "id", mode: str = "default",
               meta_keys: Sequence[str] = ("category", "difficulty")) -> tuple[list[CorrectionCase], list[Any]]:
    """Cases from rows holding an original and a corrupted sentence (tokenised separately, then
    :func:`align_pair`). ``semantic_corruption_manual.jsonl``: keys ``original_text`` / ``corrupted_text``;
    ``correction_benchmark_50.jsonl``: ``original`` / ``corrupted``. Returns (cases, ids of skipped rows);
    a row whose texts tokenise identically is skipped too."""
    cases, skipped = [], []
    for i, r in enumerate(rows):
        for k in (original_key, corrupted_key):
            if k not in r:
                raise KeyError(f"row {i} has no field {k!r} (fields: {sorted(r)})")
        cid = r.get(id_key, i)
        o = _encode(tokenizer, r[original_key], None)
        c = _encode(tokenizer, r[corrupted_key], None)
        pair = align_pair(o, c, mode=mode)
        if pair is None or pair[0] == pair[1]:
            skipped.append(cid)
            continue
        meta = {k: r[k] for k in meta_keys if k in r}
        if "corruptions" in r:
            meta["corruption_type"] = ",".join(sorted({x.get("corruption_type", "") for x in r["corruptions"]}))
        cases.append(CorrectionCase(cid, tuple(pair[0]), tuple(pair[1]), meta))
    return cases, skipped


_EDITS = (("rn", "m"), ("cl", "d"), ("vv", "w"), ("0", "O"), ("1", "l"))


def _word_edits(word: str) -> list[tuple[str, str]]:
    """(kind, edited word) candidates: one deleted character, one adjacent swap, OCR confusions."""
    out = [("delete", word[:i] + word[i + 1:]) for i in range(len(word))]
    out += [("swap", word[:i] + word[i + 1] + word[i] + word[i + 2:]) for i in range(len(word) - 1)
            if word[i] != word[i + 1]]
    for a, b in _EDITS:
        if a in word:
            out.append((f"{a}->{b}", word.replace(a, b, 1)))
    return out


def noisy_edit_cases(texts: Sequence[str], tokenizer: Any, *, seed: int = 0, max_edits: int = 1,
                     text_ids: Sequence[Any] | None = None) -> list[CorrectionCase]:
    """Realistic typo corruption (the authors' noisy-edit generator): in each text, candidate tokens are
    alphabetic tokens of at least 4 characters (a leading space allowed); each candidate edit (single-character
    deletion, adjacent swap, rn->m, cl->d, vv->w, 0->O, 1->l) is kept only if the edited token re-tokenises to
    exactly one *different* token. Up to ``max_edits`` positions per text are edited, chosen (and their edit)
    with ``numpy.random.default_rng(seed + text_id)``. Texts with no editable token are skipped."""
    tids = list(range(len(texts))) if text_ids is None else list(text_ids)
    cases = []
    for tid, text in zip(tids, texts):
        ids = _encode(tokenizer, text, None)
        options: dict[int, list[tuple[str, int]]] = {}
        for pos, tok in enumerate(ids):
            s = tokenizer.decode([tok])
            core = s.lstrip(" ")
            if len(core) < 4 or not core.isalpha():
                continue
            lead = s[: len(s) - len(core)]
            cands = []
            for kind, w in _word_edits(core):
                new = tokenizer.encode(lead + w, add_special_tokens=False)
                if len(new) == 1 and new[0] != tok:
                    cands.append((kind, int(new[0])))
            if cands:
                options[pos] = cands
        if not options:
            continue
        rng = np.random.default_rng(seed + int(tid))
        keys = sorted(options)
        chosen = sorted(rng.choice(len(keys), size=min(max_edits, len(keys)), replace=False).tolist())
        corrupted = list(ids)
        kinds = []
        for k in chosen:
            pos = keys[k]
            kind, new = options[pos][int(rng.integers(len(options[pos])))]
            corrupted[pos] = new
            kinds.append(kind)
        cases.append(CorrectionCase(tid, tuple(ids), tuple(corrupted),
                                    {"positions": [keys[k] for k in chosen], "edits": kinds}))
    return cases


# --------------------------------------------------------------------------- scoring

def _check_path(model: Any, path: str, gamma: float | None) -> None:
    if path not in PATHS:
        raise ValueError(f"path must be one of {PATHS}, got {path!r}")
    if path == "converter" and not hasattr(model, "converter"):
        raise ValueError(f"path='converter' needs a DSL model with a converter; {type(model).__name__} has none "
                         f"(use path='discrete')")
    if gamma is not None and (path != "converter" or not gamma > 0):
        raise ValueError(f"gamma must be a positive SNR and is only used with path='converter', got {gamma!r} "
                         f"with path={path!r}")


@torch.no_grad()
def case_logits(model: Any, ids: torch.Tensor, *, path: str = "discrete", gamma: float | None = None,
                attention_mask: torch.Tensor | None = None,
                generators: Sequence[torch.Generator] | None = None) -> torch.Tensor:
    """(B, L) ids -> (B, L, V) logits through the chosen input pathway (see the module docstring).
    With ``gamma``, row b's noise is drawn from ``generators[b]``."""
    _check_path(model, path, gamma)
    if path == "discrete":
        return model.logits_from_ids(ids, attention_mask)
    dtype = model.backbone.input_embeddings().weight.dtype
    if gamma is None:
        return model.backbone(model.converter.clean_embedding(ids).to(dtype), attention_mask)
    from ..core.converter import noisy_states

    E = model.unit_noise()
    gens = list(generators) if generators is not None else [None] * ids.shape[0]
    z = torch.cat([noisy_states(E, ids[b : b + 1], float(gamma), gens[b]) for b in range(ids.shape[0])])
    return model.logits_from_states(ids, z, None, attention_mask)


def score_cases(model: Any, cases: Sequence[CorrectionCase], *, path: str = "discrete", gamma: float | None = None,
                seed: int = 0, batch_size: int = 8, mode: str = "default") -> list[dict[str, Any]]:
    """One Fix/Clean record per case (in input order; :func:`dsl_llada.eval.metrics.fix_clean` in ``mode``).
    Cases are batched in length-sorted order; a batch with unequal lengths is right-padded with an attention
    mask (pad id = ``model.special.pad``, or 0)."""
    preds = predict_ids(model, [c.corrupted for c in cases], [c.case_id for c in cases], path=path, gamma=gamma,
                        seed=seed, batch_size=batch_size)
    out = []
    for i, c in enumerate(cases):
        r = M.fix_clean(c.original, c.corrupted, preds[i], mode=mode)
        out.append({"case_id": c.case_id, "path": path, "gamma": gamma, "n_tokens": len(c.original),
                    "n_corrupted": r.n_corrupted, "n_uncorrupted": r.n_uncorrupted, "fix": r.fix,
                    "clean": r.clean, **c.meta, "corrupted_ids": list(c.corrupted), "predicted_ids": preds[i]})
    return out


def realistic_records(model: Any, tokenizer: Any, rows: Sequence[Mapping[str, Any]], *, path: str = "discrete",
                      gamma: float | None = None, seed: int = 0, batch_size: int = 8) -> list[dict[str, Any]]:
    """The authors' realistic-correction scoring of sentence pairs (``{"id", "original", "corrupted"}``): both
    sides tokenised separately, the model reads the corrupted ids, and
    :func:`dsl_llada.eval.authors.realistic_fix_clean` scores it on the pairs of
    :func:`~dsl_llada.eval.authors.realistic_alignment` (so pairs whose lengths differ are scored too)."""
    from .authors import realistic_fix_clean

    pairs = [(r.get("id", i), _encode(tokenizer, r["original"], None), _encode(tokenizer, r["corrupted"], None))
             for i, r in enumerate(rows)]
    pairs = [p for p in pairs if p[2]]
    preds = predict_ids(model, [c for _, _, c in pairs], [cid for cid, _, _ in pairs], path=path, gamma=gamma,
                        seed=seed, batch_size=batch_size)
    out = []
    for (cid, o, c), pr in zip(pairs, preds):
        r = realistic_fix_clean(o, c, pr)
        out.append({"case_id": cid, "path": path, "gamma": gamma, "n_tokens": len(c), **r})
    return out


def predict_ids(model: Any, seqs: Sequence[Sequence[int]], case_ids: Sequence[Any], *, path: str = "discrete",
                gamma: float | None = None, seed: int = 0, batch_size: int = 8) -> list[list[int]]:
    """Argmax prediction at every position of each id sequence after one forward (batched, length-sorted)."""
    _check_path(model, path, gamma)
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    device = model_device(model)
    pad = getattr(getattr(model, "special", None), "pad", None)
    pad = pad if isinstance(pad, int) else 0
    order = sorted(range(len(seqs)), key=lambda i: len(seqs[i]))
    preds: dict[int, list[int]] = {}
    for s in range(0, len(order), batch_size):
        idx = order[s : s + batch_size]
        L = max(len(seqs[i]) for i in idx)
        ids = torch.full((len(idx), L), pad, dtype=torch.long)
        att = torch.zeros(len(idx), L, dtype=torch.long)
        for b, i in enumerate(idx):
            n = len(seqs[i])
            ids[b, :n] = torch.tensor(list(seqs[i]), dtype=torch.long)
            att[b, :n] = 1
        gens = None
        if gamma is not None:
            gens = [torch.Generator(device=device).manual_seed(seed * 1_000_003 + hash_id(case_ids[i])) for i in idx]
        logits = case_logits(model, ids.to(device), path=path, gamma=gamma,
                             attention_mask=None if bool(att.all()) else att.to(device), generators=gens)
        am = logits.argmax(-1).cpu()
        for b, i in enumerate(idx):
            preds[i] = am[b, : len(seqs[i])].tolist()
    return [preds[i] for i in range(len(seqs))]


def hash_id(case_id: Any) -> int:
    """A stable non-negative integer for a case id (ints map to themselves; strings via their UTF-8 bytes)."""
    if isinstance(case_id, (int, np.integer)) and case_id >= 0:
        return int(case_id)
    import zlib

    return zlib.crc32(str(case_id).encode("utf-8"))


def fix_clean_records(model: Any, tokenizer: Any, texts: Sequence[str | Sequence[int]], *, rate: float,
                      path: str = "discrete", gamma: float | None = None, seed: int = 0, batch_size: int = 8,
                      id_range: tuple[int, int] | None = None, text_ids: Sequence[Any] | None = None,
                      max_tokens: int | None = None, mode: str = "default") -> list[dict[str, Any]]:
    """Random-token Fix/Clean, one record per (non-empty) text: corrupt with :func:`random_token_cases`
    (replacement ids from ``id_range``, default the whole vocabulary ``[0, V)``; the model's special ids are
    never drawn), then :func:`score_cases`. ``texts`` are strings (tokenised without special tokens) or
    already-tokenised id lists (e.g. ``wikitext_texts_100.jsonl``'s LLaDA ``tokens``). Each record also has
    ``text_id`` and ``rate``."""
    _check_path(model, path, gamma)
    V = int(model.vocab_size)
    low, high = id_range if id_range is not None else (0, V)
    if not 0 <= low < high <= V:
        raise ValueError(f"id_range must satisfy 0 <= low < high <= vocab size {V}, got {(low, high)}")
    cases = random_token_cases(texts, tokenizer, rate=rate, seed=seed, id_range=(low, high),
                               exclude=special_ids(model), text_ids=text_ids, max_tokens=max_tokens, mode=mode)
    recs = score_cases(model, cases, path=path, gamma=gamma, seed=seed, batch_size=batch_size, mode=mode)
    for r in recs:
        r["text_id"] = r["case_id"]
    return recs


def aggregate_fix_clean(records: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Macro averages over records: ``fix``, ``clean``, ``overcorrect`` = 1 - clean, ``selective`` =
    fix - overcorrect (``None`` when undefined), with ``n`` records and the token totals."""
    if not records:
        raise ValueError("aggregate_fix_clean needs at least one record, got none")
    fix = M.macro_average(r["fix"] for r in records)
    clean = M.macro_average(r["clean"] for r in records)
    over = None if clean is None else 1.0 - clean
    sel = None if fix is None or over is None else fix - over
    return {"n": len(records), "fix": fix, "clean": clean, "overcorrect": over, "selective": sel,
            "n_corrupted": sum(int(r["n_corrupted"]) for r in records),
            "n_tokens": sum(int(r["n_tokens"]) for r in records)}
