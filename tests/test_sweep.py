"""The SDE sensitivity sweep (`dsl-llada demo --sweep`, toy/sweep.py) on a micro demo: rows, configs, layout, resume."""

from __future__ import annotations

import json

import pytest

from dsl_llada.cli.main import build_parser, main
from dsl_llada.config import ConfigError, SDEConfig, eta_for_nfe
from dsl_llada.toy.demo import Demo, DemoConfig
from dsl_llada.toy.demo_train import TrainStage
from dsl_llada.toy.sweep import SWEEP_GROUPS, SWEEP_SETTINGS, SweepConfig, with_context_embedding

NFES = (2, 4)


def micro_demo(out, **kw) -> Demo:
    cfg = DemoConfig(d_model=32, n_layers=1, n_heads=2, noise_dim=8, n_train=64, batch_size=8,
                     pretrain=TrainStage(objective="mdm", steps=4, lr=1e-3, warmup=1, batch_size=8),
                     cpt=TrainStage(objective="dsl", steps=4, lr=1e-3, warmup=1, batch_size=8), **kw)
    return Demo(cfg, out, progress=False, echo=lambda s: None)


@pytest.fixture(scope="module")
def swept(tmp_path_factory):
    out = tmp_path_factory.mktemp("sweep")
    sweep = SweepConfig(nfes=NFES, n_open=3, n_summarize=2, batch_size=8)
    rows = micro_demo(out).sweep(sweep)
    return out, sweep, rows


def test_one_row_per_setting_and_nfe_with_its_config(swept):
    out, sweep, rows = swept
    assert len(rows) == len(SWEEP_SETTINGS) * len(NFES)
    lines = [json.loads(x) for x in (out / "sweep" / "sweep.jsonl").read_text().splitlines()]
    assert len(lines) == len(rows)  # every table row written exactly once
    by = {(r["group"], r["setting"], r["nfe"]): r for r in lines}
    for nfe in NFES:
        default = SDEConfig(nfe=nfe, gen_length=32)
        for s in SWEEP_SETTINGS:
            r = by[(s.group, s.label, nfe)]
            cfg = SDEConfig.from_dict(r["config"])
            assert r["is_default"] == (cfg == default and r["context_embedding"] == "converter")
            assert r["open"]["n"] == 3 and r["summarize"]["n"] == 2
            assert r["sweep"] == sweep.to_dict()
        assert by[("eta", "0 (deterministic)", nfe)]["resolved_eta"] == 0.0
        assert by[("eta", "2 x paper table", nfe)]["resolved_eta"] == pytest.approx(2 * eta_for_nfe(nfe))
        assert by[("eta", "paper table (default)", nfe)]["resolved_eta"] == eta_for_nfe(nfe)
        assert by[("noise placement", "update only (Alg. 2 as printed)", nfe)]["config"]["predictor_noise"] is False
        assert by[("context", "wte (authors' code)", nfe)]["context_embedding"] == "wte"
        x1, x2 = by[("beta_inf", "1 x trained", nfe)], by[("beta_inf", "2 x trained (default)", nfe)]
        assert x2["beta_inf"] == pytest.approx(2 * x1["beta_inf"])
        assert by[("beta_inf", "absolute 2.0", nfe)]["beta_inf"] == 2.0
        # the defaults appear once per group but were sampled once: identical metrics, one run key
        defaults = [r for r in lines if r["nfe"] == nfe and r["is_default"]]
        assert len(defaults) == len(SWEEP_GROUPS) and len({r["run_key"] for r in defaults}) == 1


def test_no_truncation_keeps_the_words_after_eos(swept):
    out, _, _ = swept
    samples = [json.loads(x) for x in (out / "sweep" / "samples.jsonl").read_text().splitlines()]
    lines = [json.loads(x) for x in (out / "sweep" / "sweep.jsonl").read_text().splitlines()]
    key = {(r["setting"], r["nfe"]): r["run_key"] for r in lines}
    for nfe in NFES:
        cut = [s for s in samples if s["run_key"] == key[("at first EOS/EoT (default)", nfe)]]
        full = [s for s in samples if s["run_key"] == key[("none (authors' decode)", nfe)]]
        assert len(cut) == len(full) == 5
        for a, b in zip(cut, full):  # same seeds, same tokens: only the decoding differs
            assert b["output"].split()[: a["len"]] == a["output"].split() and b["len"] >= a["len"]
            assert "<|" not in b["output"]


def test_table_layout_and_plot(swept):
    out, _, _ = swept
    text = (out / "sweep" / "sweep.md").read_text()
    assert [line for line in text.splitlines() if line.startswith("## ")] == [
        f"## NFE {n} (eta by the paper's table: {eta_for_nfe(n)})" for n in NFES]
    header = "| Sweep | Setting | PPL | in-support % | Len | premature EOS % | Rep % | D2 % | R-1 | R-2 | R-L | sum. PPL |"
    assert text.count(header) == len(NFES)
    for g in SWEEP_GROUPS:
        assert text.count(f"| {g} |") == len(NFES)  # the group name only on its first row
    assert text.count("| world | own samples (reference) |") == len(NFES)
    assert "nan" not in text.lower()
    assert (out / "sweep" / "sweep.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    cfg = json.loads((out / "sweep" / "config.json").read_text())
    assert SweepConfig.from_dict(cfg["sweep"]).nfes == NFES


def test_rerun_resumes_without_sampling(swept, monkeypatch):
    out, sweep, rows = swept
    import dsl_llada.toy.sweep as sweep_mod

    def boom(*a, **k):
        raise AssertionError("a finished run was sampled again")

    monkeypatch.setattr(sweep_mod, "sample_records", boom)
    again = micro_demo(out).sweep(sweep)
    assert again == rows
    assert len((out / "sweep" / "sweep.jsonl").read_text().splitlines()) == len(rows)


def test_other_seed_other_outputs(swept, tmp_path):
    out, sweep, rows = swept
    import shutil

    shutil.copytree(out / "cache", tmp_path / "cache")  # same checkpoints, only the sampling seed changes
    other = micro_demo(tmp_path).sweep(sweep.replace(seed=1, groups=("eta",)))
    assert len(other) == 3 * len(NFES)
    same = {(r["setting"], r["nfe"]): r for r in rows if r["group"] == "eta"}
    # same checkpoint, new runs (not served from the seed-0 results), and the new seed reaches every prompt
    assert all(r["model"] == same[(r["setting"], r["nfe"])]["model"] for r in other)
    assert all(r["run_key"] != same[(r["setting"], r["nfe"])]["run_key"] for r in other)
    seeds = {json.loads(x)["seed"] for x in (tmp_path / "sweep" / "samples.jsonl").read_text().splitlines()}
    seeds0 = {json.loads(x)["seed"] for x in (out / "sweep" / "samples.jsonl").read_text().splitlines()}
    assert seeds == {100_003 + i for i in range(5)} and seeds0 == set(range(5))


def test_context_view_leaves_the_model_alone(swept):
    out, _, _ = swept
    from dsl_llada.core.model import DSLModel

    dsl = DSLModel.from_pretrained(next((out / "cache").glob("cpt-dsl-*")))
    view = with_context_embedding(dsl, "wte")
    assert dsl.config.context_embedding == "converter" and view.config.context_embedding == "wte"
    assert view.converter is dsl.converter and view.backbone is dsl.backbone


def test_sweep_config_errors_and_cli_flags(capsys):
    with pytest.raises(ConfigError, match="nfes=.*even"):
        SweepConfig(nfes=(3,))
    with pytest.raises(ConfigError, match="groups=.*choose from"):
        SweepConfig(groups=("nope",))
    assert SweepConfig.preset(quick=True).nfes == SweepConfig.preset(quick=False).nfes == (8, 16, 64)
    assert (SweepConfig.preset(quick=True).n_open, SweepConfig.preset(quick=False).n_open) == (8, 96)
    assert SweepConfig.preset(quick=False, n_open=10).n_summarize == 5
    a = build_parser().parse_args(["demo", "--sweep", "--sweep-prompts", "12"])
    assert a.sweep and a.sweep_prompts == 12
    assert main(["demo", "--sweep", "--sweep-prompts", "0", "--out", "/nonexistent/x"]) == 2
    assert "n_open >= 1" in capsys.readouterr().err
