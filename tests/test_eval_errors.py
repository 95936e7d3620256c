"""Bad input to `dsl-llada eval`: one clear error naming the value, before any model is loaded."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from eval_fixtures import base_config, data_dir, eval_models  # noqa: F401  (session fixture)

from dsl_llada.cli.main import main
from dsl_llada.config import ConfigError
from dsl_llada.eval.eval_config import EvalConfig, apply_overrides, load_eval_config
from dsl_llada.eval.samples import DataError
from dsl_llada.eval.runner import run_eval


@pytest.fixture
def models(eval_models):  # noqa: F811
    """The session's tiny model folders."""
    return eval_models


def task(path, **kw) -> dict:
    return {"name": "generation", "datasets": [{"name": "p", "path": str(path), "kind": "prompts", "gen_length": 8, **kw}]}


def test_config_round_trip_and_overrides(models):
    cfg = EvalConfig.from_dict(base_config(models, [task(data_dir() / "prompts_200.jsonl", limit=3)]))
    assert EvalConfig.from_dict(json.loads(json.dumps(cfg.to_dict()))) == cfg
    d = apply_overrides(cfg.to_dict(), ["nfe=[8,16]", "tasks.generation.datasets.p.limit=7", "methods.LLaDA.options.eos_inf=true",
                                        "batch_size=2"])
    new = EvalConfig.from_dict(d)
    assert new.nfe == (8, 16) and new.tasks[0].datasets[0].limit == 7 and new.batch_size == 2
    assert new.method("LLaDA").options == {"eos_inf": True}
    with pytest.raises(ConfigError, match="no list element named or numbered 'nope'"):
        apply_overrides(cfg.to_dict(), ["methods.nope.options.eta=0"])


@pytest.mark.parametrize("change, message", [
    ({"batch_size": 0}, "batch_size=0 must be >= 1"),
    ({"scoring_mode": "paper"}, "scoring_mode='paper' is not valid; expected one of ['default', 'authors']"),
    ({"methods": [{"name": "X", "model": "nope", "preset": "llada"}]}, "model='nope' is not one of the models"),
    ({"methods": [{"name": "X", "model": "dsl", "preset": "sde"}]}, "preset='sde' is not valid"),
    ({"tasks": [{"name": "translation", "datasets": []}]}, "task 'translation' is not valid"),
    ({"colour": 1}, "unknown EvalConfig field(s) ['colour']"),
])
def test_bad_config_values(models, change, message):
    with pytest.raises(ConfigError) as e:
        EvalConfig.from_dict({**base_config(models, [task(data_dir() / "prompts_200.jsonl")]), **change})
    assert message in str(e.value)


def test_nfe_a_method_cannot_take(models, tmp_path):
    cfg = EvalConfig.from_dict(base_config(models, [task(data_dir() / "prompts_200.jsonl", limit=2)], nfe=[5]))
    with pytest.raises(ConfigError, match=r"'DSL-SDE' \(dsl-sde\) cannot take NFE 5: .* even"):
        run_eval(cfg, tmp_path / "run", progress=False)
    blk = [{"name": "Block", "model": "dsl", "preset": "block-sde", "options": {"block_length": 4}}]
    cfg = EvalConfig.from_dict(base_config(models, [task(data_dir() / "prompts_200.jsonl", limit=2)], nfe=[8], methods=blk))
    with pytest.raises(ConfigError, match=r"2 blocks of 4\) cannot take NFE 8: .* e\.g\. \[6, 10, 18"):
        run_eval(cfg, tmp_path / "run", progress=False)
    assert not (tmp_path / "run").exists()  # refused before the folder was touched


def test_data_errors(models, tmp_path):
    missing = EvalConfig.from_dict(base_config(models, [task(tmp_path / "absent.jsonl")]))
    with pytest.raises(DataError, match="absent.jsonl' does not exist"):
        run_eval(missing, tmp_path / "r1", progress=False)
    no_field = EvalConfig.from_dict(base_config(models, [task(data_dir() / "prompts_200.jsonl", fields={"prompt": "text"})]))
    with pytest.raises(DataError,
                       match=r"field 'text' \(for 'prompt'\) is not in the rows; fields present: \['category', 'id', 'prompt'\]"):
        run_eval(no_field, tmp_path / "r2", progress=False)
    empty = EvalConfig.from_dict(base_config(models, [task(data_dir() / "prompts_200.jsonl", offset=500)]))
    with pytest.raises(DataError, match=r"has no usable rows \(200 rows read, offset=500"):
        run_eval(empty, tmp_path / "r3", progress=False)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "a"}\n{"prompt": \n')
    with pytest.raises(DataError, match=r"bad.jsonl:2: not valid JSON"):
        run_eval(EvalConfig.from_dict(base_config(models, [task(bad)])), tmp_path / "r4", progress=False)


def test_bare_backbone_cannot_run_the_sde(models, tmp_path):
    cfg = EvalConfig.from_dict(base_config(models, [task(data_dir() / "prompts_200.jsonl", limit=2)],
                                           methods=[{"name": "S", "model": "llada", "preset": "dsl-sde"}]))
    with pytest.raises(ConfigError, match="needs a DSL checkpoint .* 'llada' .* is a bare backbone"):
        run_eval(cfg, tmp_path / "run", progress=False)


def test_cli_help_and_error_exit(models, tmp_path, capsys):
    with pytest.raises(SystemExit):
        main(["eval", "run", "--help"])
    out = capsys.readouterr().out
    for opt in ("--config", "--out", "--overwrite", "--new-run", "--no-report", "--batching", "KEY=VALUE",
                "accelerate launch", "--max-error-rate", "exit codes: 0 done, 1 more than --max-error-rate"):
        assert opt in out
    with pytest.raises(SystemExit):
        main(["eval", "report", "--help"])
    assert "--mode" in capsys.readouterr().out
    cfg = tmp_path / "c.json"
    cfg.write_text(json.dumps(base_config(models, [task(tmp_path / "absent.jsonl")])))
    assert main(["eval", "run", "--config", str(cfg), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: data file") and "absent.jsonl' does not exist" in err[0]
    assert main(["eval", "run", "--config", str(cfg), "nfe=[8]", "--print-config"]) == 0
    assert json.loads(capsys.readouterr().out)["nfe"] == [8]
    assert main(["eval", "report", str(tmp_path / "nothing")]) == 2
    assert "is not a `dsl-llada eval run` folder" in capsys.readouterr().err
    assert load_eval_config(cfg).nfe == (4,)


def test_every_preset_is_valid():
    """Each shipped preset parses, and every (method, NFE, dataset length) it asks for is one the method can take."""
    from dsl_llada.eval.methods import sampler_for
    from dsl_llada.eval.tasks import get_task

    presets = sorted((Path(__file__).resolve().parents[1] / "configs" / "eval").glob("*.yaml"))
    assert len(presets) >= 9
    for p in presets:
        cfg = load_eval_config(p)
        for t in cfg.tasks:
            task = get_task(t.name)
            task.check_options({k: v for k, v in t.options.items() if k not in ("scorer", "bertscore")})
            if not getattr(task, "sampling", True):
                continue
            for ds in t.datasets:
                for m in cfg.task_methods(t):
                    for n in cfg.method_nfes(m):
                        sampler_for(m, n, task.gen_length(ds))


def test_scorer_folders_are_checked_before_the_run(models, tmp_path):
    from dsl_llada.eval.scorers.bertscore import BERTScoreError
    from dsl_llada.eval.scorers.genppl import ScorerError

    gen = task(data_dir() / "prompts_200.jsonl", limit=2)
    gen["options"] = {"scorer": {"path": str(tmp_path / "no-gpt2")}}
    with pytest.raises(ScorerError, match="no-gpt2' does not exist"):
        run_eval(EvalConfig.from_dict(base_config(models, [gen])), tmp_path / "r1", progress=False)
    gen["options"] = {"scorer": {"path": str(models["tok"])}}  # a folder, but no causal LM in it
    with pytest.raises(ScorerError, match="has no config.json: not a Hugging Face causal LM"):
        run_eval(EvalConfig.from_dict(base_config(models, [gen])), tmp_path / "r2", progress=False)
    gen["options"] = {"scorer": {"path": str(models["llada"])}}  # a model folder, but not a causal LM
    with pytest.raises(ScorerError, match="is not a causal LM \\(model_type 'llada'"):
        run_eval(EvalConfig.from_dict(base_config(models, [gen])), tmp_path / "r2", progress=False)
    summ = {"name": "summarization", "options": {"bertscore": {"model_dir": str(tmp_path / "no-roberta"), "num_layers": 17}},
            "datasets": [{"name": "xsum", "path": str(data_dir() / "summ_xsum.jsonl"), "limit": 2}]}
    with pytest.raises(BERTScoreError, match="no-roberta does not exist"):
        run_eval(EvalConfig.from_dict(base_config(models, [summ])), tmp_path / "r3", progress=False)
    assert not any((tmp_path / r).exists() for r in ("r1", "r2", "r3"))


def test_tokenizer_without_the_mask_id(models, tmp_path):
    import shutil

    from eval_fixtures import train_tokenizer

    small = tmp_path / "small-tok"
    train_tokenizer(small, vocab_size=280)
    shutil.copytree(models["llada"], tmp_path / "model")
    cfg = json.loads((tmp_path / "model" / "config.json").read_text())
    cfg["mask_token_id"] = 300  # in the model's 320-row vocabulary, but not in the 280-token tokenizer
    (tmp_path / "model" / "config.json").write_text(json.dumps(cfg))
    d = base_config(models, [task(data_dir() / "prompts_200.jsonl", limit=2)],
                    methods=[{"name": "LLaDA", "model": "llada", "preset": "llada"}])
    d["models"][1] = {"name": "llada", "path": str(tmp_path / "model"), "tokenizer": str(small)}
    with pytest.raises(ConfigError, match=r"its mask id 300 is not in the tokenizer \(.*small-tok, 280 tokens\); "
                                          r"method 'LLaDA' needs it"):
        run_eval(EvalConfig.from_dict(d), tmp_path / "run", progress=False)


def test_disk_full_keeps_earlier_records(tmp_path, monkeypatch):
    """A write that fails half-way (ENOSPC) leaves the shard ending on the last complete record."""
    import errno

    from dsl_llada.eval.shards import ShardWriter, iter_lines

    w = ShardWriter(tmp_path / "rank-0.jsonl")
    w.write_many([{"key": "a", "v": 1}, {"key": "b", "v": 2}])

    import dsl_llada.artifacts.jsonl_log as jsonl_log_mod

    real = jsonl_log_mod._write_all

    def half_then_full(fd, data):  # half the batch reaches the disk, then it is full
        os.write(fd, data[: len(data) // 2])
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(jsonl_log_mod, "_write_all", half_then_full)
    with pytest.raises(OSError, match="No space left"):
        w.write_many([{"key": "c", "v": 3}, {"key": "d", "v": 4}])
    monkeypatch.setattr(jsonl_log_mod, "_write_all", real)
    w.write_many([{"key": "e", "v": 5}])
    w.close()
    assert [r["key"] for r in iter_lines(tmp_path / "rank-0.jsonl")] == ["a", "b", "e"]
    assert (tmp_path / "rank-0.jsonl").read_bytes().endswith(b"\n")
