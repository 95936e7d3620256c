"""Typed configs: dict / JSON round trips, validation errors that name the field, the NFE-tied eta table."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest

from dsl_llada.core.backbones.base import SpecialTokens
from dsl_llada.config import (ConfigBase, ConfigError, ConverterConfig, DSLConfig, RemaskConfig, SDEConfig, SNRConfig,
                              eta_for_nfe)

# Defaults plus one non-default instance of every config (every field changed where the type allows it).
CONFIGS = [
    ConverterConfig(),
    ConverterConfig(noise_dim=48, noise_init="pca", noise_seed=7, trainable_noise_embed=False, layout="paper",
                    beta_init=5.0, value_bias_init="torch_default", residual=True, token_chunk=0,
                    checkpoint_chunks=False),
    DSLConfig(),
    DSLConfig(converter=ConverterConfig(noise_dim=12, layout="paper"), context_embedding="wte", backbone_type="dream"),
    SDEConfig(),
    SDEConfig(nfe=8, gen_length=32, schedule="paper-exact", gamma_min=0.05, gamma_max=120.0, eta=0.0, top_m=0,
              beta_scale=1.5, beta_absolute=2.0, predictor_noise=False, truncate_at_eos=False, block_length=8),
    SDEConfig(schedule="uniform", eta=0.3),
    RemaskConfig(),
    RemaskConfig(steps=32, gen_length=64, block_length=16, remasking="random", temperature=0.7, cfg_scale=1.5,
                 eos_inf=True, eos_inf_include_eot=True, eos_suppress_ratio=0.25, remdm=True, remdm_t_on=0.6,
                 remdm_t_off=0.1, remdm_alpha_loop=0.5, remdm_authors_quota=True, remdm_confidence="argmax",
                 truncate_at_eos=False),
    SNRConfig(),
    SNRConfig(distribution="roar", lognormal_mu=1.0, lognormal_sigma=0.5, lognormal_clip=30.0, lognormal_per_token=True,
              roar_prob=0.2, roar_clear_low=70.0, roar_clear_high=90.0, roar_unknown_high=2.0),
    SpecialTokens(mask=63, eos=62, eot=61, pad=62, bos=60),
]


def _id(c: ConfigBase) -> str:
    return type(c).__name__


@pytest.mark.parametrize("cfg", CONFIGS, ids=[_id(c) for c in CONFIGS])
def test_dict_round_trip(cfg):
    d = cfg.to_dict()
    assert json.loads(json.dumps(d)) == d  # plain JSON types only
    assert type(cfg).from_dict(d) == cfg


@pytest.mark.parametrize("cfg", CONFIGS, ids=[_id(c) for c in CONFIGS])
def test_json_file_round_trip(cfg, tmp_path):
    path = tmp_path / "sub" / "cfg.json"
    cfg.save(path)
    assert type(cfg).load(path) == cfg
    assert json.loads(path.read_text()) == cfg.to_dict()
    assert [p.name for p in path.parent.iterdir()] == ["cfg.json"]  # no temp file left behind


def _all_config_classes() -> list[type]:
    """Every ConfigBase subclass the package defines (every module is imported; an import error fails the test)."""
    import importlib

    from helpers import package_modules

    for name in package_modules():
        importlib.import_module(name)
    out, todo = [], list(ConfigBase.__subclasses__())
    while todo:
        c = todo.pop()
        out.append(c)
        todo.extend(c.__subclasses__())
    return sorted(set(out), key=lambda c: c.__qualname__)


# Configs outside config.py that must be found (a shrinking discovery fails here instead of passing silently).
EXPECTED_CONFIGS = {"ConverterConfig", "DSLConfig", "SDEConfig", "RemaskConfig", "SNRConfig", "TrainConfig",
                    "ObjectiveConfig", "DataConfig", "ToyWorldConfig", "TrainStage"}


def test_every_default_constructible_config_round_trips(tmp_path):
    """Any config anywhere in the package (incl. train/toy configs): from_dict(to_dict()) == obj, via JSON too."""
    checked = []
    for cls in _all_config_classes():
        if not dataclasses.is_dataclass(cls) or cls.__module__.startswith("test"):
            continue
        assert cls.__dataclass_params__.frozen, f"{cls.__qualname__} must be a frozen dataclass"
        try:
            obj = cls()
        except (TypeError, ValueError):  # required fields (e.g. SpecialTokens) or content (EvalConfig's models):
            continue                     # covered by their own tests
        assert cls.from_dict(obj.to_dict()) == obj, cls.__qualname__
        path = tmp_path / f"{cls.__qualname__}.json"
        obj.save(path)
        assert cls.load(path) == obj, cls.__qualname__
        checked.append(cls.__name__)
    missing = EXPECTED_CONFIGS - set(checked)
    assert not missing, f"config classes not found or not round-tripped: {sorted(missing)}"


def test_nested_dict_is_a_plain_dict():
    d = DSLConfig(converter=ConverterConfig(noise_dim=12)).to_dict()
    assert d["converter"] == ConverterConfig(noise_dim=12).to_dict()
    assert isinstance(DSLConfig.from_dict(d).converter, ConverterConfig)


def test_partial_dict_uses_defaults():
    assert SDEConfig.from_dict({"nfe": 16}) == SDEConfig(nfe=16)
    assert DSLConfig.from_dict({"converter": {"noise_dim": 8}}).converter == ConverterConfig(noise_dim=8)


def test_configs_are_frozen_and_replace_revalidates():
    cfg = SDEConfig()
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.nfe = 8  # type: ignore[misc]
    assert cfg.replace(nfe=8).nfe == 8
    with pytest.raises(ConfigError, match="even"):
        cfg.replace(nfe=9)


def test_config_error_is_a_value_error():
    assert issubclass(ConfigError, ValueError)


# -- validation -----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("cls, kwargs, field", [
    (ConverterConfig, {"noise_dim": 0}, "noise_dim"),
    (ConverterConfig, {"noise_dim": 2.5}, "noise_dim"),
    (ConverterConfig, {"noise_init": "xavier"}, "noise_init"),
    (ConverterConfig, {"layout": "mine"}, "layout"),
    (ConverterConfig, {"value_bias_init": "ones"}, "value_bias_init"),
    (ConverterConfig, {"beta_init": 0.0}, "beta_init"),
    (ConverterConfig, {"beta_init": -1.0}, "beta_init"),
    (ConverterConfig, {"beta_init": math.nan}, "beta_init"),
    (ConverterConfig, {"beta_init": math.inf}, "beta_init"),
    (ConverterConfig, {"token_chunk": -1}, "token_chunk"),
    (DSLConfig, {"context_embedding": "clean"}, "context_embedding"),
    (SDEConfig, {"nfe": 7}, "even"),
    (SDEConfig, {"nfe": 0}, "nfe"),
    (SDEConfig, {"nfe": 8.0}, "nfe"),
    (SDEConfig, {"gen_length": 0}, "gen_length"),
    (SDEConfig, {"schedule": "cosine"}, "schedule"),
    (SDEConfig, {"gamma_min": 0.0}, "gamma_min"),
    (SDEConfig, {"gamma_min": 100.0, "gamma_max": 100.0}, "gamma_min < gamma_max"),
    (SDEConfig, {"eta": -0.1}, "eta"),
    (SDEConfig, {"top_m": -1}, "top_m"),
    (SDEConfig, {"beta_scale": 0.0}, "beta_scale"),
    (SDEConfig, {"beta_absolute": 0.0}, "beta_absolute"),
    (SDEConfig, {"block_length": -1}, "block_length"),
    (SDEConfig, {"gen_length": 10, "block_length": 4}, "block_length=4"),
    (RemaskConfig, {"steps": 0}, "steps"),
    (RemaskConfig, {"gen_length": 0}, "gen_length"),
    (RemaskConfig, {"steps": 10, "gen_length": 64, "block_length": 16}, "steps=10"),
    (RemaskConfig, {"gen_length": 10, "block_length": 4}, "block_length=4"),
    (RemaskConfig, {"remasking": "greedy"}, "remasking"),
    (RemaskConfig, {"temperature": -1.0}, "temperature"),
    (RemaskConfig, {"cfg_scale": -1.0}, "cfg_scale"),
    (RemaskConfig, {"eos_suppress_ratio": 1.5}, "eos_suppress_ratio"),
    (RemaskConfig, {"remdm_t_on": 0.1, "remdm_t_off": 0.2}, "remdm_t_off"),
    (RemaskConfig, {"remdm_alpha_loop": 0.0}, "remdm_alpha_loop"),
    (RemaskConfig, {"remdm_confidence": "max"}, "remdm_confidence"),
    (SNRConfig, {"distribution": "gaussian"}, "distribution"),
    (SNRConfig, {"lognormal_sigma": 0.0}, "lognormal_sigma"),
    (SNRConfig, {"lognormal_clip": 0.0}, "lognormal_clip"),
    (SNRConfig, {"roar_prob": 1.5}, "roar_prob"),
    (SNRConfig, {"roar_clear_low": 90.0, "roar_clear_high": 80.0}, "roar_clear_low"),
    (SNRConfig, {"roar_unknown_high": 0.0}, "roar_unknown_high"),
])
def test_bad_values_raise_config_error_naming_the_field(cls, kwargs, field):
    with pytest.raises(ConfigError, match=field.replace("(", r"\(")):
        cls(**kwargs)


def test_odd_nfe_message_explains_heun():
    with pytest.raises(ConfigError) as e:
        SDEConfig(nfe=7)
    assert "nfe=7" in str(e.value) and "even" in str(e.value)


def test_remask_steps_must_divide_into_blocks():
    # 64 tokens in blocks of 16 = 4 blocks: 32 steps fine, 30 steps not.
    assert RemaskConfig(steps=32, gen_length=64, block_length=16).effective_block_length == 16
    with pytest.raises(ConfigError, match="steps=30.*number of blocks 4"):
        RemaskConfig(steps=30, gen_length=64, block_length=16)
    # block_length 0 or larger than gen_length = one block
    assert RemaskConfig(steps=3, gen_length=8, block_length=0).effective_block_length == 8
    assert RemaskConfig(steps=3, gen_length=8, block_length=100).effective_block_length == 8


@pytest.mark.parametrize("cls", [ConverterConfig, DSLConfig, SDEConfig, RemaskConfig, SNRConfig])
def test_unknown_field_in_from_dict_is_named(cls):
    with pytest.raises(ConfigError, match="bogus_field"):
        cls.from_dict({"bogus_field": 1})


def test_unknown_nested_field_is_named():
    with pytest.raises(ConfigError, match="ConverterConfig.*noise_dimension"):
        DSLConfig.from_dict({"converter": {"noise_dimension": 8}})


def test_from_dict_validates_values():
    with pytest.raises(ConfigError, match="even"):
        SDEConfig.from_dict({"nfe": 5})


# -- eta and steps --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("nfe, eta", [
    (2, 0.10), (8, 0.10), (9, 0.05), (16, 0.05), (17, 0.01), (32, 0.01), (33, 0.005), (64, 0.005), (1024, 0.005)])
def test_eta_for_nfe_table(nfe, eta):
    assert eta_for_nfe(nfe) == eta


@pytest.mark.parametrize("nfe, eta", [(8, 0.10), (16, 0.05), (32, 0.01), (64, 0.005)])
def test_resolved_eta_by_nfe_and_explicit(nfe, eta):
    assert SDEConfig(nfe=nfe).resolved_eta() == eta
    assert SDEConfig(nfe=nfe, eta=0.0).resolved_eta() == 0.0
    assert SDEConfig(nfe=nfe, eta=0.3).resolved_eta() == 0.3


@pytest.mark.parametrize("nfe", [2, 8, 16, 64, 128])
def test_steps_is_half_nfe(nfe):
    assert SDEConfig(nfe=nfe).steps == nfe // 2


def test_paper_defaults():
    s = SDEConfig()
    assert (s.nfe, s.gen_length, s.schedule, s.gamma_min, s.gamma_max, s.top_m, s.beta_scale) == \
        (64, 256, "sensitive", 0.01, 100.0, 512, 2.0)
    assert s.eta is None and s.beta_absolute is None and s.predictor_noise and s.truncate_at_eos  # authors' sampler
    c = ConverterConfig()
    assert (c.noise_dim, c.beta_init, c.layout, c.noise_seed) == (100, 1.0, "released", 42)
    n = SNRConfig()
    assert (n.distribution, n.lognormal_mu, n.lognormal_sigma, n.lognormal_clip, n.roar_prob) == \
        ("mixture", 1.69, 0.9, 40.0, 0.1)
    assert (n.roar_clear_low, n.roar_clear_high, n.roar_unknown_high, n.lognormal_per_token) == (80.0, 100.0, 1.0, False)


def test_one_override_syntax_for_train_and_eval_configs():
    """`dsl_llada.overrides.apply_overrides` serves both commands: dotted dict sections (created when missing or
    null), list elements by `name` or index, a new dict returned, one clear error per bad item."""
    from dsl_llada.overrides import apply_overrides

    data = {"lr": 1e-3, "data": None, "methods": [{"name": "sde", "nfe": 8}, {"name": "llada", "nfe": 8}]}
    out = apply_overrides(data, ["lr=2e-5", "data.block_size=64", "methods.llada.nfe=16", "methods.0.nfe=[4,8]"])
    assert out == {"lr": 2e-5, "data": {"block_size": 64},
                   "methods": [{"name": "sde", "nfe": [4, 8]}, {"name": "llada", "nfe": 16}]}
    assert data["data"] is None and data["methods"][1]["nfe"] == 8  # the input is not modified
    for item, message in (("lr", r"'lr' is not of the form key=value \(e.g. lr=1e-4"),
                          ("=3", "has an empty key"),
                          ("methods.nope.nfe=1", "no list element named or numbered 'nope'"),
                          ("methods.5.nfe=1", "no list element named or numbered '5'"),
                          ("lr.x=1", "'lr' is not a section or a list")):
        with pytest.raises(ConfigError, match=message):
            apply_overrides(data, [item])
    with pytest.raises(ConfigError, match=r"e.g. nfe=\[8,16\]"):
        apply_overrides(data, ["nfe"], example="nfe=[8,16]")


def test_the_forward_options_are_declared_once_and_keep_each_samplers_field_order():
    from dsl_llada.cli.flags import field_docs
    from dsl_llada.config import ForwardOptions

    shared = ["kv_cache", "cache_refresh", "compile"]
    assert [f.name for f in dataclasses.fields(ForwardOptions)] == shared
    sde = [f.name for f in dataclasses.fields(SDEConfig)]
    remask = [f.name for f in dataclasses.fields(RemaskConfig)]
    assert sde[-3:] == shared and sde[:2] == ["nfe", "gen_length"] and len(sde) == 16
    assert remask[-4:] == [*shared, "threshold"] and remask[:2] == ["steps", "gen_length"] and len(remask) == 20
    for cls in (SDEConfig, RemaskConfig):
        assert issubclass(cls, ForwardOptions)
        assert {k: field_docs(cls)[k] for k in shared} == field_docs(ForwardOptions)
        cfg = cls(kv_cache="dual", cache_refresh=4)
        assert cls.from_dict(json.loads(cfg.to_json())) == cfg
        assert cls.from_dict({"kv_cache": "prefix"}).to_dict()["cache_refresh"] == 0
        with pytest.raises(ConfigError, match=r"compile=True with kv_cache='prefix' is not supported"):
            cls(kv_cache="prefix", compile=True)
        with pytest.raises(ConfigError, match=r"cache_refresh=-1 must be an int >= 0"):
            cls(cache_refresh=-1)
        with pytest.raises(ConfigError, match=r"compile='yes' must be true or false"):
            cls(compile="yes")
