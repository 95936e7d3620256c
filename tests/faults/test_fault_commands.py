"""Hostile input to the smaller commands (docs/reliability.md, fault table): each refusal is one `error:` line
naming the file, folder or model at fault, with exit code 2, and changes nothing."""

from __future__ import annotations

from faults_helpers import error_lines

from dsl_llada.cli import main


# -- lm-eval --include-path ----------------------------------------------------------------------------------------
def test_a_task_yaml_that_does_not_parse_is_named_with_its_parse_error(models, tmp_path, capsys):
    backbone, _ = models
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    (tasks / "good.yaml").write_text("task: good\nprocess_docs: !function utils.process_docs\n")  # lm-eval's tag
    (tasks / "broken.yaml").write_text("task: broken\ndataset_path: json\ndoc_to_text: [unclosed\n")
    capsys.readouterr()
    assert main(["lm-eval", "--model-dir", str(backbone), "--tasks", "broken", "--include-path", str(tasks),
                 "--device", "cpu"]) == 2
    (line,) = error_lines(capsys.readouterr().err)
    assert line.startswith(f"error: task file '{tasks / 'broken.yaml'}' is not valid YAML (line 4, column 1: ")
    assert line.endswith("); fix it or move it out of --include-path")
    assert sorted(p.name for p in tasks.iterdir()) == ["broken.yaml", "good.yaml"]


def test_task_files_with_lm_eval_tags_pass_the_check_and_bad_bytes_do_not(tmp_path):
    import pytest

    from dsl_llada.eval.lmeval_command import check_task_files

    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "t.yml").write_text("task: t\nprocess_docs: !function utils.process_docs\n")
    (tmp_path / "notes.txt").write_text("{not yaml")  # not a task file: ignored
    check_task_files(tmp_path)
    (tmp_path / "sub" / "bad.yaml").write_bytes(b"task: \xff\n")
    with pytest.raises(ValueError, match=r"task file '.*/sub/bad.yaml' is not UTF-8 text \(invalid start byte at "
                                         r"byte 6\)"):
        check_task_files(tmp_path)


# -- eval report on a damaged run marker ---------------------------------------------------------------------------
def test_eval_report_on_a_damaged_eval_run_json_names_the_file(tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    marker = run / "eval_run.json"
    for damage, why in (('{"format": 1, "version": "0.1", "config": {"mod', "not valid JSON (Unterminated string"),
                        ("[1, 2]", "it holds no 'config' object"),
                        ('{"format": 1, "config": {"models": 3}}', "its config is not valid ("),
                        (b"\x00\xff\x00", "not valid JSON (")):
        marker.write_bytes(damage if isinstance(damage, bytes) else damage.encode())
        capsys.readouterr()
        assert main(["eval", "report", str(run)]) == 2
        (line,) = error_lines(capsys.readouterr().err)
        assert line.startswith(f"error: '{marker}' is damaged: {why}"), line
        assert line.endswith("; restore it from a copy, or run the evaluation again into this folder with "
                             "`eval run --new-run` (the old records are moved aside)")
        assert sorted(p.name for p in run.iterdir()) == ["eval_run.json"]  # no figures/ or summary left behind


# -- eval run with a missing model folder --------------------------------------------------------------------------
def test_eval_run_with_a_missing_model_folder_says_the_model_folder_is_missing(models, tmp_path, capsys, monkeypatch):
    from fault_utils import ROOT

    backbone, _ = models
    monkeypatch.chdir(ROOT)  # the preset's data path is relative to the checkout
    missing, out = tmp_path / "no-such-model", tmp_path / "run"
    capsys.readouterr()
    assert main(["eval", "run", "--config", "configs/eval/toy-generation.yaml", f"models.dsl.path={missing}",
                 f"models.mdm.path={backbone}", "--out", str(out), "-q"]) == 2
    (line,) = error_lines(capsys.readouterr().err)
    assert line == f"error: model 'dsl': model folder {str(missing)!r} does not exist"
    assert not out.exists()
    # a separate tokenizer folder that is missing is named as the tokenizer's
    assert main(["eval", "run", "--config", "configs/eval/toy-generation.yaml", f"models.dsl.path={backbone}",
                 f"models.dsl.tokenizer={missing}", f"models.mdm.path={backbone}", "--out", str(out), "-q"]) == 2
    (line,) = error_lines(capsys.readouterr().err)
    assert line == f"error: model 'dsl': tokenizer folder {str(missing)!r} does not exist"
    assert not out.exists()
