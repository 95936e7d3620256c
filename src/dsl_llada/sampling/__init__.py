"""Samplers: functions over a model and a schedule/config returning a SampleOutput."""

from .common import PromptBatch, RowRNG, SampleOutput, StepInfo, stop_lengths
from .denoiser import Denoiser
from .dispatch import SAMPLERS, SamplerConfig, sample
from .remask import sample_remask, sample_remdm, transfer_counts
from .remask_step import RemaskStep, remask_step
from .sde import heun_solve, inference_beta, sample_block_sde, sample_sde

__all__ = ["Denoiser", "PromptBatch", "RemaskStep", "RowRNG", "SAMPLERS", "SampleOutput", "SamplerConfig", "StepInfo",
           "heun_solve", "inference_beta", "remask_step", "sample", "sample_block_sde", "sample_remask", "sample_remdm",
           "sample_sde", "stop_lengths", "transfer_counts"]
