"""Loading faults (numbered as in docs/reliability.md's fault-injection table): a DSL checkpoint without its config
(10), damaged model configs and weights (12, 17), misleading messages (13), checkpoint files outside the model folder
(14), special-token spellings in prompts (15), damaged tokenizer files and a blocked chat template (12, 17). Each is
one `error:` line and exit 2 naming the file and field, before any sampling."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import torch
from fault_utils import run_cli
from faults_helpers import error_lines, refused
from safetensors.torch import load_file, save_file

import dsl_llada.generate.generation as generation_mod
from dsl_llada.cli.main import main

GEN = ["--prompt", "the ocean", "--sampler", "remask", "--steps", "2", "--gen-length", "4", "-q", "--device", "cpu"]


def copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


# -- 10 ---------------------------------------------------------------------------------------------------------------
def test_a_dsl_checkpoint_without_its_config_is_refused_unless_assume_released(models, tmp_path, capsys):
    model = copy(models[1], tmp_path / "m")
    (model / "dsl_config.json").unlink()
    line = refused(capsys, ["generate", "--model", str(model), *GEN])
    assert "without dsl_config.json" in line and "--assume-released" in line
    assert main(["generate", "--model", str(model), *GEN, "--assume-released"]) == 0


# -- 12, 17: model config fields and weights --------------------------------------------------------------------------
@pytest.mark.parametrize("field,value,says", [
    ("n_heads", 0, "n_heads=0 must be an integer in [1, 4096]"),
    ("n_heads", -4, "n_heads=-4 must be an integer"),
    ("d_model", "abc", "d_model='abc' must be an integer"),
    ("rope_theta", float("nan"), "rope_theta=nan must be a finite number"),
    ("rms_norm_eps", "abc", "rms_norm_eps='abc' must be a finite number"),
    ("mask_token_id", "VOCAB", "is outside the vocabulary"),
])
def test_a_bad_model_config_field_is_one_line_naming_file_and_field(models, tmp_path, capsys, field, value, says):
    model = copy(models[0], tmp_path / "m")
    cfg = json.loads((model / "config.json").read_text())
    cfg[field] = cfg["vocab_size"] if value == "VOCAB" else value
    (model / "config.json").write_text(json.dumps(cfg))
    line = refused(capsys, ["generate", "--model", str(model), *GEN])
    assert str(model / "config.json") in line and says in line, line


def test_integer_weights_are_refused_naming_the_tensor(models, tmp_path, capsys):
    model = copy(models[0], tmp_path / "m")
    state = load_file(str(model / "model.safetensors"))
    name = sorted(state)[0]
    state[name] = state[name].to(torch.int32)
    save_file(state, str(model / "model.safetensors"))
    line = refused(capsys, ["generate", "--model", str(model), *GEN])
    assert name in line and "int32" in line and "model.safetensors" in line


# -- 13: misleading messages ---------------------------------------------------------------------------------------------
def test_bad_devices_and_seeds_are_named_as_such(models, capsys):
    line = refused(capsys, ["generate", "--model", str(models[1]), *GEN, "--device", "bogus"])
    assert "--device 'bogus' is not a device name" in line and "damaged" not in line
    if not torch.cuda.is_available():
        line = refused(capsys, ["generate", "--model", str(models[1]), *GEN, "--device", "cuda"])
        assert "no CUDA GPU is available" in line
    line = refused(capsys, ["generate", "--model", str(models[1]), *GEN, "--seed", str(2**64)])
    assert f"--seed {2**64} is out of range" in line


def test_a_missing_tokenizer_names_the_folder_not_sentencepiece(models, tmp_path, capsys):
    model = copy(models[1], tmp_path / "m")
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        (model / name).unlink(missing_ok=True)
    line = refused(capsys, ["generate", "--model", str(model), *GEN])
    assert "no tokenizer in" in line and str(model) in line and "sentencepiece" not in line


# -- 14: checkpoint files confined to the model folder ---------------------------------------------------------------------
@pytest.mark.parametrize("how", ["dotdot", "absolute", "device", "fifo", "symlink"])
def test_checkpoint_files_outside_the_model_folder_are_refused(models, tmp_path, how):
    model = copy(models[0], tmp_path / "m")
    weights = model / "model.safetensors"
    outside = tmp_path / "outside.safetensors"
    shutil.move(weights, outside)
    if how == "symlink":
        weights.symlink_to(outside)
    else:
        target = {"dotdot": "../outside.safetensors", "absolute": str(outside), "device": "/dev/zero",
                  "fifo": "w.safetensors"}[how]
        if how == "fifo":
            os.mkfifo(model / target)
        keys = list(load_file(str(outside)))
        (model / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {k: target for k in keys}}))
    r = run_cli(["generate", "--model", str(model), *GEN], timeout=120)  # a FIFO would hang: a real process
    assert r.returncode == 2, r.stderr
    (line,) = error_lines(r.stderr)
    expected = {"dotdot": "must be plain file names", "absolute": "must be plain file names",
                "device": "must be plain file names", "fifo": "is not a regular file", "symlink": "outside the model folder"}
    assert expected[how] in line, line


# -- 15: special-token spellings in prompts --------------------------------------------------------------------------------
@pytest.mark.parametrize("template", [True, False])
def test_special_token_spellings_in_a_prompt_stay_text_unless_allowed(models, tmp_path, monkeypatch, template):
    seen: list[list[int]] = []
    real = generation_mod.generate

    def spy(*args, encoded=None, **kw):
        seen.extend(encoded)
        return real(*args, encoded=encoded, **kw)

    monkeypatch.setattr(generation_mod, "generate", spy)
    from dsl_llada.core.loading import load_tokenizer

    tok = load_tokenizer(models[1])
    control = {tok.convert_tokens_to_ids("<|mdm_mask|>"), tok.eos_token_id}
    prompt = "<|mdm_mask|>the ocean<|endoftext|>"
    flags = [] if template else ["--no-chat-template"]
    out = tmp_path / "out.jsonl"
    assert main(["generate", "--model", str(models[1]), *GEN[2:], "--prompt", prompt, *flags, "--output", str(out)]) == 0
    assert not control & set(seen[-1]), seen[-1]
    assert "allow_special_tokens" not in json.loads(Path(f"{out}.config.json").read_text())
    out2 = tmp_path / "allowed.jsonl"
    assert main(["generate", "--model", str(models[1]), *GEN[2:], "--prompt", prompt, *flags, "--allow-special-tokens",
                 "--output", str(out2)]) == 0
    assert control <= set(seen[-1]), seen[-1]
    assert json.loads(Path(f"{out2}.config.json").read_text())["allow_special_tokens"] is True


# -- 12, 17: tokenizer files --------------------------------------------------------------------------------------------------
def test_a_corrupt_tokenizer_json_is_one_line_for_generate_and_convert(models, tmp_path, capsys):
    model = copy(models[0], tmp_path / "m")
    tj = model / "tokenizer.json"
    tj.write_text(tj.read_text()[:200])
    line = refused(capsys, ["generate", "--model", str(model), *GEN])
    assert str(tj) in line and "not valid JSON" in line
    line = refused(capsys, ["convert", str(model), str(tmp_path / "new" / "out")])
    assert str(tj) in line and not (tmp_path / "new").exists()  # refused: not even the parent folder is made


def test_a_chat_template_the_sandbox_blocks_is_one_line(models, tmp_path, capsys):
    model = copy(models[1], tmp_path / "m")
    (model / "chat_template.jinja").write_text("{{ cycler.__init__.__globals__.os.popen('id').read() }}")
    line = refused(capsys, ["generate", "--model", str(model), *GEN])
    assert "chat_template.jinja" in line and "--no-chat-template" in line
    assert main(["generate", "--model", str(model), *GEN, "--no-chat-template"]) == 0


def test_convert_bounds_the_noise_dimension(models, tmp_path, capsys):
    line = refused(capsys, ["convert", str(models[0]), str(tmp_path / "out"), "--noise-dim", "100000000"])
    assert "noise_dim=100000000 must be an int in [1, 8192]" in line and not (tmp_path / "out").exists()
