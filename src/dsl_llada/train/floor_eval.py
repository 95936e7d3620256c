"""`eval_bayes_floor`: the model in training against the toy world's exact Bayes-optimal denoiser.

On held-out conversations (the world's 'valid' split, never trained on) the oracle's cross-entropy is the lowest loss
any model can reach there: the Bayes floor. The model's cross-entropy on the same noise draws minus the floor is its
excess loss, the part of its loss that training can still remove (`toy.bayes_floor`):

- a DSL model: γ drawn from the run's own training SNR distribution (`objective_options.snr`), the prompt clean,
  cross-entropy over the response positions (`dsl_excess`);
- a discrete model (the MDM-CPT / XDLM controls): each response position masked with probability p for p on the
  mask-rate grid 0.1..1.0, cross-entropy over the masked positions (`mdm_curve`); the headline values are the means
  over the grid.

The draws are seeded with the run's `seed`, so every measurement of a run uses the same ones and the values are
comparable across steps. Every process measures the whole held-out set (inside the prepared module's forward, as
the monitoring does), so the values are identical on every process.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import torch

from ..backbones.base import Backbone
from ..model import DSLModel
from ..toy.bayes_floor import MASK_RATES, LossPoint, dsl_excess, mdm_curve
from ..toy.floor_report import held_out
from .monitor import eval_mode
from .toy_source import toy_world_corpus
from .train_config import TrainConfig

logger = logging.getLogger("dsl_llada.train")

__all__ = ["FloorEval", "PREFIX"]

PREFIX = "eval/bayes_floor"
"""Metric names: PREFIX/model_ce, PREFIX/floor, PREFIX/excess (and PREFIX/rate=p/... for discrete models)."""


def _values(p: LossPoint) -> dict[str, float]:
    return {"model_ce": p.model_ce, "floor": p.oracle_ce, "excess": p.excess}


class FloorEval:
    """The held-out conversations and settings of one run's `eval_bayes_floor` (built once at setup)."""

    def __init__(self, config: TrainConfig) -> None:
        settings, data = config.eval_bayes_floor, config.data.toy_world
        if settings is None or data is None:
            raise ValueError("FloorEval needs eval_bayes_floor and data.toy_world in the config")
        corpus = toy_world_corpus(data)
        self.world, self.special, self.every = corpus.world, corpus.special, settings.every
        self.ids, self.prompt_length = held_out(corpus.world, corpus.tokenizer, settings.n_heldout, data.gen_length)
        self.snr, self.seed = config.objective_options.snr, config.seed

    def due(self, step: int, last: bool) -> bool:
        return last or step % self.every == 0

    def measure(self, model: DSLModel | Backbone) -> dict[str, float]:
        """The metrics of `model` (named with `PREFIX`), in eval mode and without gradients."""
        with eval_mode(model), torch.no_grad():
            if isinstance(model, DSLModel):
                values = _values(dsl_excess(model, self.world, self.special, self.ids, self.prompt_length,
                                            snr=self.snr, seed=self.seed))
                return {f"{PREFIX}/{k}": v for k, v in values.items()}
            points = mdm_curve(model, self.world, self.special, self.ids, self.prompt_length, MASK_RATES, self.seed)
        out = {f"{PREFIX}/{k}": sum(_values(p)[k] for p in points) / len(points) for k in ("model_ce", "floor", "excess")}
        out.update({f"{PREFIX}/rate={p.level:g}/{k}": v for p in points for k, v in _values(p).items()})
        return out

    def run(self, call: Callable[..., Any], step: int, main: bool) -> dict[str, float]:
        """`measure` through `call(fn=...)` (the prepared module's forward); the main process logs one line."""
        values: dict[str, float] = call(fn=self.measure)
        if main:
            logger.info("step %d: held-out loss %.4f, Bayes floor %.4f, excess %.4f nats per position", step,
                        values[f"{PREFIX}/model_ce"], values[f"{PREFIX}/floor"], values[f"{PREFIX}/excess"])
        return values
