"""CLI flags generated from config dataclasses (dsl_llada.cli.flags) and the generate command's sampler flags."""

from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass
from typing import Literal

import pytest

from dsl_llada.cli.main import build_parser
from dsl_llada.cli.flags import add_config_args, config_from_args, field_docs
from dsl_llada.config import ConfigError, RemaskConfig, SDEConfig
from dsl_llada.snr import SCHEDULES


@dataclass(frozen=True)
class Toy:
    size: int = 3
    """How many (a %-sign is kept)."""
    rate: float | None = None
    """A rate; None = automatic."""
    mode: Literal["a", "b"] = "a"
    """Which mode."""
    on: bool = True
    """Switch."""


def parse(argv, *configs, **kw):
    p = argparse.ArgumentParser()
    add_config_args(p, *configs, **kw)
    return p, p.parse_args(argv)


def test_a_new_field_reaches_the_cli_with_type_choices_help_and_default():
    p, a = parse(["--size", "5", "--rate", "0.5", "--mode", "b", "--no-on"], (Toy, "toy"))
    assert config_from_args(Toy, a) == Toy(size=5, rate=0.5, mode="b", on=False)
    assert config_from_args(Toy, p.parse_args([])) == Toy()  # nothing given: the dataclass's own defaults
    help_text = " ".join(p.format_help().split())
    for s in ("--size INT", "How many (a %-sign is kept). (default: 3)", "--rate FLOAT", "(default: None)",
              "--mode {a,b}", "--on, --no-on", "Switch. (default: True)"):
        assert s in help_text
    with pytest.raises(SystemExit):
        p.parse_args(["--mode", "c"])


def test_field_docs_and_missing_docstring_is_an_error():
    assert field_docs(Toy) == {"size": "How many (a %-sign is kept).", "rate": "A rate; None = automatic.",
                               "mode": "Which mode.", "on": "Switch."}

    @dataclass
    class NoDoc:
        x: int = 1

    with pytest.raises(TypeError, match=r"NoDoc.x has no docstring"):
        parse([], (NoDoc, "n"))


def test_every_sampler_config_field_has_a_flag():
    """SDEConfig and RemaskConfig fields all reach `generate` (remdm is chosen by --sampler remdm)."""
    sub = build_parser()._subparsers._group_actions[0].choices["generate"]
    dests = {a.dest for a in sub._actions}
    for cls in (SDEConfig, RemaskConfig):
        missing = {f.name for f in dataclasses.fields(cls)} - dests - {"remdm"}
        assert not missing, (cls.__name__, missing)
    schedule = next(a for a in sub._actions if a.dest == "schedule")
    assert tuple(schedule.choices) == SCHEDULES


def _choice(argv):
    from dsl_llada.cli.main import _sampler_config

    return _sampler_config(build_parser().parse_args(["generate", "--model", "m", *argv]))


def test_generate_flags_build_the_configs():
    assert _choice([]) == SDEConfig()
    c = _choice(["--sampler", "block-sde", "--nfe", "8", "--gen-length", "32", "--block-length", "8", "--eta", "0",
                 "--predictor-noise", "--no-truncate", "--gamma-min", "0.05"])
    assert c.sampler_name == "block-sde"
    assert c == SDEConfig(nfe=8, gen_length=32, block_length=8, eta=0.0, predictor_noise=True,
                                 truncate_at_eos=False, gamma_min=0.05)
    r = _choice(["--sampler", "remdm", "--steps", "8", "--gen-length", "16", "--eos-inf", "--remdm-t-on", "0.7",
                 "--remasking", "random", "--temperature", "0.5", "--no-truncate-at-eos"])
    assert r.sampler_name == "remdm"
    assert r == RemaskConfig(steps=8, gen_length=16, eos_inf=True, remdm=True, remdm_t_on=0.7,
                                    remasking="random", temperature=0.5, truncate_at_eos=False)
    assert _choice(["--sampler", "remask", "--steps", "8"]) == RemaskConfig(steps=8)


@pytest.mark.parametrize(("argv", "message"), [
    (["--sampler", "sde", "--steps", "8"], "--steps does not apply here: SDEConfig has no such field"),
    (["--sampler", "remask", "--nfe", "8", "--top-m", "4"], "--nfe, --top-m do not apply here: RemaskConfig"),
    (["--sampler", "block-sde"], "--block-length: sampler 'block-sde' needs block_length > 0"),
    (["--sampler", "sde", "--block-length", "4"], r"--block-length: sampler 'sde' needs block_length = 0 \(block_length > 0 runs"),
])
def test_flags_of_the_other_config_are_errors(argv, message):
    with pytest.raises(ValueError, match=message):
        _choice(argv)


def test_config_validation_still_names_the_value():
    with pytest.raises(ConfigError, match="nfe=5"):
        _choice(["--nfe", "5"])


def _convert(argv):
    from dsl_llada.cli.main import _convert_config

    return _convert_config(build_parser().parse_args(["convert", "backbone", "out", *argv]))


def test_convert_flags_come_from_the_configs_and_keep_their_defaults():
    from dsl_llada.config import ConverterConfig, DSLConfig

    assert _convert([]) == DSLConfig()  # no default restated in the CLI: the dataclasses' own
    cfg = _convert(["--noise-dim", "16", "--seed", "7", "--frozen-noise-embed", "--context-embedding", "wte",
                    "--layout", "paper", "--beta-init", "5", "--value-bias-init", "torch_default"])
    assert cfg == DSLConfig(converter=ConverterConfig(noise_dim=16, noise_seed=7, trainable_noise_embed=False,
                                                      layout="paper", beta_init=5.0, value_bias_init="torch_default"),
                            context_embedding="wte")
    assert _convert(["--noise-seed", "3"]).converter.noise_seed == 3
    with pytest.raises(ConfigError, match="noise_dim=0"):
        _convert(["--noise-dim", "0"])


def test_serve_flags_come_from_server_config():
    from dsl_llada.cli.flags import config_from_args
    from dsl_llada.serve.settings import ServerConfig

    def settings(*argv):
        return config_from_args(ServerConfig, build_parser().parse_args(["serve", "--model", "m", *argv]))

    assert settings() == ServerConfig()
    assert settings("--max-batch", "3", "--max-wait-ms", "0", "--max-queue", "9", "--max-batch-tokens", "512") == \
        ServerConfig(max_batch=3, max_wait_ms=0.0, max_queue=9, max_batch_tokens=512)
    with pytest.raises(ConfigError, match="max_queue=0 must be >= 1"):
        settings("--max-queue", "0")
