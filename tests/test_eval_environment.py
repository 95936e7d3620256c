"""An eval run folder carries the environment record of every run/resume; its report prints intervals and a footer."""

from __future__ import annotations

import json

import pytest
from eval_fixtures import base_config, data_dir, eval_models  # noqa: F401  (session fixture)

from dsl_llada.eval.eval_config import EvalConfig
from dsl_llada.eval.runner import run_eval

pytestmark = pytest.mark.usefixtures("one_thread")


def test_run_folder_records_each_run_and_the_report_shows_intervals(eval_models, tmp_path):  # noqa: F811
    d = data_dir()
    task = {"name": "reasoning", "datasets": [{"name": "gsm8k", "path": str(d / "gsm8k_test.jsonl"), "limit": 3,
                                               "gen_length": 8}]}
    cfg = EvalConfig.from_dict(base_config(eval_models, [task], methods=[{"name": "LLaDA", "model": "llada",
                                                                          "preset": "llada"}]))
    run = tmp_path / "run"
    run_eval(cfg, run, progress=False)
    envs = [json.loads(x) for x in (run / "environment.jsonl").read_text().splitlines()]
    assert len(envs) == 1 and envs[0]["n_run"] == 3 and envs[0]["seeds"] == [42]
    assert envs[0]["threads"]["intra_op"] == 1 and envs[0]["cpu_capability"] and "load_average_end" in envs[0]
    run_eval(cfg, run, progress=False)  # a resume with nothing left to do is recorded too
    summary = json.loads((run / "summary.json").read_text())
    assert [e["n_run"] for e in summary["environments"]] == [3, 0]
    row = summary["tasks"]["reasoning"]["rows"][0]
    lo, hi = row["acc_ci"]
    assert lo <= row["acc"] <= hi and row["acc_ci"] == row["acc_default_ci"]
    md = (run / "summary.md").read_text()
    assert f"{row['acc']:.1f} [{lo:.1f}, {hi:.1f}]" in md
    assert "Environment: dsl-llada" in md and "(2 runs/resumes; all in environment.jsonl)" in md
