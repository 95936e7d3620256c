"""One model source for every command: the model flags of `generate`, `serve` and `ui` are generated from
`ModelSource` and read back into it; the dataclass refuses bad values naming them; `open_model` returns the handle
(model, tokenizer, special ids, context, device, dtype) the commands use."""

from __future__ import annotations

import argparse
import dataclasses

import pytest
import torch
from faults_helpers import make_backbone_dir

from dsl_llada.cli.main import build_parser
from dsl_llada.errors import ConfigError
from dsl_llada.core.loading import open_model, resolve_source
from dsl_llada.core.model_source import ModelSource
from dsl_llada.cli.flags import model_source_from_args

MODEL_FLAGS = {"--model", "--tokenizer", "--device", "--dtype", "--quantize", "--assume-released",
               "--no-assume-released", "--allow-download", "--no-allow-download"}


def subparser(name: str) -> argparse.ArgumentParser:
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices[name]


def model_flags(name: str) -> dict[str, tuple[str | None, object, bool]]:
    """Option string -> (help, choices, required) of a command's 'model' argument group."""
    (group,) = [g for g in subparser(name)._action_groups if g.title == "model"]
    return {o: (a.help, a.choices, a.required) for a in group._group_actions for o in a.option_strings}


def test_serve_and_generate_offer_the_same_model_flags():
    gen, serve, ui = model_flags("generate"), model_flags("serve"), model_flags("ui")
    assert set(gen) == MODEL_FLAGS
    assert serve == gen  # same flags, same help, same choices, --model required on both
    assert gen["--model"][2] is True and ui["--model"][2] is False  # ui has a default model (the toy world's)
    assert {k: v for k, v in ui.items() if k != "--model"} == {k: v for k, v in gen.items() if k != "--model"}
    assert gen["--dtype"][1] == ("auto", "bf16", "bfloat16", "float16", "float32", "fp16", "fp32")
    assert gen["--quantize"][1] == ("none", "int8")
    lmeval = model_flags("lm-eval")  # its model folder flag keeps its earlier spelling too
    assert lmeval.pop("--model-dir") == lmeval["--model"] and lmeval == gen
    for name in ("generate", "serve", "ui", "lm-eval"):
        assert "--threads" in subparser(name)._option_string_actions  # the shared flag of computing commands


def test_flags_read_back_into_the_source():
    parse = build_parser().parse_args
    a = parse(["serve", "--model", "m", "--tokenizer", "t", "--device", "cpu", "--dtype", "bf16", "--quantize", "int8",
               "--assume-released", "--allow-download", "--threads", "3"])
    assert model_source_from_args(a) == ModelSource(path="m", tokenizer="t", device="cpu", dtype="bf16",
                                                    quantize="int8", assume_released=True, allow_download=True,
                                                    threads=3)
    b = model_source_from_args(parse(["generate", "--model", "m", "--prompt", "x"]))
    assert b == ModelSource(path="m") and b.tokenizer_path == "m" and b.dtype == "auto"


def test_bad_command_line_values_exit_2_naming_the_flag(capsys):
    for argv in (["serve", "--model", "m", "--dtype", "fp8"], ["generate", "--model", "m", "--quantize", "int4"],
                 ["generate", "--prompt", "x"]):
        with pytest.raises(SystemExit) as e:
            build_parser().parse_args(argv)
        assert e.value.code == 2
        err = capsys.readouterr().err
        assert ("--dtype" in err or "--quantize" in err or "--model" in err), err


@pytest.mark.parametrize("field,value,says", [
    ("dtype", "fp8", "dtype='fp8' is not valid"), ("quantize", "int4", "quantize='int4' is not valid"),
    ("threads", 0, "threads=0 must be an integer from 1 to 1024"), ("threads", True, "threads=True"),
    ("assume_released", "yes", "assume_released='yes' must be true or false"), ("path", "", "path='' must be"),
])
def test_the_source_refuses_bad_values(field, value, says):
    with pytest.raises(ConfigError, match=says):
        ModelSource(**{"path": "m", field: value})


def test_open_model_returns_the_handle(tmp_path):
    folder = make_backbone_dir(tmp_path / "bb")
    source = ModelSource(path=str(folder), dtype="float32", device="cpu", threads=1)
    resolved = resolve_source(source)
    assert resolve_source(resolved) == resolved  # idempotent
    assert dataclasses.replace(source, path=resolved.path) == resolved
    before = torch.get_num_threads()
    try:
        h = open_model(source)
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)
    assert h.path == folder and h.device == torch.device("cpu") and h.dtype == torch.float32
    assert h.special == h.model.special and h.context == h.model.max_length
    assert len(h.tokenizer) <= h.model.vocab_size
    with pytest.raises(ValueError, match="no model: pass --model"):
        open_model(ModelSource())
    with pytest.raises(ValueError, match="does not exist"):
        open_model(ModelSource(path=str(tmp_path / "missing")))
