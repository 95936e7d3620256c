"""Run the sampler a config names: its `sampler_name` picks the row of the registry (`sampling.registry`), so a
record can never be labelled with a method other than the one that produced it."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ..core.model import DSLModel
from .common import PromptBatch, SampleOutput, StepCallback
from .registry import SAMPLERS, SamplerConfig, spec_of
from .remask import DiscreteModel

__all__ = ["SAMPLERS", "SamplerConfig", "sample"]


def sample(model: DSLModel | DiscreteModel, prompts: PromptBatch, config: SamplerConfig, *,
           generator: torch.Generator | Sequence[torch.Generator] | None = None, callback: StepCallback | None = None,
           progress: bool = False, return_trajectory: bool = False) -> SampleOutput:
    """Run the sampler that `config` names on one batch of prompts."""
    spec = spec_of(config)
    if spec.needs_dsl and not isinstance(model, DSLModel):
        raise ValueError(f"sampler {spec.name!r} needs a DSL checkpoint (with noise_embed/converter); "
                         f"this model is a bare backbone — use 'remask'/'remdm' or convert it first")
    return spec.run(model, prompts, config, generator=generator, callback=callback, progress=progress,
                    return_trajectory=return_trajectory)
