"""Evaluation tasks: one module per task family; `get_task(name)` returns the task object."""

from __future__ import annotations

from .task import SamplingTask, SummaryContext, TaskSummary


def get_task(name: str):
    """The task implementing `name` (one of dsl_llada.eval.eval_config.TASK_NAMES)."""
    if name == "generation":
        from .generation import GenerationTask

        return GenerationTask()
    if name == "summarization":
        from .summarization import SummarizationTask

        return SummarizationTask()
    if name == "reasoning":
        from .reasoning import ReasoningTask

        return ReasoningTask()
    if name == "correction":
        from .correction import CorrectionTask

        return CorrectionTask()
    if name == "probes":
        from .probes import ProbesTask

        return ProbesTask()
    if name == "walltime":
        from .walltime import WalltimeTask

        return WalltimeTask()
    raise ValueError(f"task {name!r} is not valid; expected one of generation, summarization, reasoning, correction, "
                     "probes, walltime")


__all__ = ["SamplingTask", "SummaryContext", "TaskSummary", "get_task"]
