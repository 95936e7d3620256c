"""The sampler registry: one table of every sampler (name, config class, function, description) and the one parser
from (name, overrides) to a validated config that the CLI, the server, the evaluation suite and the lm-eval adapter
all call. The CLI's and the server's sampler lists and the table in docs/samplers.md are generated from it.

Adding a sampler: its config class (in `dsl_llada.config`, with a `sampler_name` that names it), its function (here,
in `sampling/`), one row in `REGISTRY`, and its tests. Nothing else names samplers.
"""

from __future__ import annotations

import dataclasses
import re
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..config import BLOCK_SDE, REMASK, REMDM, SDE, RemaskConfig, SDEConfig
from ..errors import ConfigError
from .common import SampleOutput
from .remask import sample_remask
from .sde import sample_sde

__all__ = ["REGISTRY", "SAMPLERS", "SamplerConfig", "SamplerSettingError", "SamplerSpec", "get_spec", "parse_text_value",
           "sampler_config", "sampler_help", "sampler_table_markdown", "spec_of"]

SamplerConfig = SDEConfig | RemaskConfig
"""A sampler's typed config; its `sampler_name` names its row in the registry."""


@dataclass(frozen=True)
class SamplerSpec:
    """One sampler: what a caller needs to build its config and run it."""

    name: str
    """The sampler's name everywhere (`--sampler`, the request field `sampler`, records, lm-eval's `sampler=`)."""
    config_class: type[SDEConfig] | type[RemaskConfig]
    """Its settings; the name's config is `config_class(**fixed, **overrides)`."""
    run: Callable[..., SampleOutput]
    """`run(model, prompts, config, *, generator, callback, progress, return_trajectory) -> SampleOutput`."""
    label: str
    """Short display name (the web UI's)."""
    description: str
    """One line for `--help` and docs/samplers.md."""
    requirement: tuple[str, str]
    """(field, condition) a config must meet to be this sampler rather than its sibling, e.g. ('block_length',
    'block_length > 0'); checked through the built config's `sampler_name`."""
    needs_dsl: bool
    """Needs a DSL checkpoint (noise embedding + converter); a bare masked-diffusion backbone cannot run it."""
    steps_field: str
    """The field that sets how many model evaluations the sampler spends ('nfe' or 'steps')."""
    fixed: Mapping[str, Any] = field(default_factory=dict)
    """Fields the name decides (not settable by an override)."""

    def fields(self) -> list[str]:
        """The config fields an override may set for this sampler (sorted)."""
        return sorted(f.name for f in dataclasses.fields(self.config_class) if f.name not in self.fixed)


REGISTRY: dict[str, SamplerSpec] = {s.name: s for s in (
    SamplerSpec(SDE, SDEConfig, sample_sde, "DSL-SDE (Heun)",
                "DSL-LLaDA-SDE: the Heun solver of the continuous-noise SDE over the whole response (the paper's sampler)",
                ("block_length", "block_length = 0 (block_length > 0 runs 'block-sde')"), needs_dsl=True,
                steps_field="nfe"),
    SamplerSpec(BLOCK_SDE, SDEConfig, sample_sde, "Block SDE",
                "Block SDE: the SDE sampler over blocks of block_length tokens, left to right",
                ("block_length", "block_length > 0 (tokens per block)"), needs_dsl=True, steps_field="nfe"),
    SamplerSpec(REMASK, RemaskConfig, sample_remask, "LLaDA remasking",
                "LLaDA's discrete low-confidence (or random) remasking; runs on a DSL checkpoint or a bare backbone",
                ("remdm", "remdm = false"), needs_dsl=False, steps_field="steps", fixed={"remdm": False}),
    SamplerSpec(REMDM, RemaskConfig, sample_remask, "ReMDM-conf-loop",
                "ReMDM-conf-loop: remasking that may re-mask committed tokens inside its loop window",
                ("remdm", "remdm = true"), needs_dsl=False, steps_field="steps", fixed={"remdm": True}),
)}
"""Every sampler, by name, in the order the CLI and docs list them."""

SAMPLERS: tuple[str, ...] = tuple(REGISTRY)
"""Every sampler name (every `sampler_name` a SamplerConfig can have)."""


class SamplerSettingError(ConfigError):
    """An invalid sampler name or setting; `field` names the offending setting ('sampler' for the name, None when
    no single field is to blame)."""

    def __init__(self, message: str, field: str | None = None):
        super().__init__(message)
        self.field = field


def get_spec(name: str) -> SamplerSpec:
    """The registry row of sampler `name`; SamplerSettingError naming the valid names otherwise."""
    spec = REGISTRY.get(name)
    if spec is None:
        raise SamplerSettingError(f"sampler={name!r} is not valid; expected one of {list(SAMPLERS)}", "sampler")
    return spec


def spec_of(config: object) -> SamplerSpec:
    """The registry row of the sampler a config runs (TypeError for an object that is no sampler config)."""
    if not isinstance(config, (SDEConfig, RemaskConfig)):
        raise TypeError(f"config of type {type(config).__name__} names no sampler; expected SDEConfig or RemaskConfig")
    return REGISTRY[config.sampler_name]


def parse_text_value(cls: type, key: str, value: Any) -> Any:
    """A setting written as text (lm-eval's `--model_args`, `--sampler-arg KEY=VALUE`) as field `key`'s type of
    config class `cls`; non-strings pass through. SamplerSettingError naming the field when it does not parse."""
    if not isinstance(value, str):
        return value
    text = str(typing.get_type_hints(cls)[key])
    low = value.strip().lower()
    if low in ("none", "null") and "None" in text:
        return None
    try:
        if "bool" in text:
            if low not in ("true", "false", "1", "0"):
                raise ValueError(f"expected true/false, got {value!r}")
            return low in ("true", "1")
        if "int" in text and "float" not in text:
            return int(value)
        if "float" in text:
            return float(value)
    except ValueError as e:
        raise SamplerSettingError(f"{key}={value!r} is not valid: {e}", key) from None
    return value


_FIELD_IN_MESSAGE = re.compile(r"\b([a-z_]+)=")


def sampler_config(name: str, overrides: Mapping[str, Any] | None = None, *, text: bool = False) -> SamplerConfig:
    """The validated config of sampler `name` with `overrides` (config field -> value); every field not given keeps
    the config's default (the paper's settings). `text=True` parses string values as their fields' types.

    Raises SamplerSettingError (a ConfigError, so a ValueError) naming the field: an unknown sampler, a field the
    sampler does not have (or one its name decides, like `remdm`), a value the config rejects, or settings that make
    it another sampler (e.g. 'block-sde' without block_length > 0).
    """
    spec = get_spec(name)
    given = dict(overrides or {})
    valid = spec.fields()
    for key in given:
        if key not in valid:
            raise SamplerSettingError(f"unknown field {key!r} for sampler {name!r}; valid fields are {valid}", key)
    if text:
        given = {k: parse_text_value(spec.config_class, k, v) for k, v in given.items()}
    try:
        config = spec.config_class(**given, **spec.fixed)
    except ConfigError as e:
        m = _FIELD_IN_MESSAGE.search(str(e))
        raise SamplerSettingError(str(e), m.group(1) if m else None) from None
    except TypeError as e:  # e.g. a comparison with a wrongly typed value
        raise SamplerSettingError(f"invalid sampler settings: {e}") from None
    if config.sampler_name != name:
        field_name, condition = spec.requirement
        raise SamplerSettingError(f"sampler {name!r} needs {condition}", field_name)
    return config


def _condition(spec: SamplerSpec) -> str:
    """What sets a config to this sampler: its fixed fields, or its requirement (e.g. 'block_length > 0')."""
    if spec.fixed:
        return ", ".join(f"{k}={v}" for k, v in spec.fixed.items())
    return spec.requirement[1].split(" (")[0]


def sampler_help() -> str:
    """One entry per sampler (`--sampler`'s help)."""
    return "; ".join(f"{s.name} = {s.label}" + ("" if s.fixed else f" ({_condition(s)})") for s in REGISTRY.values())


def sampler_table_markdown() -> str:
    """docs/samplers.md's sampler table (a test checks the doc holds exactly this)."""
    rows = ["| sampler | config | set by | checkpoint | model evaluations set by | what it does |", "|---|---|---|---|---|---|"]
    for s in REGISTRY.values():
        rows.append(f"| `{s.name}` | `{s.config_class.__name__}` | `{_condition(s)}` | "
                    f"{'DSL checkpoint' if s.needs_dsl else 'DSL checkpoint or bare backbone'} | `{s.steps_field}` | "
                    f"{s.description} |")
    return "\n".join(rows) + "\n"
