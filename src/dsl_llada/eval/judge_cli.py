"""`dsl-llada eval judge RUN_A RUN_B …`: the pairwise LLM judge from the command line."""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def add_judge_parser(sub) -> argparse.ArgumentParser:
    j = sub.add_parser("judge", help="pairwise LLM judge of two runs' summaries (win/tie/loss with bootstrap CIs)",
                       description="Judge run A against run B on their common samples (paper protocol: 100 samples "
                                   "shuffled with Random(42), a random presentation order per sample).")
    j.add_argument("run_a", help="run folder or JSONL result file of system A")
    j.add_argument("run_b", help="run folder or JSONL result file of system B")
    j.add_argument("--task", default="summarization", help="task whose records are judged (default summarization)")
    j.add_argument("--dataset", default=None, help="keep records of this dataset (e.g. xsum)")
    j.add_argument("--nfe", type=int, default=None, help="keep records at this NFE")
    j.add_argument("--method-a", default=None, help="keep run A's records of this method")
    j.add_argument("--method-b", default=None, help="keep run B's records of this method")
    j.add_argument("--run-seed", type=int, default=None, help="keep records of this sampling seed (runs with several)")
    j.add_argument("--out", required=True, help="output folder (judgments.jsonl, summary.json/.md); resumable")
    j.add_argument("--n", type=int, default=100, help="samples judged (default 100)")
    j.add_argument("--seed", type=int, default=42, help="shuffle/swap seed (default 42)")
    j.add_argument("--both-orders", action="store_true", help="judge each sample in both presentation orders")
    j.add_argument("--include-source", action="store_true", help="show the source document (not the paper's protocol)")
    j.add_argument("--parse-mode", default="robust", choices=["robust", "authors"],
                   help="robust: first valid JSON object; authors: one greedy {...} span (their parser)")
    j.add_argument("--resamples", type=int, default=10_000, help="bootstrap resamples (default 10000)")
    j.add_argument("--judge-prompt-file", default=None, metavar="FILE",
                   help="your own judge prompt (e.g. the authors'): JSON {\"system\": ..., \"user\": ...}, or text with "
                        "the system prompt, a line '---', then the user template; the template needs {reference}, "
                        "{candidate_a}, {candidate_b} (optionally {source}). Default: ours (docs/evaluation.md)")
    j.add_argument("--min-parse-rate", type=float, default=0.9,
                   help="withhold the win rate when fewer replies than this share parsed (default 0.9)")
    back = j.add_argument_group("judge back-end (one of)")
    back.add_argument("--endpoint", default=None, help="OpenAI-compatible base URL, e.g. https://host/v1")
    back.add_argument("--judge-model", default=None, help="model name sent to the endpoint")
    back.add_argument("--api-key-env", default=None, help="NAME of the environment variable holding the API key")
    back.add_argument("--concurrency", type=int, default=8, help="concurrent endpoint calls (default 8)")
    back.add_argument("--retries", type=int, default=3, help="retries per call with exponential back-off (default 3)")
    back.add_argument("--local", default=None, help="local HF chat model folder ('smollm2' = the offline SmolLM2-135M)")
    back.add_argument("--gguf-file", default=None, help="GGUF file inside --local")
    back.add_argument("--max-tokens", type=int, default=400, help="reply token budget (default 400)")
    back.add_argument("--unconstrained", action="store_true",
                      help="--local: let the model write free text (default: constrained to the JSON format, scores "
                           "1-5 and verdict A/B/tie chosen by the model's token probabilities, so every reply parses)")
    j.add_argument("--overwrite", action="store_true", help="restart a judge run in --out that has other settings")
    j.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    j.set_defaults(func=cmd_judge)
    return j


def make_backend(a: argparse.Namespace):
    from .judge_backends import LocalChatBackend, OpenAIChatBackend

    if (a.endpoint is None) == (a.local is None):
        raise ValueError("give exactly one judge back-end: --endpoint URL --judge-model NAME, or --local FOLDER")
    if a.endpoint is not None:
        if not a.judge_model:
            raise ValueError("--endpoint needs --judge-model NAME (the model the endpoint should run)")
        return OpenAIChatBackend(a.endpoint, a.judge_model, api_key_env=a.api_key_env, max_tokens=a.max_tokens,
                                 retries=a.retries, concurrency=a.concurrency)
    if a.local == "smollm2":
        return LocalChatBackend.smollm2(max_new_tokens=a.max_tokens, constrained=not a.unconstrained)
    return LocalChatBackend(a.local, gguf_file=a.gguf_file, max_new_tokens=a.max_tokens,
                            constrained=not a.unconstrained)


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


def cmd_judge(a: argparse.Namespace) -> int:
    from .judge import JudgeConfig, samples_from_records
    from .judge_run import read_records, run_judge

    system, user = load_prompt_file(a.judge_prompt_file) if a.judge_prompt_file else (None, None)
    config = JudgeConfig(n=a.n, seed=a.seed, both_orders=a.both_orders, include_source=a.include_source,
                         parse_mode=a.parse_mode, bootstrap_resamples=a.resamples, system_prompt=system,
                         user_template=user, min_parse_rate=a.min_parse_rate)
    loaded = [[r for r in read_records(p) if r.get("task", a.task) == a.task] for p in (a.run_a, a.run_b)]
    datasets = [{r["dataset"] for r in recs if r.get("dataset") is not None} for recs in loaded]
    if a.dataset is None and datasets[0] and datasets[1] and datasets[0] != datasets[1]:
        raise ValueError(f"the runs hold different datasets ({sorted(datasets[0])} vs {sorted(datasets[1])}); "
                         "pick one with --dataset")
    runs = []
    for path, method, recs in ((a.run_a, a.method_a, loaded[0]), (a.run_b, a.method_b, loaded[1])):
        name = Path(path).name if not method else f"{Path(path).name}:{method}"
        run = samples_from_records(recs, name=name, dataset=a.dataset, nfe=a.nfe, method=method, seed=a.run_seed)
        if not run.samples:
            raise ValueError(f"{path}: no {a.task} records with an output and a reference"
                             f"{f' for dataset {a.dataset!r}' if a.dataset else ''}{f' at NFE {a.nfe}' if a.nfe else ''}")
        runs.append(run)
    backend = make_backend(a)
    filters = {"task": a.task, "dataset": a.dataset, "nfe": a.nfe, "method_a": a.method_a, "method_b": a.method_b,
               "run_seed": a.run_seed}
    summary = run_judge(runs[0], runs[1], backend, a.out, config, filters=filters, progress=not a.quiet,
                        overwrite=a.overwrite)
    print(json.dumps({k: summary.get(k) for k in ("n_parsed", "n_unparsed", "parse_rate", "win", "win_ci95", "tie",
                                                  "loss", "shown_a_rate")}))
    print(f"wrote {Path(a.out) / 'summary.md'}")
    if summary.get("refused"):
        import sys

        print(f"error: {summary['refused']}", file=sys.stderr)
        return 1
    return 0
