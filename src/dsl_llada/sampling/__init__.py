"""Samplers: functions over a model and a schedule/config returning a SampleOutput."""

from .common import PromptBatch, RowRNG, SampleOutput, StepInfo, stop_lengths
from .remask import sample_remask, sample_remdm, transfer_counts
from .sde import heun_solve, inference_beta, sample_block_sde, sample_sde

__all__ = ["PromptBatch", "RowRNG", "SampleOutput", "StepInfo", "heun_solve", "inference_beta", "sample_block_sde",
           "sample_remask", "sample_remdm", "sample_sde", "stop_lengths", "transfer_counts"]
