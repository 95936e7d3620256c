"""Faults 4, 6 and 9 of docs/reliability.md's fault-injection table for `generate`: every numeric sampler setting is
finite and inside a derived range (the error states the bound and why), a run whose state still leaves float32's range
stops with an error naming the settings (never NUL-byte text with exit 0), and accepted inputs are bounded
(nfe/steps/gen_length, prompt files read line by line with a maximum line length, /dev/zero refused at once)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from faults_helpers import error_lines, make_backbone_dir

import dsl_llada.core.loading as loading_mod
from dsl_llada.cli.main import main
from dsl_llada.config import (FP32_MAX, FP32_TINY, MAX_HEUN_RATIO, MAX_NFE, RemaskConfig, SDEConfig,
                              check_number)
from dsl_llada.errors import ConfigError
from dsl_llada.core.loading import MAX_PROMPT_LINE_BYTES, read_prompts
from dsl_llada.snr import snr_schedule


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    d = tmp_path_factory.mktemp("faults-bounds")
    assert main(["convert", str(make_backbone_dir(d / "backbone")), str(d / "dsl"), "--noise-dim", "8"]) == 0
    return d / "dsl"


def run(model, out: Path, *sampler: str, prompt: str = "write about the ocean .") -> int:
    return main(["generate", "--model", str(model), "--prompt", prompt, "--gen-length", "8", "-q", *sampler,
                 "--output", str(out)])


def one_error(capsys) -> str:
    found = error_lines(capsys.readouterr().err)
    assert len(found) == 1, found
    return found[0]


# -- fault 6: each reproducer is one line naming the setting, exit 2, nothing written ------------------------
@pytest.mark.parametrize("sampler, named", [
    (["--gamma-min", "1e-300", "--nfe", "64"], "gamma_min=1e-300"),
    (["--eta", "inf"], "eta=inf"),
    (["--gamma-max", "inf"], "gamma_max=inf"),
    (["--gamma-max", "1e300", "--schedule", "paper-exact"], "gamma_max=1e+300"),
    (["--beta-scale", "inf"], "beta_scale=inf"),
    (["--sampler", "remask", "--steps", "4", "--temperature", "inf"], "temperature=inf"),
    (["--sampler", "remask", "--steps", "4", "--cfg-scale", "inf"], "cfg_scale=inf"),
    (["--sampler", "remask", "--steps", "4", "--cfg-scale", "nan"], "cfg_scale=nan"),
    (["--nfe", "2000000000"], "nfe=2000000000"),
    (["--sampler", "remask", "--steps", "800000"], "steps=800000"),
])
def test_issue_reproducers_are_refused_before_anything_is_written(model, tmp_path, capsys, sampler, named):
    out = tmp_path / "o.jsonl"
    assert run(model, out, *sampler) == 2
    line = one_error(capsys)
    assert named in line and ("must be" in line or "at most" in line), line
    assert not out.exists() and not Path(str(out) + ".config.json").exists()


@pytest.mark.parametrize("sampler, named", [
    (["--nfe", "8", "--eta", "1e35"], "eta=1e+35"),  # inside eta's bound, but the state overflows in the model
    (["--schedule", "uniform", "--gamma-min", "1e-30", "--nfe", "64"], "gamma_min=1e-30"),
    (["--nfe", "8", "--beta-scale", "1e38"], "beta_scale"),
])
def test_a_state_that_leaves_float32_stops_the_run_naming_the_settings(model, tmp_path, capsys, sampler, named):
    out = tmp_path / "o.jsonl"
    assert run(model, out, *sampler) == 2
    line = one_error(capsys)
    assert named in line and ("non-finite" in line or "overflow" in line), line
    assert not out.exists() or out.read_text() == ""  # no record, certainly none with NUL-byte text


@pytest.mark.parametrize("sampler", [
    ["--nfe", "8", "--eta", "1e30"], ["--nfe", "2", "--gamma-min", "1e-5"], ["--nfe", "8", "--beta-scale", "1e30"],
    ["--sampler", "remask", "--steps", "4", "--cfg-scale", "16000000"],
    ["--sampler", "remask", "--steps", "4", "--temperature", "1e306"],
])
def test_extreme_accepted_settings_give_real_text(model, tmp_path, capsys, sampler):
    out = tmp_path / "o.jsonl"
    assert run(model, out, *sampler) == 0
    rec = json.loads(out.read_text())
    assert "error" not in rec and rec["response"].strip() and "\x00" not in rec["response"]


@pytest.mark.parametrize("batching", ["continuous", "fixed"])
def test_a_nan_state_from_the_sampler_is_an_error_not_token_zero(model, tmp_path, capsys, monkeypatch, batching):
    """The remasking step's own check: NaN logits after the first forward (a diverging guidance, a damaged layer
    reached late) stop the run instead of decoding argmax(NaN) = token 0 (a NUL byte), on the engine's remasking
    row as in the remasking loop."""
    import dsl_llada.sampling.remask as remask_mod
    from dsl_llada.sampling.engine import Engine

    calls = []
    if batching == "fixed":
        real = remask_mod.block_logits

        def nan_on_second_call(*a, **k):
            logits = real(*a, **k)
            calls.append(1)
            return logits * float("nan") if len(calls) >= 2 else logits

        monkeypatch.setattr(remask_mod, "block_logits", nan_on_second_call)
    else:
        real_forward = Engine._forward

        def nan_on_second_tick(self, rows, seqs):
            logits = real_forward(self, rows, seqs)
            calls.append(1)
            return {k: [t * float("nan") for t in v] for k, v in logits.items()} if len(calls) >= 2 else logits

        monkeypatch.setattr(Engine, "_forward", nan_on_second_tick)
    out = tmp_path / "o.jsonl"
    assert run(model, out, "--sampler", "remask", "--steps", "4", "--batching", batching) == 2
    line = one_error(capsys)
    assert "NaN at block step 1" in line and "temperature=0.0" in line and "cfg_scale=0.0" in line
    assert out.read_text() == ""


# -- fault 4: the bounds are derived and stated ----------------------------------------------------------
def test_heun_step_ratio_bound_is_the_float32_epsilon():
    assert MAX_HEUN_RATIO == 2.0 ** 23
    SDEConfig(nfe=2, gamma_min=74.0 / MAX_HEUN_RATIO * 1.01)  # one step 74 / gamma_min just under 2^23: accepted
    with pytest.raises(ConfigError, match=r"Heun step 0 jump.*at most 2\^23"):
        SDEConfig(nfe=2, gamma_min=74.0 / MAX_HEUN_RATIO * 0.99)
    # more steps split the same range into smaller jumps: 1e-30 -> 100 over 32 steps is x10 per step
    cfg = SDEConfig(nfe=64, schedule="uniform", gamma_min=1e-30)
    grid = snr_schedule(cfg.schedule, cfg.steps, cfg.gamma_min, cfg.gamma_max)
    assert float((grid[1:] / grid[:-1]).max()) == pytest.approx(10.0)


@pytest.mark.parametrize("field, bad, bound", [
    ("gamma_min", FP32_TINY / 2, "1.17549e-38"), ("gamma_max", FP32_MAX * 2, "3.40282e+38"),
    ("gamma_max", float("nan"), "finite"), ("eta", -0.1, ">= 0"), ("eta", float("nan"), "finite"),
    ("beta_scale", 0.0, "> 0"), ("beta_scale", float("inf"), "finite"), ("beta_absolute", 1e37, "<= 3.40282e+36"),
    ("converter_tolerance", float("nan"), "finite"), ("nfe", MAX_NFE + 2, f"<= {MAX_NFE}"), ("nfe", 64.0, "an int"),
    ("gen_length", 10 ** 9, "<= 131072"), ("top_m", -1, ">= 0"),
])
def test_sde_bounds_name_the_field_and_the_range(field, bad, bound):
    with pytest.raises(ConfigError) as e:
        SDEConfig(**{field: bad})
    assert f"{field}={bad!r}" in str(e.value) and bound in str(e.value)


@pytest.mark.parametrize("field, bad, bound", [
    ("temperature", float("inf"), "finite"), ("temperature", 1e307, "<= 4.85863e+306"), ("temperature", -1.0, ">= 0"),
    ("cfg_scale", 2.0 ** 24 + 1, "<= 1.67772e+07"), ("cfg_scale", float("-inf"), "finite"),
    ("steps", MAX_NFE + 1, f"<= {MAX_NFE}"), ("gen_length", 0, ">= 1"), ("block_length", -1, ">= 0"),
])
def test_remask_bounds_name_the_field_and_the_range(field, bad, bound):
    with pytest.raises(ConfigError) as e:
        RemaskConfig(**{field: bad})
    assert f"{field}={bad!r}" in str(e.value) and bound in str(e.value)


def test_bounds_at_their_edges_are_accepted():
    SDEConfig(eta=0.0, beta_absolute=FP32_MAX / 100.0, converter_tolerance=0.0, nfe=MAX_NFE)
    RemaskConfig(steps=MAX_NFE // 4 * 4, cfg_scale=2.0 ** 24, temperature=1e306, gen_length=256)
    check_number("x", 1.0, lo=1.0, hi=1.0)
    with pytest.raises(ConfigError, match=r"x=True is not valid"):
        check_number("x", True, lo=0.0)
    assert (FP32_MAX, FP32_TINY) == (torch.finfo(torch.float32).max, torch.finfo(torch.float32).tiny)
    assert MAX_HEUN_RATIO == 1 / torch.finfo(torch.float32).eps


# -- fault 9: prompt files are read line by line, bounded -----------------------------------------------
def test_dev_zero_is_refused_after_one_line(tmp_path):
    with pytest.raises(ValueError, match=r"/dev/zero:1: line longer than 4,194,304 bytes"):
        read_prompts("/dev/zero")


def test_dev_zero_through_the_cli_is_one_line(model, tmp_path, capsys):
    out = tmp_path / "o.jsonl"
    assert main(["generate", "--model", str(model), "--prompts-file", "/dev/zero", "-q", "--output", str(out)]) == 2
    assert "line longer than" in one_error(capsys)
    assert not out.exists()


def test_long_lines_and_counts_are_bounded(tmp_path, monkeypatch):
    p = tmp_path / "p.txt"
    p.write_bytes(b"short prompt\n" + b"x" * (MAX_PROMPT_LINE_BYTES + 10) + b"\n")
    with pytest.raises(ValueError, match=rf"{p}:2: line longer than"):
        read_prompts(p)
    p.write_bytes(b"x" * MAX_PROMPT_LINE_BYTES + b"\n")  # exactly the limit (newline excluded) is fine
    assert len(read_prompts(p)[0]) == MAX_PROMPT_LINE_BYTES
    monkeypatch.setattr(loading_mod, "MAX_PROMPTS", 3)
    p.write_text("a\nb\nc\n")
    assert read_prompts(p) == ["a", "b", "c"]
    p.write_text("a\nb\nc\nd\n")
    with pytest.raises(ValueError, match="more than 3 prompts"):
        read_prompts(p)
    p.write_text("\n" * 31)  # blank lines count too (x10): an endless stream of newlines ends
    with pytest.raises(ValueError, match="more than 30 lines"):
        read_prompts(p)


def test_jsonl_lines_and_bad_bytes_name_the_line(tmp_path):
    p = tmp_path / "p.jsonl"
    p.write_bytes(b'{"prompt": "one"}\n\n"two"\r\n')
    assert read_prompts(p) == ["one", "two"]
    p.write_bytes(b'{"prompt": "one"}\n{"prompt": "\xff"}\n')
    with pytest.raises(ValueError, match=rf"{p}:2: not UTF-8"):
        read_prompts(p)
