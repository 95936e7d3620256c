"""The sampler registry: one table, one (name, overrides) -> config parser, and every entry point built from it."""

from __future__ import annotations

import ast
import re
import typing
from pathlib import Path

import pytest

import dsl_llada
from dsl_llada.cli.main import build_parser
from dsl_llada.config import RemaskConfig, SDEConfig
from dsl_llada.sampling.registry import (REGISTRY, SAMPLERS, SamplerSettingError, get_spec, sampler_config,
                                         sampler_table_markdown, spec_of)

SRC = Path(dsl_llada.__file__).parent
DOCS = SRC.parents[1] / "docs"


def test_every_row_builds_a_config_that_names_that_row():
    assert SAMPLERS == ("sde", "block-sde", "remask", "remdm")
    for name, spec in REGISTRY.items():
        overrides = {"block_length": 4, "gen_length": 8} if name == "block-sde" else {}
        cfg = sampler_config(name, overrides)
        assert type(cfg) is spec.config_class and cfg.sampler_name == name and spec_of(cfg) is spec
        assert spec.steps_field in spec.fields() and not set(spec.fixed) & set(spec.fields())


def test_overrides_reach_the_config_and_defaults_fill_the_rest():
    assert sampler_config("sde") == SDEConfig()
    assert sampler_config("sde", {"nfe": 8, "eta": 0.0}) == SDEConfig(nfe=8, eta=0.0)
    assert sampler_config("remdm", {"steps": 8, "gen_length": 16}) == RemaskConfig(steps=8, gen_length=16, remdm=True)
    assert sampler_config("remask", {"steps": 8, "gen_length": 16}) == RemaskConfig(steps=8, gen_length=16)
    assert sampler_config("remask", {"steps": 8}) != sampler_config("remask", {"steps": 16})


def test_text_values_are_parsed_as_the_fields_types():
    cfg = sampler_config("block-sde", {"nfe": "8", "block_length": "4", "gen_length": "8", "eta": "none",
                                       "predictor_noise": "false", "gamma_min": "0.05"}, text=True)
    assert cfg == SDEConfig(nfe=8, block_length=4, gen_length=8, eta=None, predictor_noise=False, gamma_min=0.05)
    assert sampler_config("sde", {"eta": "0.5"}, text=True).eta == 0.5
    with pytest.raises(SamplerSettingError, match="predictor_noise='maybe' is not valid") as e:
        sampler_config("sde", {"predictor_noise": "maybe"}, text=True)
    assert e.value.field == "predictor_noise"
    with pytest.raises(SamplerSettingError):  # without text=True a string is not parsed
        sampler_config("sde", {"nfe": "8"})


@pytest.mark.parametrize(("name", "overrides", "field", "message"), [
    ("euler", {}, "sampler", "sampler='euler' is not valid; expected one of ['sde', 'block-sde', 'remask', 'remdm']"),
    ("sde", {"steps": 8}, "steps", "unknown field 'steps' for sampler 'sde'"),
    ("remask", {"top_m": 8}, "top_m", "unknown field 'top_m' for sampler 'remask'"),
    ("remask", {"remdm": True}, "remdm", "unknown field 'remdm' for sampler 'remask'"),
    ("block-sde", {}, "block_length", "sampler 'block-sde' needs block_length > 0"),
    ("sde", {"block_length": 4, "gen_length": 8}, "block_length", "sampler 'sde' needs block_length = 0"),
    ("sde", {"nfe": 3}, "nfe", "nfe=3 is not valid"),
    ("remask", {"steps": 5, "gen_length": 8, "block_length": 4}, "steps", "steps=5 must be divisible"),
])
def test_bad_settings_name_the_field(name, overrides, field, message):
    with pytest.raises(SamplerSettingError, match=re.escape(message)) as e:
        sampler_config(name, overrides)
    assert e.value.field == field and isinstance(e.value, ValueError)


def test_get_spec_and_spec_of_refuse_what_is_no_sampler():
    with pytest.raises(SamplerSettingError, match="expected one of"):
        get_spec("block_sde")
    with pytest.raises(TypeError, match="dict names no sampler"):
        spec_of({"nfe": 2})


def test_docs_sampler_table_is_the_generated_one():
    text = (DOCS / "samplers.md").read_text()
    m = re.search(r"<!-- sampler-table:begin[^>]*-->\n(.*?)<!-- sampler-table:end -->", text, re.S)
    assert m is not None, "docs/samplers.md lost its sampler-table markers"
    assert m.group(1) == sampler_table_markdown()
    assert all(f"| `{name}` |" in m.group(1) for name in SAMPLERS)


def _sub_action(parser, command: str, dest: str):
    sub = next(a for a in parser._actions if a.dest == "command").choices[command]
    return next(a for a in sub._actions if a.dest == dest)


def test_cli_server_and_lmeval_lists_are_the_registry():
    sampler = _sub_action(build_parser(), "generate", "sampler")
    assert tuple(sampler.choices) == SAMPLERS and sampler.default == SAMPLERS[0]
    assert all(spec.label in sampler.help for spec in REGISTRY.values())
    from dsl_llada.serve.schemas import SamplingFields

    hint = typing.get_type_hints(SamplingFields)["sampler"]
    literal = next(a for a in typing.get_args(hint) if a is not type(None))
    assert typing.get_args(literal) == SAMPLERS
    if "lm-eval" in next(a for a in build_parser()._actions if a.dest == "command").choices:
        assert tuple(_sub_action(build_parser(), "lm-eval", "sampler").choices) == SAMPLERS


def _string_constants(path: Path) -> list[str]:
    return [n.value for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.Constant) and isinstance(n.value, str)]


def test_sampler_names_are_spelled_in_one_module():
    """The names are constants of dsl_llada.config; every other module takes them from there or the registry."""
    holders = sorted(str(p.relative_to(SRC)) for p in SRC.rglob("*.py") if "block-sde" in _string_constants(p))
    assert holders == ["config.py"]


def _imports(path: Path, package: str) -> set[str]:
    """Absolute names of the dsl_llada modules `path` (a module of `package`) imports."""
    out: set[str] = set()
    parts = package.split(".")
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = parts[: len(parts) - node.level + 1] if node.level else []
            out.add(".".join([*base, *(node.module or "").split(".")]).strip("."))
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
    return {m for m in out if m.startswith("dsl_llada")}


@pytest.mark.parametrize(("package", "sibling"), [("train", "eval"), ("eval", "train")])
def test_train_and_eval_are_siblings(package, sibling):
    root = SRC / package
    crossing = {}
    for path in root.rglob("*.py"):
        pkg = ".".join(("dsl_llada", *path.relative_to(SRC).parent.parts))
        bad = sorted(m for m in _imports(path, pkg) if m == f"dsl_llada.{sibling}" or m.startswith(f"dsl_llada.{sibling}."))
        if bad:
            crossing[str(path.relative_to(SRC))] = bad
    assert crossing == {}


@pytest.mark.parametrize("module", ["cli/main.py", "serve/schemas.py", "eval/methods.py", "eval/lmeval.py", "toy/evaluate.py"])
def test_entry_points_build_sampler_configs_through_the_registry(module):
    """No entry point constructs a sampler config itself: each calls the registry's one parser."""
    tree = ast.parse((SRC / module).read_text())
    calls = {n.func.id if isinstance(n.func, ast.Name) else getattr(n.func, "attr", "")
             for n in ast.walk(tree) if isinstance(n, ast.Call)}
    assert "sampler_config" in calls
    assert not calls & {"SDEConfig", "RemaskConfig"}
