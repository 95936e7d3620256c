"""Every check before the first item and before anything is written (one line,
exit 2, no run folder), and a run whose items mostly error exits non-zero naming the most common error."""

from __future__ import annotations

import json

import pytest
from eval_fixtures import base_config, data_dir, eval_models  # noqa: F401  (session fixture)

from dsl_llada.cli.main import main
from dsl_llada.eval import preflight as P
from dsl_llada.errors import ConfigError

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture
def models(eval_models):  # noqa: F811
    return eval_models


def _run(tmp_path, capsys, cfg: dict, *extra: str) -> tuple[int, list[str]]:
    path = tmp_path / "cfg.json"
    path.write_text(json.dumps(cfg))
    rc = main(["eval", "run", "--config", str(path), "--out", str(tmp_path / "run"), "-q", *extra])
    return rc, capsys.readouterr().err.strip().splitlines()


def gen(limit=2, gen_length=8, **opts):
    return {"name": "generation", "options": opts, "datasets": [
        {"name": "p", "path": str(data_dir() / "prompts_200.jsonl"), "kind": "prompts", "limit": limit,
         "gen_length": gen_length}]}


def test_data_ids_beyond_the_model_vocabulary_are_refused_before_the_folder(models, tmp_path, capsys):
    """wikitext_texts_100's LLaDA ids (up to 82,902) on a model with 320 ids: exit 2, one line, no folder."""
    for name, opts in (("correction", {"use_token_ids": True, "rates": [0.3]}), ("probes", {"use_token_ids": True})):
        task = {"name": name, "options": opts,
                "datasets": [{"name": "wikitext", "path": str(data_dir() / "wikitext_texts_100.jsonl"), "limit": 5}]}
        rc, err = _run(tmp_path, capsys, base_config(models, [task]))
        assert rc == 2 and len(err) == 1, err
        assert "outside model 'dsl''s vocabulary of 320 ids" in err[0] and "drop use_token_ids" in err[0]
        assert not (tmp_path / "run").exists()
    task = {"name": "correction", "options": {"id_range": [100, 126000], "rates": [0.3]},
            "datasets": [{"name": "wikitext", "path": str(data_dir() / "wikitext_texts_100.jsonl"), "limit": 5}]}
    rc, err = _run(tmp_path, capsys, base_config(models, [task]))
    assert rc == 2 and "id_range [100, 126000] does not fit model 'dsl'" in err[0] and not (tmp_path / "run").exists()


def test_device_cuda_without_cuda(models, tmp_path, capsys):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    rc, err = _run(tmp_path, capsys, base_config(models, [gen()]), "device=cuda")
    assert rc == 2 and err == ["error: device='cuda' but this machine has no usable CUDA device "
                               "(torch.cuda.is_available() is False); use device=cpu or leave device unset"]
    assert not (tmp_path / "run").exists()
    rc, err = _run(tmp_path, capsys, base_config(models, [gen()]), "device=tpu")
    assert rc == 2 and "device='tpu'" in err[0] and len(err) == 1


def test_context_baseline_and_optional_scorers(models, tmp_path, capsys):
    rc, err = _run(tmp_path, capsys, base_config(models, [gen(gen_length=3000)]))
    assert rc == 2 and len(err) == 1 and "more than model 'dsl''s context of 2048" in err[0]
    summ = {"name": "summarization", "options": {"baseline": "LLaDa"},
            "datasets": [{"name": "xsum", "path": str(data_dir() / "summ_xsum.jsonl"), "limit": 2, "gen_length": 8}]}
    rc, err = _run(tmp_path, capsys, base_config(models, [summ]))
    assert rc == 2 and "baseline='LLaDa' is not one of this task's methods ['DSL-SDE', 'LLaDA']" in err[0]
    import importlib.util

    if importlib.util.find_spec("mauve") is None:
        rc, err = _run(tmp_path, capsys, base_config(models, [gen(mauve=True)]))
        assert rc == 2 and "needs the package 'mauve-text'" in err[0]
    assert not (tmp_path / "run").exists()


def test_model_checks_run_before_the_folder(models, tmp_path, capsys):
    cfg = base_config(models, [gen()], methods=[{"name": "S", "model": "llada", "preset": "dsl-sde"}])
    rc, err = _run(tmp_path, capsys, cfg)
    assert rc == 2 and "needs a DSL checkpoint" in err[0] and not (tmp_path / "run").exists()
    # then the corrected config starts cleanly in the same folder (nothing was written by the refused attempt)
    rc, _ = _run(tmp_path, capsys, base_config(models, [gen()], methods=[{"name": "S", "model": "dsl",
                                                                           "preset": "dsl-sde"}]))
    assert rc == 0 and (tmp_path / "run" / "records.jsonl").exists()


def test_multi_process_launch_without_distributed_mode_is_refused():
    launch = ["/venv/bin/python", "/venv/bin/accelerate", "launch", "--cpu", "--num_processes", "2", "-m", "dsl_llada"]
    assert P.requested_processes(launch) == 2
    assert P.requested_processes(["/venv/bin/accelerate", "launch", "--num_processes=4", "x.py"]) == 4
    assert P.requested_processes(["python", "-m", "dsl_llada", "eval"]) is None
    with pytest.raises(ConfigError, match=r"--num_processes 2 but the evaluation runs as 1 process .* "
                                          r"`accelerate launch --multi_gpu --num_processes 2 -m dsl_llada eval run"):
        P.check_world(1, 2)
    P.check_world(2, 2)
    P.check_world(1, None)
    P.check_world(1, 1)


def test_a_run_where_every_item_errors_exits_nonzero(models, tmp_path, capsys, monkeypatch):
    from dsl_llada.eval import models as M
    from dsl_llada.sampling.engine import Engine

    def broken(*a, **k):
        raise RuntimeError("sampler exploded")

    monkeypatch.setattr(M, "run_batch", broken)  # the fixed batches' sampler call
    monkeypatch.setattr(Engine, "_forward", broken)  # the engine's batched forward
    cfg = base_config(models, [gen(limit=3)], methods=[{"name": "LLaDA", "model": "llada", "preset": "llada"}])
    rc, err = _run(tmp_path, capsys, cfg)
    assert rc == 1 and err == ["error: task generation: 3 of 3 items errored (100.0 % > --max-error-rate 5 %); "
                               "most common (3x): RuntimeError: sampler exploded"]
    s = json.loads((tmp_path / "run" / "summary.json").read_text())  # the work is kept and reported
    assert s["errors_by_task"]["generation"]["errors"] == 3 and s["tasks"]["generation"]["n_errors"] == 3
    assert "| generation | 3 | 3 | 100.0 | RuntimeError: sampler exploded (×3) |" in \
        (tmp_path / "run" / "summary.md").read_text()
    monkeypatch.undo()
    rc, _ = _run(tmp_path, capsys, cfg, "--max-error-rate", "1.0")  # resume: nothing new runs, rate allowed
    assert rc == 0
    rc, err = _run(tmp_path, capsys, cfg, "--max-error-rate", "2")
    assert rc == 2 and "--max-error-rate=2.0 must be a fraction in [0, 1]" in err[0]
