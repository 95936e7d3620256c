"""Running a pairwise judge: resumable JSON lines keyed by sample id, bounded concurrency, summary files.

Output folder:
    judge_config.json   the JudgeConfig, the back-end description, the two runs and their filters
    judgments.jsonl     one line per judged presentation (appended, flushed and fsynced as each finishes)
    summary.json / summary.md   the aggregate (rewritten at the end of every run)
A re-run with the same settings skips the presentations already in judgments.jsonl (a partial last line from a
killed run is ignored and overwritten); different settings are refused, naming the fields.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from ..artifacts import jsonl_log
from ..artifacts.atomic import atomic_write_text
from .judge import JudgeConfig, Pair, RunSamples, aggregate, build_messages, judgment_record, pair_samples, render_summary
from .judge_backends import JudgeBackend, JudgeBackendError

log = logging.getLogger(__name__)

CONFIG_NAME, JUDGMENTS_NAME = "judge_config.json", "judgments.jsonl"


def read_records(path: str | Path) -> list[dict[str, Any]]:
    """Result records from a JSONL file, or from a run folder (its `records.jsonl`, else every `*.jsonl` in it).
    A torn last line (a killed writer) is skipped; any other bad line is an error naming file and line."""
    path = Path(path)
    if path.is_dir():
        files = [path / "records.jsonl"] if (path / "records.jsonl").exists() else sorted(path.glob("*.jsonl"))
        if not files:
            raise ValueError(f"{path}: no records.jsonl or *.jsonl result file in this folder")
    elif path.is_file():
        files = [path]
    else:
        raise ValueError(f"{path}: no such run folder or JSONL file")
    out: list[dict[str, Any]] = []
    for f in files:
        lines = f.read_text(encoding="utf-8").split("\n")
        for i, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as e:
                if i == len(lines):  # last line without a newline: a torn append
                    break
                raise ValueError(f"{f}:{i}: not a JSON line ({e.msg})") from None
            if isinstance(rec, dict):
                out.append(rec)
    return out


def _done_keys(path: Path) -> dict[str, dict[str, Any]]:
    """Judgments already written, keyed by presentation (`jsonl_log.read`; a torn last line is ignored here and
    cut off when the writer opens)."""
    records, _ = jsonl_log.read(path, strict=False, accept=lambda r: isinstance(r, dict) and "key" in r)
    return jsonl_log.done_keys(records, "key")


def prepare_judge_dir(out: Path, settings: dict[str, Any], *, overwrite: bool) -> None:
    """Create the folder or check that it holds a judge run with the same settings."""
    cfg_path = out / CONFIG_NAME
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {out} is a file; give a folder")
    if cfg_path.exists():
        old = json.loads(cfg_path.read_text())
        diff = sorted(k for k in set(old) | set(settings) if old.get(k) != settings.get(k))
        if diff and not overwrite:
            raise ValueError(f"{out} holds a judge run with different settings ({', '.join(diff)}); "
                             "use another --out, or --overwrite to start it again")
        if diff:
            for name in (JUDGMENTS_NAME, "summary.json", "summary.md"):
                (out / name).unlink(missing_ok=True)
    elif out.exists() and any(out.iterdir()) and not overwrite:
        raise ValueError(f"--out {out} is a non-empty folder that is not a judge run; use an empty or new folder")
    out.mkdir(parents=True, exist_ok=True)
    probe = out / ".write-test"
    try:
        probe.write_text("")
        probe.unlink()
    except OSError as e:
        raise ValueError(f"--out {out} is not writable ({e.strerror})") from None
    atomic_write_text(cfg_path, json.dumps(settings, indent=2, sort_keys=True))


def judge_runs(run_a: RunSamples, run_b: RunSamples, backend: JudgeBackend, out: str | Path, config: JudgeConfig, *,
               filters: dict[str, Any] | None = None, overwrite: bool = False, progress: bool = True,
               on_judgment: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
    """Judge run A against run B and write the output folder; returns the summary (the whole command, from run
    folders on disk: `judge_command.run_judge`)."""
    out = Path(out)
    pairs = pair_samples(run_a.samples, run_b.samples, config)
    settings = {"config": config.to_dict(), "backend": backend.describe(), "run_a": run_a.name, "run_b": run_b.name,
                "filters": filters or {}}
    prepare_judge_dir(out, settings, overwrite=overwrite)
    jpath = out / JUDGMENTS_NAME
    done = _done_keys(jpath)
    todo = [p for p in pairs if p.key not in done]
    if done:
        log.info("resuming: %d of %d judgments already done", len(pairs) - len(todo), len(pairs))

    def judge_one(pair: Pair) -> dict[str, Any]:
        try:
            reply = backend(build_messages(pair, include_source=config.include_source,
                                           system_prompt=config.system_prompt, user_template=config.user_template))
        except JudgeBackendError as e:
            return judgment_record(pair, None, mode=config.parse_mode, error=str(e))
        return judgment_record(pair, reply, mode=config.parse_mode)

    with jsonl_log.JsonlAppender(jpath) as fh, \
            tqdm(total=len(todo), desc="judge", disable=not progress, leave=False, dynamic_ncols=True) as bar:
        if backend.concurrency <= 1:
            for pair in todo:
                rec = judge_one(pair)
                fh.append([rec])
                done[rec["key"]] = rec
                bar.update(1)
                if on_judgment:
                    on_judgment(rec)
        else:
            with ThreadPoolExecutor(max_workers=backend.concurrency) as pool:
                futures = [pool.submit(judge_one, p) for p in todo]
                for fut in as_completed(futures):
                    rec = fut.result()
                    fh.append([rec])
                    done[rec["key"]] = rec
                    bar.update(1)
                    if on_judgment:
                        on_judgment(rec)
    records = [done[p.key] for p in pairs if p.key in done]
    summary = aggregate(records, resamples=config.bootstrap_resamples, seed=config.bootstrap_seed,
                        min_parse_rate=config.min_parse_rate)
    summary.update({"run_a": run_a.name, "run_b": run_b.name, **(filters or {})})
    atomic_write_text(out / "summary.json", json.dumps(summary, indent=2, sort_keys=True))
    atomic_write_text(out / "summary.md", render_summary(summary, name_a=run_a.name, name_b=run_b.name))
    return summary
