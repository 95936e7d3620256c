"""The `dsl-llada` command line: every subcommand's --help, generate / convert on tiny models, clear errors."""

from __future__ import annotations

import json

import pytest
from helpers import toy_backbone_folder

from dsl_llada.cli.main import main
from dsl_llada.core.model import DSLModel


@pytest.fixture(scope="module")
def toy_backbone_dir(tmp_path_factory):
    """A tiny random LLaDA over the toy world's vocabulary, saved with the world's tokenizer (and chat template)."""
    return toy_backbone_folder(tmp_path_factory.mktemp("cli") / "backbone")


HELP_OPTIONS = {
    "generate": ["--model", "--prompt", "--prompts-file", "--seed", "--batch-size", "--batching", "--output", "--sampler",
                 "--gen-length", "--nfe",
                 "--schedule", "--eta", "--top-m", "--beta-scale", "--beta-absolute", "--predictor-noise", "--steps",
                 "--block-length", "--temperature", "--remasking", "--cfg-scale", "--eos-inf", "--no-truncate",
                 "--kv-cache", "--cache-refresh"],
    "convert": ["--noise-dim", "--noise-init", "--beta-init", "--layout", "--context-embedding", "--frozen-noise-embed",
                "--seed", "--dtype"],
    "demo": ["--quick", "--out", "--controls", "--seed", "--quiet", "--sweep", "--cache-frontier"],
    "train": ["--config", "--print-config", "--quiet", "KEY=VALUE"],
}


@pytest.mark.parametrize("sub", sorted(HELP_OPTIONS))
def test_subcommand_help(sub, capsys):
    """Each subcommand's --help lists its options (not only the usage line argparse always prints)."""
    with pytest.raises(SystemExit) as e:
        main([sub, "--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    missing = [o for o in HELP_OPTIONS[sub] if o not in out]
    assert not missing, f"{sub} --help lacks {missing}"


def test_generate_help_lists_schedules_and_samplers(capsys):
    with pytest.raises(SystemExit):
        main(["generate", "--help"])
    out = capsys.readouterr().out
    for name in ("sensitive", "paper-exact", "uniform", "sde", "block-sde", "remask", "remdm", "low_confidence",
                 "random"):
        assert name in out


def test_convert_then_generate_sde_and_remask(toy_backbone_dir, tmp_path, capsys):
    dsl_dir = tmp_path / "dsl"
    assert main(["convert", str(toy_backbone_dir), str(dsl_dir), "--noise-dim", "16"]) == 0
    model = DSLModel.from_pretrained(dsl_dir)
    assert model.noise_dim == 16 and (dsl_dir / "tokenizer.json").exists()
    prompts = ["write about the ocean .", "describe the forest ."]
    for sampler, extra in (("sde", ["--nfe", "4"]), ("remask", ["--steps", "4"]), ("remdm", ["--steps", "4"]),
                           ("block-sde", ["--nfe", "2", "--block-length", "4"])):
        out = tmp_path / f"{sampler}.jsonl"
        args = ["generate", "--model", str(dsl_dir), "--sampler", sampler, "--gen-length", "8", "--batch-size", "1",
                "--output", str(out), "-q", *extra]
        for p in prompts:
            args += ["--prompt", p]
        assert main(args) == 0, sampler
        recs = [json.loads(line) for line in out.read_text().splitlines()]
        assert [r["index"] for r in recs] == [0, 1]
        assert all(r["sampler"] == sampler and r["length"] <= 8 for r in recs)
        assert all(r["seed"] == 42 + r["index"] for r in recs)
        cfg = json.loads((tmp_path / f"{sampler}.jsonl.config.json").read_text())
        assert cfg["sampler"] == sampler
    # approximate caching reaches the sampler from the command line and is recorded with the outputs
    out = tmp_path / "cached.jsonl"
    assert main(["generate", "--model", str(dsl_dir), "--sampler", "block-sde", "--nfe", "2", "--block-length", "4",
                 "--gen-length", "8", "--kv-cache", "dual", "--cache-refresh", "2", "--output", str(out), "-q",
                 "--prompt", prompts[0]]) == 0
    cfg = json.loads((tmp_path / "cached.jsonl.config.json").read_text())
    assert json.dumps(cfg).count('"kv_cache": "dual"') == 1 and '"cache_refresh": 2' in json.dumps(cfg)
    # batch size does not change results: prompt i always uses seed + i
    a = tmp_path / "b1.jsonl"
    b = tmp_path / "b2.jsonl"
    base = ["generate", "--model", str(dsl_dir), "--sampler", "sde", "--nfe", "4", "--gen-length", "8", "-q",
            "--dtype", "float32", "--prompt", prompts[0], "--prompt", prompts[1]]  # pinned: equal tokens on any CPU
    assert main([*base, "--batch-size", "1", "--output", str(a)]) == 0
    assert main([*base, "--batch-size", "2", "--output", str(b)]) == 0
    ids = lambda p: [json.loads(x)["response_ids"] for x in p.read_text().splitlines()]  # noqa: E731
    assert ids(a) == ids(b)
    c = tmp_path / "seed.jsonl"  # the twin: another --seed gives other tokens (the seed reaches the sampler)
    assert main([*base, "--batch-size", "2", "--seed", "1000", "--output", str(c)]) == 0
    assert ids(c) != ids(a)


def test_generate_errors(toy_backbone_dir, capsys):
    base = ["generate", "--model", str(toy_backbone_dir), "--prompt", "hi", "-q"]
    # SDE needs a DSL checkpoint
    assert main([*base, "--sampler", "sde", "--nfe", "4", "--gen-length", "8"]) == 2
    assert "needs a DSL checkpoint" in capsys.readouterr().err
    # odd NFE for Heun
    assert main([*base, "--sampler", "sde", "--nfe", "5"]) == 2
    assert "even" in capsys.readouterr().err
    # prompt longer than the context
    assert main([*base, "--sampler", "remask", "--steps", "4", "--gen-length", "400"]) == 2
    assert "exceeds the model's context" in capsys.readouterr().err
    # a cache option that is not valid, and one that this sampler cannot combine
    with pytest.raises(SystemExit) as e:
        main([*base, "--sampler", "remask", "--steps", "4", "--kv-cache", "full"])
    assert e.value.code == 2
    assert "argument --kv-cache: invalid choice: 'full'" in capsys.readouterr().err
    assert main([*base, "--sampler", "remask", "--steps", "4", "--kv-cache", "dual", "--cfg-scale", "1"]) == 2
    assert "kv_cache='dual' with cfg_scale=1.0 is not supported" in capsys.readouterr().err
    # no prompts
    assert main(["generate", "--model", str(toy_backbone_dir), "-q"]) == 2
    assert "no prompts" in capsys.readouterr().err


def test_missing_checkpoint_folder(tmp_path, capsys):
    assert main(["generate", "--model", str(tmp_path / "nope"), "--prompt", "x", "--sampler", "remask"]) == 2
    assert "does not exist" in capsys.readouterr().err
