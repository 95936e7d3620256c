"""`dsl-llada eval judge RUN_A RUN_B …`: the pairwise LLM judge from the command line; the flags are parsed into
`judge_command.JudgeSettings` and the job is `judge_command.run_judge`."""

from __future__ import annotations

import argparse


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


def cmd_judge(a: argparse.Namespace) -> int:
    """Parse the flags (and the judge prompt file) into JudgeSettings and run the library's `run_judge`."""
    from ..eval.judge import JudgeConfig
    from ..eval.judge_command import JudgeBackendSettings, JudgeSettings, load_prompt_file, run_judge

    system, user = load_prompt_file(a.judge_prompt_file) if a.judge_prompt_file else (None, None)
    config = JudgeConfig(n=a.n, seed=a.seed, both_orders=a.both_orders, include_source=a.include_source,
                         parse_mode=a.parse_mode, bootstrap_resamples=a.resamples, system_prompt=system,
                         user_template=user, min_parse_rate=a.min_parse_rate)
    backend = JudgeBackendSettings(endpoint=a.endpoint, judge_model=a.judge_model, api_key_env=a.api_key_env,
                                   concurrency=a.concurrency, retries=a.retries, local=a.local, gguf_file=a.gguf_file,
                                   max_tokens=a.max_tokens, constrained=not a.unconstrained)
    return run_judge(JudgeSettings(a.run_a, a.run_b, a.out, backend, config, task=a.task, dataset=a.dataset,
                                   nfe=a.nfe, method_a=a.method_a, method_b=a.method_b, run_seed=a.run_seed,
                                   overwrite=a.overwrite, progress=not a.quiet))
