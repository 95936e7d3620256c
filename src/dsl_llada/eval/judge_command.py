"""`dsl-llada eval judge` as a library call: `run_judge(JudgeSettings(...))` judges run A against run B into an
output folder (resumable), prints the command's one-line JSON summary and returns its exit code:

    from dsl_llada.eval.judge import JudgeConfig
    from dsl_llada.eval.judge_command import JudgeBackendSettings, JudgeSettings, run_judge
    run_judge(JudgeSettings("runs/dsl", "runs/llada", out="judge/xsum-64", dataset="xsum", nfe=64,
                            backend=JudgeBackendSettings(local="smollm2"), config=JudgeConfig(n=100)))

The command line only parses its flags (and the judge prompt file) into these settings (`judge_cli.cmd_judge`);
`judge_run.judge_runs` judges two loaded runs.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

from .judge import JudgeConfig, RunSamples, check_same_samples, samples_from_records
from .judge_backends import JudgeBackend

__all__ = ["JudgeBackendSettings", "JudgeSettings", "load_prompt_file", "run_judge"]


@dataclass(frozen=True)
class JudgeBackendSettings:
    """Which judge answers: an OpenAI-compatible endpoint (`endpoint` and `judge_model`) or a local chat model
    (`local`), exactly one."""

    endpoint: str | None = None
    """OpenAI-compatible base URL, e.g. https://host/v1."""
    judge_model: str | None = None
    """Model name sent to the endpoint."""
    api_key_env: str | None = None
    """Name of the environment variable holding the endpoint's API key."""
    concurrency: int = 8
    """Concurrent endpoint calls."""
    retries: int = 3
    """Retries per endpoint call, with exponential back-off."""
    local: str | None = None
    """Local Hugging Face chat model folder ('smollm2' = the offline SmolLM2-135M)."""
    gguf_file: str | None = None
    """GGUF file inside `local`."""
    max_tokens: int = 400
    """Reply token budget."""
    constrained: bool = True
    """`local`: constrain the reply to the JSON format (scores 1-5, verdict A/B/tie chosen by the model's token
    probabilities, so every reply parses); False lets the model write free text."""

    def __post_init__(self) -> None:
        if (self.endpoint is None) == (self.local is None):
            raise ValueError("give exactly one judge back-end: --endpoint URL --judge-model NAME, or --local FOLDER")
        if self.endpoint is not None and not self.judge_model:
            raise ValueError("--endpoint needs --judge-model NAME (the model the endpoint should run)")

    def build(self) -> JudgeBackend:
        """The back-end (a local model is loaded here)."""
        from .judge_backends import LocalChatBackend, OpenAIChatBackend

        if self.endpoint is not None:
            return OpenAIChatBackend(self.endpoint, str(self.judge_model), api_key_env=self.api_key_env,
                                     max_tokens=self.max_tokens, retries=self.retries, concurrency=self.concurrency)
        if self.local == "smollm2":
            return LocalChatBackend.smollm2(max_new_tokens=self.max_tokens, constrained=self.constrained)
        return LocalChatBackend(str(self.local), gguf_file=self.gguf_file, max_new_tokens=self.max_tokens,
                                constrained=self.constrained)


@dataclass(frozen=True)
class JudgeSettings:
    """One `eval judge`: the two runs, which of their records are judged, the judge and the output folder."""

    run_a: str
    """Run folder or JSONL result file of system A."""
    run_b: str
    """Run folder or JSONL result file of system B."""
    out: str
    """Output folder (judge_config.json, judgments.jsonl, summary.json/.md); the same settings resume."""
    backend: JudgeBackendSettings
    config: JudgeConfig = field(default_factory=JudgeConfig)
    """Pairing, presentation, parsing and aggregation (`n`, `seed`, `both_orders`, `parse_mode`, ...)."""
    task: str = "summarization"
    """Task whose records are judged."""
    dataset: str | None = None
    """Keep records of this dataset (needed when the runs hold several)."""
    nfe: int | None = None
    """Keep records at this NFE."""
    method_a: str | None = None
    """Keep run A's records of this method."""
    method_b: str | None = None
    """Keep run B's records of this method."""
    run_seed: int | None = None
    """Keep records of this sampling seed (runs with several)."""
    overwrite: bool = False
    """Restart a judge run in `out` that has other settings."""
    progress: bool = True


def load_prompt_file(path: str | Path) -> tuple[str, str]:
    """(system prompt, user template) from a JSON file {"system", "user"} or a text file whose line '---'
    separates the system prompt from the user template."""
    p = Path(path)
    if not p.is_file():
        raise ValueError(f"--judge-prompt-file {str(p)!r} does not exist")
    text = p.read_text(encoding="utf-8")
    if p.suffix == ".json":
        try:
            d = json.loads(text)
        except json.JSONDecodeError as e:
            raise ValueError(f"--judge-prompt-file {p}: not valid JSON ({e.msg}, line {e.lineno})") from None
        if not (isinstance(d, dict) and isinstance(d.get("system"), str) and isinstance(d.get("user"), str)):
            raise ValueError(f"--judge-prompt-file {p}: needs string fields 'system' and 'user'")
        return d["system"], d["user"]
    lines = text.split("\n")
    if "---" not in [x.strip() for x in lines]:
        raise ValueError(f"--judge-prompt-file {p}: no line '---' between the system prompt and the user template")
    k = [x.strip() for x in lines].index("---")
    return "\n".join(lines[:k]).strip("\n"), "\n".join(lines[k + 1:]).strip("\n")


def _load_runs(s: JudgeSettings) -> tuple[RunSamples, RunSamples]:
    """Both runs' samples after the filters; refuses runs of different datasets (without a `dataset` filter), a run
    with nothing left to judge, and runs holding other samples under the same ids (`check_same_samples`)."""
    from .judge_run import read_records

    loaded = [[r for r in read_records(p) if r.get("task", s.task) == s.task] for p in (s.run_a, s.run_b)]
    datasets = [{r["dataset"] for r in recs if r.get("dataset") is not None} for recs in loaded]
    if s.dataset is None and datasets[0] and datasets[1] and datasets[0] != datasets[1]:
        raise ValueError(f"the runs hold different datasets ({sorted(datasets[0])} vs {sorted(datasets[1])}); "
                         "pick one with --dataset")
    runs = []
    for path, method, recs in ((s.run_a, s.method_a, loaded[0]), (s.run_b, s.method_b, loaded[1])):
        name = Path(path).name if not method else f"{Path(path).name}:{method}"
        run = samples_from_records(recs, name=name, dataset=s.dataset, nfe=s.nfe, method=method, seed=s.run_seed)
        if not run.samples:
            raise ValueError(f"{path}: no {s.task} records with an output and a reference"
                             f"{f' for dataset {s.dataset!r}' if s.dataset else ''}{f' at NFE {s.nfe}' if s.nfe else ''}")
        runs.append(run)
    check_same_samples(runs[0].samples, runs[1].samples)
    return runs[0], runs[1]


def run_judge(settings: JudgeSettings) -> int:
    """Judge run A against run B; prints the summary's main figures as one JSON line and where summary.md is.
    Returns 1 when the win rate was withheld (too few replies parsed; the reason on stderr), else 0."""
    from .judge_run import judge_runs

    s = settings
    run_a, run_b = _load_runs(s)  # every check on the runs before a local judge model is loaded
    backend = s.backend.build()
    filters = {"task": s.task, "dataset": s.dataset, "nfe": s.nfe, "method_a": s.method_a, "method_b": s.method_b,
               "run_seed": s.run_seed}
    summary = judge_runs(run_a, run_b, backend, s.out, s.config, filters=filters, progress=s.progress,
                         overwrite=s.overwrite)
    print(json.dumps({k: summary.get(k) for k in ("n_parsed", "n_unparsed", "parse_rate", "win", "win_ci95", "tie",
                                                  "loss", "shown_a_rate")}))
    print(f"wrote {Path(s.out) / 'summary.md'}")
    if summary.get("refused"):
        print(f"error: {summary['refused']}", file=sys.stderr)
        return 1
    return 0
