"""The commands as library calls: each `run_X(XSettings(...))` does the job of `dsl-llada X` without the command
line (a notebook's way in), with the command's checks and exit codes."""

from __future__ import annotations

import pytest
import torch
from eval_fixtures import eval_models  # noqa: F401  (session fixture)
from helpers import first_shown_judge, toy_backbone_folder

from dsl_llada.config import ConverterConfig, DSLConfig
from dsl_llada.core.convert_command import ConvertSettings, run_convert
from dsl_llada.errors import CheckpointError
from dsl_llada.core.model import DSLModel


@pytest.fixture(scope="module")
def backbone_dir(tmp_path_factory):
    return toy_backbone_folder(tmp_path_factory.mktemp("lib") / "backbone")


def _convert(backbone, out, seed: int) -> DSLModel:
    cfg = DSLConfig(converter=ConverterConfig(noise_dim=8, noise_seed=seed))
    assert run_convert(ConvertSettings(str(backbone), str(out), cfg)) == 0
    return DSLModel.from_pretrained(out)


def test_run_convert_writes_a_checkpoint_its_seed_decides(backbone_dir, tmp_path, capsys):
    a, b, c = (_convert(backbone_dir, tmp_path / name, seed) for name, seed in (("a", 1), ("b", 1), ("c", 2)))
    assert a.noise_dim == 8 and (tmp_path / "a" / "tokenizer.json").is_file()
    assert "wrote DSL checkpoint to" in capsys.readouterr().out
    assert torch.equal(a.noise_embed.weight, b.noise_embed.weight)  # same seed, same noise table
    assert not torch.equal(a.noise_embed.weight, c.noise_embed.weight)  # another seed, another table


def test_run_convert_refuses_a_dsl_checkpoint_and_bad_settings(backbone_dir, tmp_path, capsys):
    _convert(backbone_dir, tmp_path / "dsl", 0)
    with pytest.raises(CheckpointError, match="is already a DSL checkpoint"):
        run_convert(ConvertSettings(str(tmp_path / "dsl"), str(tmp_path / "again")))
    assert not (tmp_path / "again").exists()
    with pytest.raises(ValueError, match=r"dtype='fp8' is not valid; expected one of \['bf16'"):
        ConvertSettings(str(backbone_dir), str(tmp_path / "x"), dtype="fp8")
    with pytest.raises(ValueError, match="convert needs an OUTPUT folder"):
        run_convert(ConvertSettings(str(backbone_dir)))
    assert run_convert(ConvertSettings(str(backbone_dir), dry_run=True)) == 0
    assert "(nothing written)" in capsys.readouterr().out


# -- eval run ------------------------------------------------------------------------------------------------------
def _eval_settings(models, out, **kw):
    from eval_fixtures import base_config, data_dir

    from dsl_llada.eval.eval_command import EvalRunSettings
    from dsl_llada.eval.eval_config import EvalConfig

    task = {"name": "generation", "options": {}, "datasets": [
        {"name": "p", "path": str(data_dir() / "prompts_200.jsonl"), "kind": "prompts", "limit": 2, "gen_length": 8}]}
    return EvalRunSettings(EvalConfig.from_dict(base_config(models, [task])), str(out), progress=False, **kw)


def test_run_eval_command_runs_then_resumes(eval_models, tmp_path, capsys, one_thread):  # noqa: F811
    import json

    from dsl_llada.eval.eval_command import run_eval_command

    assert run_eval_command(_eval_settings(eval_models, tmp_path / "run", report=False)) == 0
    first = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert first["items"] == first["run_now"] == 4 and first["errors_now"] == 0  # 2 prompts x 2 methods
    assert first["summary"] is None and (tmp_path / "run").is_dir()
    assert run_eval_command(_eval_settings(eval_models, tmp_path / "run", report=False)) == 0
    again = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert again["items"] == 4 and again["run_now"] == 0  # every item was finished: nothing re-runs


def test_eval_run_settings_refuse_contradictions(eval_models, tmp_path):  # noqa: F811
    with pytest.raises(ValueError, match="pass either --overwrite or --new-run, not both"):
        _eval_settings(eval_models, tmp_path / "r", overwrite=True, new_run=True)
    with pytest.raises(ValueError, match=r"--max-error-rate=1.5 must be a fraction in \[0, 1\]"):
        _eval_settings(eval_models, tmp_path / "r", max_error_rate=1.5)
    assert not (tmp_path / "r").exists()


# -- eval judge ----------------------------------------------------------------------------------------------------
@pytest.fixture
def judge_endpoint():
    """An OpenAI-compatible endpoint whose judge always prefers the candidate shown first; counts its calls."""
    with first_shown_judge() as served:
        yield served


def _judge_runs(tmp_path):
    import json

    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        rows = [{"task": "summarization", "dataset": "xsum", "nfe": 64, "sample_id": str(i), "text": f"{name} {i}",
                 "info": {"reference": f"ref {i}"}} for i in range(12)]
        (tmp_path / name / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(tmp_path / "a"), str(tmp_path / "b")


def test_run_judge_judges_resumes_and_its_seed_decides_the_order(judge_endpoint, tmp_path, capsys):
    import json

    from dsl_llada.eval.judge import JudgeConfig
    from dsl_llada.eval.judge_command import JudgeBackendSettings, JudgeSettings, run_judge

    url, calls = judge_endpoint
    ra, rb = _judge_runs(tmp_path)

    def settings(out: str, seed: int) -> JudgeSettings:
        return JudgeSettings(ra, rb, str(tmp_path / out), JudgeBackendSettings(endpoint=url, judge_model="m",
                                                                               concurrency=1),
                             JudgeConfig(n=10, seed=seed, bootstrap_resamples=200), progress=False)

    def swaps(out: str) -> dict[str, bool]:
        lines = (tmp_path / out / "judgments.jsonl").read_text().splitlines()
        return {json.loads(x)["id"]: json.loads(x)["swap"] for x in lines}

    assert run_judge(settings("j42", 42)) == 0
    first = json.loads(capsys.readouterr().out.splitlines()[0])
    assert len(calls) == 10 and first["n_parsed"] == 10 and first["shown_a_rate"] == 1.0
    assert first["win"] == 100.0 * sum(not s for s in swaps("j42").values()) / 10  # run A wins when shown first
    assert run_judge(settings("j42", 42)) == 0 and len(calls) == 10  # resumed: nothing judged again
    assert json.loads(capsys.readouterr().out.splitlines()[0]) == first
    assert run_judge(settings("j7", 7)) == 0
    assert swaps("j7") != swaps("j42")  # another seed: other ids or other presentation orders


def test_judge_settings_refuse_a_missing_or_double_back_end(tmp_path):
    from dsl_llada.eval.judge_command import JudgeBackendSettings

    with pytest.raises(ValueError, match="give exactly one judge back-end"):
        JudgeBackendSettings()
    with pytest.raises(ValueError, match="give exactly one judge back-end"):
        JudgeBackendSettings(endpoint="http://127.0.0.1:9/v1", judge_model="m", local="smollm2")
    with pytest.raises(ValueError, match="--endpoint needs --judge-model NAME"):
        JudgeBackendSettings(endpoint="http://127.0.0.1:9/v1")


# -- eval report ---------------------------------------------------------------------------------------------------
def test_run_eval_report_summarises_a_run_in_its_mode_or_another(eval_models, tmp_path, capsys, one_thread):  # noqa: F811
    import json

    from dsl_llada.eval.eval_command import EvalReportSettings, run_eval_command, run_eval_report

    run = tmp_path / "run"
    assert run_eval_command(_eval_settings(eval_models, run, report=False)) == 0
    assert not (run / "summary.md").exists()
    capsys.readouterr()
    assert run_eval_report(EvalReportSettings(str(run))) == 0
    line = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert line == {"summary": str(run / "summary.md"), "records": 4, "errors": 0, "figures": line["figures"]}
    assert json.loads((run / "summary.json").read_text())["scoring_mode"] == "default"  # the run's own mode
    assert run_eval_report(EvalReportSettings(str(run), mode="authors")) == 0
    assert json.loads((run / "summary.json").read_text())["scoring_mode"] == "authors"
    with pytest.raises(ValueError, match=r"--mode 'paper' is not valid; expected one of \['default', 'authors'\]"):
        EvalReportSettings(str(run), mode="paper")
    with pytest.raises(FileNotFoundError, match="is not a `dsl-llada eval run` folder"):
        run_eval_report(EvalReportSettings(str(tmp_path)))


# -- lm-eval -------------------------------------------------------------------------------------------------------
MC_TASK = """task: mc_local
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: multiple_choice
doc_to_text: "{{{{q}}}} Answer:"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: "{{{{label}}}}"
metric_list:
  - metric: acc
"""


def test_run_lm_eval_opens_the_resolved_model_source_as_given(eval_models, tmp_path, capsys, monkeypatch,  # noqa: F811
                                                              one_thread):
    import json

    pytest.importorskip("lm_eval")
    import dsl_llada.eval.lmeval as adapter
    from dsl_llada.eval.lmeval_command import LmEvalSettings, run_lm_eval
    from dsl_llada.core.loading import resolve_source
    from dsl_llada.core.model_source import ModelSource

    opened = []
    real_open = adapter.open_model
    monkeypatch.setattr(adapter, "open_model", lambda source, **kw: opened.append(source) or real_open(source, **kw))
    data = tmp_path / "mc.jsonl"
    data.write_text("".join(json.dumps({"q": f"How many apples are {i} plus {i}?", "choices": [str(2 * i), str(i)],
                                        "label": 0}) + "\n" for i in range(1, 4)))
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    (tasks / "mc_local.yaml").write_text(MC_TASK.format(data=data))
    source = ModelSource(path=str(eval_models["dsl"]), device="cpu", dtype="float32", threads=1)
    out = tmp_path / "results.json"
    settings = LmEvalSettings(source, ("mc_local",), include_path=str(tasks), limit=2, mc_samples=2,
                              output=str(out))
    assert run_lm_eval(settings) == 0
    # every field of the source reaches the model as it was resolved (threads included), not rebuilt from strings
    assert opened == [resolve_source(source)] and opened[0].threads == 1 and opened[0].dtype == "float32"
    results = json.loads(out.read_text())
    assert 0.0 <= results["results"]["mc_local"]["acc,none"] <= 1.0
    assert results["n-samples"]["mc_local"]["effective"] == 2
    assert "mc_local" in capsys.readouterr().out  # lm-eval's table


def test_lm_eval_settings_refuse_bad_values_before_anything_loads(eval_models, tmp_path):  # noqa: F811
    from dsl_llada.eval.lmeval_command import LmEvalSettings
    from dsl_llada.core.model_source import ModelSource

    source = ModelSource(path=str(eval_models["dsl"]))
    with pytest.raises(ValueError, match=r"tasks=\(\) must be a non-empty list of lm-eval task names"):
        LmEvalSettings(source, ())
    with pytest.raises(ValueError, match=r"sampler='bogus' is not valid; expected one of \['sde'"):
        LmEvalSettings(source, ("t",), sampler="bogus")
    with pytest.raises(ValueError, match=r"--limit 0 must be a positive number"):
        LmEvalSettings(source, ("t",), limit=0)
    with pytest.raises(ValueError, match="source='m' must be a ModelSource"):
        LmEvalSettings("m", ("t",))  # type: ignore[arg-type]


def test_the_lm_eval_adapter_takes_a_source_or_loose_settings_not_both(eval_models):  # noqa: F811
    pytest.importorskip("lm_eval")
    from dsl_llada.eval.lmeval import DSLLadaLM
    from dsl_llada.core.model_source import ModelSource

    source = ModelSource(path=str(eval_models["dsl"]), device="cpu", dtype="float32")
    with pytest.raises(ValueError, match=r"not both \(also given: device, model_dir\)"):
        DSLLadaLM(str(eval_models["dsl"]), device="cpu", source=source)
    with pytest.raises(ValueError, match="model_args needs model_dir=FOLDER"):
        DSLLadaLM()
    lm = DSLLadaLM(source=source, sampler="remask", steps=4, gen_length=8)
    assert next(lm.model.parameters()).dtype == torch.float32 and lm.config.steps == 4


# -- train ---------------------------------------------------------------------------------------------------------
def test_run_train_trains_and_prints_the_summary(tmp_path, capsys, monkeypatch):
    import json
    from pathlib import Path

    from dsl_llada.train.train_command import TrainSettings, run_train
    from dsl_llada.train.train_config import load_train_config

    monkeypatch.chdir(Path(__file__).resolve().parents[1])  # the toy preset's corpus path is relative to the root
    out = tmp_path / "toy"
    config = load_train_config("configs/toy.yaml", [f"output_dir={out}", "max_steps=2", "save_every=2",
                                                    "eval_every=2", "data.block_size=32", "per_device_batch_size=2",
                                                    "progress=false"])
    assert run_train(TrainSettings(config)) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["final_step"] == 2 and summary["stop_reason"] == "max_steps"
    assert summary["output_dir"] == str(out) and (out / "final" / "model.safetensors").is_file()
    assert DSLModel.from_pretrained(out / "final").vocab_size == 258
