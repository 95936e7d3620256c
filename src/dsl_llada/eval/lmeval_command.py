"""`dsl-llada lm-eval` as a library call: `run_lm_eval(LmEvalSettings(...))` runs lm-evaluation-harness tasks on a
DSL checkpoint or a masked-diffusion backbone through this project's samplers, prints lm-eval's results table and
returns the command's exit code:

    from dsl_llada.eval.lmeval_command import LmEvalSettings, run_lm_eval
    from dsl_llada.core.model_source import ModelSource
    run_lm_eval(LmEvalSettings(ModelSource(path="runs/dsl/final"), tasks=("gsm8k_local",), include_path="tasks/",
                               sampler="remask", sampler_fields={"steps": "64", "gen_length": "256"}))

The command line only parses its flags into these settings (`lmeval_cli.cmd_lmeval`); the model adapter is
`lmeval.DSLLadaLM`, which receives the `ModelSource` as it is and opens it (`loading.open_model`). Needs the `[lmeval]` extra.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..core.model_source import ModelSource
from ..sampling.registry import SAMPLERS

__all__ = ["LmEvalSettings", "check_task_files", "run_lm_eval"]


@dataclass(frozen=True)
class LmEvalSettings:
    """One `lm-eval` run: the model, the tasks and how requests are sampled and scored."""

    source: ModelSource
    """The model to open (resolved before loading: device, dtype, local folder)."""
    tasks: tuple[str, ...]
    """lm-eval task names (built-in, or defined by the YAML files under `include_path`)."""
    include_path: str | None = None
    """Folder of local task YAML files."""
    limit: float | None = None
    """Examples per task (a whole number) or a fraction of each task (below 1)."""
    num_fewshot: int | None = None
    sampler: str = SAMPLERS[0]
    """Sampler for generate_until requests."""
    sampler_fields: Mapping[str, Any] = field(default_factory=dict)
    """Fields of the sampler's config, as text or values (e.g. {"nfe": "64", "gen_length": "256"})."""
    batch_size: int = 8
    """Prompts per sampler call."""
    mc_samples: int = 128
    """Monte Carlo mask patterns per likelihood."""
    mc_batch_size: int = 32
    """Rows per likelihood forward pass."""
    seed: int = 42
    chat_template: bool = True
    """Feed prompts through the tokenizer's chat template (False: raw)."""
    output: str | None = None
    """Write lm-eval's results JSON here (atomically)."""

    def __post_init__(self) -> None:
        if not isinstance(self.source, ModelSource):
            raise ValueError(f"source={self.source!r} must be a ModelSource")
        if isinstance(self.tasks, str) or not self.tasks or not all(isinstance(t, str) and t for t in self.tasks):
            raise ValueError(f"tasks={self.tasks!r} must be a non-empty list of lm-eval task names")
        if self.sampler not in SAMPLERS:
            raise ValueError(f"sampler={self.sampler!r} is not valid; expected one of {list(SAMPLERS)}")
        if self.limit is not None and not (math.isfinite(self.limit) and self.limit > 0):
            raise ValueError(f"--limit {self.limit} must be a positive number of examples or a fraction in (0, 1)")


def check_task_files(include_path: str | Path) -> None:
    """Refuse an include path that is not a folder, or that holds a task YAML file which does not parse: lm-eval
    itself skips such a file and then calls its tasks unknown. lm-eval's own tags (`!function utils.f`) are
    accepted; only the YAML syntax is checked here."""
    import yaml

    root = Path(include_path)
    if not root.is_dir():
        raise ValueError(f"--include-path {str(include_path)!r} is not a folder")

    class _Loader(yaml.SafeLoader):
        pass

    _Loader.add_multi_constructor("!", lambda loader, suffix, node: None)
    for path in sorted(p for ext in ("*.yaml", "*.yml") for p in root.rglob(ext)):
        if not path.is_file():
            continue
        try:
            yaml.load(path.read_text(encoding="utf-8"), Loader=_Loader)
        except UnicodeDecodeError as e:
            raise ValueError(f"task file '{path}' is not UTF-8 text ({e.reason} at byte {e.start})") from None
        except yaml.YAMLError as e:
            where = getattr(e, "problem_mark", None)
            at = f"line {where.line + 1}, column {where.column + 1}: " if where is not None else ""
            what = getattr(e, "problem", None) or str(e).splitlines()[0]
            raise ValueError(f"task file '{path}' is not valid YAML ({at}{what}); fix it or move it out of "
                             f"--include-path") from None


def run_lm_eval(settings: LmEvalSettings) -> int:
    """Run the tasks and print lm-eval's results table (the main process; other ranks return at once). Returns 0."""
    s = settings
    if s.include_path is not None:
        check_task_files(s.include_path)
    try:
        import lm_eval
        from lm_eval.tasks import TaskManager
        from lm_eval.utils import make_table
    except ImportError:
        raise ValueError("lm-eval is not installed: pip install 'dsl-llada[lmeval]'") from None
    from ..artifacts.atomic import atomic_write_text
    from .lmeval import DSLLadaLM

    lm = DSLLadaLM(source=s.source, sampler=s.sampler, batch_size=s.batch_size, mc_samples=s.mc_samples,
                   mc_batch_size=s.mc_batch_size, seed=s.seed, chat_template=s.chat_template, **s.sampler_fields)
    tasks = list(s.tasks)
    tm = None
    if s.include_path:  # indexing lm-eval's thousands of built-in task files is slow: skip it when not needed
        tm = TaskManager(include_path=s.include_path, include_defaults=False)
        if any(t not in tm.all_tasks for t in tasks):
            tm = None
    tm = tm or TaskManager(include_path=s.include_path)
    unknown = [t for t in tasks if t not in tm.all_tasks]
    if unknown:
        raise ValueError(f"unknown lm-eval task(s) {unknown}; give local YAML tasks with --include-path")
    limit = int(s.limit) if s.limit is not None and s.limit >= 1 else s.limit
    results = lm_eval.simple_evaluate(model=lm, tasks=tasks, task_manager=tm, limit=limit,
                                      num_fewshot=s.num_fewshot, random_seed=s.seed, numpy_random_seed=s.seed,
                                      torch_random_seed=s.seed, fewshot_random_seed=s.seed)
    if results is None:  # non-zero ranks under accelerate
        return 0
    print(make_table(results))
    if s.output:
        atomic_write_text(s.output, json.dumps({k: results[k] for k in ("results", "configs", "versions", "n-samples")
                                                if k in results}, indent=2, default=str))
    return 0
