"""Samplers: functions over a model and a schedule/config returning a SampleOutput."""

from .common import PromptBatch, RowRNG, SampleOutput, StepInfo, stop_lengths
from .denoiser import Denoiser
from .dispatch import sample
from .engine import Engine, EngineResult
from .registry import REGISTRY, SAMPLERS, SamplerConfig, SamplerSpec, sampler_config
from .remask import sample_remask, sample_remdm, transfer_counts
from .remask_step import RemaskStep, remask_step
from .sde import heun_solve, inference_beta, sample_block_sde, sample_sde

__all__ = ["REGISTRY", "SAMPLERS", "Denoiser", "Engine", "EngineResult", "PromptBatch", "RemaskStep", "RowRNG",
           "SampleOutput", "SamplerConfig", "SamplerSpec", "StepInfo", "heun_solve", "inference_beta", "remask_step",
           "sample", "sample_block_sde", "sample_remask", "sample_remdm", "sample_sde", "sampler_config",
           "stop_lengths", "transfer_counts"]
