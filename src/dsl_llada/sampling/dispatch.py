"""Samplers chosen by config type: `SDEConfig` runs the SDE (Block SDE when `block_length > 0`), `RemaskConfig`
runs LLaDA remasking (ReMDM-conf-loop when `remdm`). The method's name is the config's `sampler_name`, so a record
can never be labelled with a method other than the one that produced it."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ..config import RemaskConfig, SDEConfig
from ..model import DSLModel
from .common import PromptBatch, SampleOutput, StepCallback
from .remask import DiscreteModel, sample_remask
from .sde import sample_sde

SamplerConfig = SDEConfig | RemaskConfig
"""A sampler's typed config; its type picks the sampler."""
SAMPLERS = ("sde", "block-sde", "remask", "remdm")
"""Every `sampler_name` a SamplerConfig can have."""
CONFIG_FOR_SAMPLER: dict[str, type] = {"sde": SDEConfig, "block-sde": SDEConfig, "remask": RemaskConfig,
                                       "remdm": RemaskConfig}
"""The config type behind each sampler name (the CLI's `--sampler`)."""


def sample(model: DSLModel | DiscreteModel, prompts: PromptBatch, config: SamplerConfig, *,
           generator: torch.Generator | Sequence[torch.Generator] | None = None, callback: StepCallback | None = None,
           progress: bool = False, return_trajectory: bool = False) -> SampleOutput:
    """Run the sampler that `config`'s type names on one batch of prompts."""
    kw = dict(generator=generator, callback=callback, progress=progress, return_trajectory=return_trajectory)
    if isinstance(config, SDEConfig):
        if not isinstance(model, DSLModel):
            raise ValueError(f"sampler {config.sampler_name!r} needs a DSL checkpoint (with noise_embed/converter); "
                             f"this model is a bare backbone — use 'remask'/'remdm' or convert it first")
        return sample_sde(model, prompts, config, **kw)
    if isinstance(config, RemaskConfig):
        return sample_remask(model, prompts, config, **kw)
    raise TypeError(f"config of type {type(config).__name__} names no sampler; expected SDEConfig or RemaskConfig")
