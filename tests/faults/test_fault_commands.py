"""Hostile input to the smaller commands (docs/reliability.md, fault table): each refusal is one `error:` line
naming the file, folder or model at fault, with exit code 2, and changes nothing."""

from __future__ import annotations

from faults_helpers import error_lines

from dsl_llada.cli.main import main


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


# -- --allow-download without a way to the hub --------------------------------------------------------------------
def _cli_without_hub(argv: list[str], hf_home, **env: str):
    """The CLI in a subprocess with an empty hub cache and the hub made unreachable by `env`."""
    import os
    import subprocess
    import sys

    from fault_utils import ROOT

    base = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    full = {**base, "PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1", "HF_HOME": str(hf_home), **env}
    return subprocess.run([sys.executable, "-m", "dsl_llada", *argv], capture_output=True, text=True, env=full,
                          timeout=300, cwd=hf_home)


def test_allow_download_without_the_hub_names_the_model_id_in_one_line(tmp_path):
    model = "someone/missing-model"
    offline = {"HF_HUB_OFFLINE": "1"}  # downloads turned off
    unreachable = {"HF_HUB_OFFLINE": "0", "HF_ENDPOINT": "http://127.0.0.1:9"}  # nothing listens there: refused
    for env, why in ((offline, "downloads are turned off on this machine (HF_HUB_OFFLINE is set)"),
                     (unreachable, "the hub cannot be reached from this machine (ConnectError: ")):
        for argv in (["convert", model, str(tmp_path / "out"), "--allow-download"],
                     ["generate", "--model", model, "--allow-download", "--prompt", "hi", "--device", "cpu"]):
            r = _cli_without_hub(argv, tmp_path, **env)
            assert r.returncode == 2, r.stderr
            (line,) = error_lines(r.stderr)
            assert line.startswith(f"error: cannot fetch {model!r} from the Hugging Face hub: {why}"), line
            assert line.endswith("and it is not in the local hub cache; download it where the hub can be reached "
                                 "and pass its folder instead")
            assert not (tmp_path / "out").exists()
    r = _cli_without_hub(["convert", "a/b/c", str(tmp_path / "out"), "--allow-download"], tmp_path, **offline)
    (line,) = error_lines(r.stderr)
    assert r.returncode == 2 and line.startswith("error: 'a/b/c' is neither a local folder nor a Hugging Face hub id "
                                                 "(Repo id must be in the form")


# -- convert to a symbolic link that names a folder ----------------------------------------------------------------
def test_convert_to_a_link_to_a_folder_writes_into_the_folder_it_names(models, tmp_path, capsys):
    backbone, _ = models
    real = tmp_path / "checkpoints" / "dsl"
    real.mkdir(parents=True)
    link = tmp_path / "out"
    link.symlink_to(real, target_is_directory=True)
    assert main(["convert", str(backbone), str(link), "--noise-dim", "8"]) == 0
    assert link.is_symlink() and link.resolve() == real  # the link is kept and still names the folder
    assert (real / "dsl_config.json").is_file() and (real / "model.safetensors").is_file()
    first = (real / "model.safetensors").read_bytes()
    # the folder now holds a checkpoint: the folder rules apply to it through the link
    capsys.readouterr()
    assert main(["convert", str(backbone), str(link), "--noise-dim", "8"]) == 2
    (line,) = error_lines(capsys.readouterr().err)
    assert line.startswith(f"error: output folder {str(link)!r} already holds a checkpoint; pass --overwrite")
    assert main(["convert", str(backbone), str(link), "--noise-dim", "8", "--seed", "7", "--overwrite"]) == 0
    assert link.is_symlink() and (real / "model.safetensors").read_bytes() != first  # another noise table
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoints", "out"]
    assert sorted(p.name for p in real.parent.iterdir()) == ["dsl"]  # no temp folder or lock file left


def test_convert_to_a_link_to_a_folder_of_other_files_is_refused_through_the_link(models, tmp_path, capsys):
    backbone, _ = models
    real = tmp_path / "mine"
    real.mkdir()
    (real / "notes.txt").write_text("keep")
    link = tmp_path / "out"
    link.symlink_to(real)
    capsys.readouterr()
    assert main(["convert", str(backbone), str(link), "--overwrite"]) == 2
    (line,) = error_lines(capsys.readouterr().err)
    assert line.startswith(f"error: output folder {str(link)!r} is not empty and is not a checkpoint written by "
                           f"dsl-llada (it holds notes.txt)")
    assert [p.name for p in real.iterdir()] == ["notes.txt"] and link.is_symlink()
