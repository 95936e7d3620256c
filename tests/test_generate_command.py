"""`dsl-llada generate` is one library call: `run_generate(GenerateSettings(...))` from Python gives the records the
command prints, with the same output file and refusals."""

from __future__ import annotations

import json

import pytest
from faults_helpers import make_backbone_dir

from dsl_llada.cli.main import main
from dsl_llada.config import RemaskConfig
from dsl_llada.generate.generate_command import GenerateSettings, run_generate
from dsl_llada.core.model_source import ModelSource

PROMPTS = ("the ocean", "a river runs")


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return make_backbone_dir(tmp_path_factory.mktemp("gen") / "bb")


def settings(model, **kw) -> GenerateSettings:
    return GenerateSettings(ModelSource(path=str(model), device="cpu", dtype="float32"),
                            RemaskConfig(steps=4, gen_length=4, temperature=1.0), **{"prompts": PROMPTS,
                                                                                      "progress": False, **kw})


def test_the_library_call_gives_the_commands_records(model, tmp_path, capsys):
    seen: list[dict] = []
    assert run_generate(settings(model, seed=3, output=str(tmp_path / "lib.jsonl")), echo=seen.append) == 0
    assert [r["index"] for r in seen] == [0, 1] and all(r["seed"] == 3 + r["index"] for r in seen)
    capsys.readouterr()
    assert main(["generate", "--model", str(model), "--device", "cpu", "--dtype", "float32", "--sampler", "remask",
                 "--steps", "4", "--gen-length", "4", "--temperature", "1.0", "--seed", "3", "-q", "--output", str(tmp_path / "cli.jsonl"),
                 *(x for p in PROMPTS for x in ("--prompt", p))]) == 0
    printed = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert printed == [{"index": r["index"], "response": r["response"]} for r in seen]
    lib, cli = ((tmp_path / f"{n}.jsonl").read_text() for n in ("lib", "cli"))
    assert lib == cli  # same records file, byte for byte
    other: list[dict] = []
    run_generate(settings(model, seed=4), echo=other.append)
    assert [r["response_ids"] for r in other] != [r["response_ids"] for r in seen]  # the seed matters


@pytest.mark.parametrize("kw,says", [
    ({"max_error_rate": 1.5}, "--max-error-rate 1.5 must be a fraction in [0, 1]"),
    ({"resume": True}, "--resume needs --output FILE"),
    ({"resume": True, "overwrite": True, "output": "x"}, "--resume and --overwrite contradict each other"),
])
def test_bad_settings_are_refused_when_made(model, kw, says):
    with pytest.raises(ValueError, match=says.replace("[", r"\[").replace("]", r"\]")):
        settings(model, **kw)


def test_bad_prompts_and_seeds_are_refused_before_anything_is_written(model, tmp_path):
    out = tmp_path / "o.jsonl"
    for kw, says in (({"prompts": ()}, "no prompts"), ({"prompts": ("x", " ")}, "prompt 1 is empty"),
                     ({"seed": -1}, "--seed -1 is out of range")):
        with pytest.raises(ValueError, match=says):
            run_generate(settings(model, output=str(out), **kw))
        assert not out.exists() and not (tmp_path / "o.jsonl.config.json").exists()
