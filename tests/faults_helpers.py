"""Shared fixtures-as-functions for the fault tests (tests/test_faults_*.py): a tiny toy-world backbone and DSL
checkpoint on disk, and helpers that snapshot a folder so a test can assert that nothing the user had is gone."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import torch

from dsl_llada.core.backbones import LLaDABackbone, save_backbone, tiny_llada_config
from dsl_llada.core.backbones.base import SpecialTokens
from dsl_llada.toy import ToyWorld, ToyWorldConfig, build_tokenizer, special_ids

CONTEXT = 64
"""max_sequence_length of the tiny models: small, so an over-long prompt is cheap to write."""

GENERATE_SAMPLING = ["--sampler", "remask", "--steps", "4", "--gen-length", "8", "-q"]
"""The cheap sampler flags of the `generate` fault tests."""


def generate_prompts(n: int) -> list[str]:
    """`n` prompts of three lengths for the `generate` fault tests."""
    return [f"write about the ocean {'and the forest ' * (i % 3)}." for i in range(n)]


def make_dsl_dir(folder: Path) -> Path:
    """`folder`/dsl: `dsl-llada convert` of a tiny backbone (`make_backbone_dir`) made in `folder`/backbone."""
    from dsl_llada.cli.main import main

    assert main(["convert", str(make_backbone_dir(folder / "backbone")), str(folder / "dsl"), "--noise-dim", "8"]) == 0
    return folder / "dsl"


def write_prompts_jsonl(path: Path, prompts: list[str]) -> Path:
    """A prompts file of `{"prompt": ...}` lines."""
    path.write_text("".join(json.dumps({"prompt": t}) + "\n" for t in prompts))
    return path


def make_backbone_dir(path: Path) -> Path:
    """A tiny random LLaDA over the 2-topic toy world's vocabulary, saved with the world's tokenizer."""
    world = ToyWorld(ToyWorldConfig(n_topics=2))
    tok = build_tokenizer(world)
    s = special_ids(tok)
    cfg = tiny_llada_config(world.vocab_size, mask_token_id=s["mask"], eos_token_id=s["eos"], eot_token_id=s["eot"],
                            bos_token_id=s["bos"], max_sequence_length=CONTEXT)
    bb = LLaDABackbone(cfg, SpecialTokens(mask=s["mask"], eos=s["eos"], eot=s["eot"], pad=s["pad"], bos=s["bos"]))
    bb.init_weights(torch.Generator().manual_seed(0), std=0.3)
    save_backbone(bb, path)
    tok.save_pretrained(str(path))
    return path


def snapshot(folder: Path) -> dict[str, str]:
    """Relative path -> sha256 of every file under `folder` (hidden files included)."""
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def error_lines(err: str) -> list[str]:
    """Non-empty stderr lines (log lines from the library start with a level name and are left out)."""
    return [ln for ln in err.splitlines() if ln.strip() and not ln.startswith(("INFO ", "WARNING ", "DEBUG "))]


def refused(capsys, argv: list[str]) -> str:
    """Run the CLI in-process on `argv`: it must exit 2 with exactly one 'error: ' line on stderr; returns that line."""
    from dsl_llada.cli.main import main

    capsys.readouterr()
    rc = main(argv)
    err = capsys.readouterr().err
    assert rc == 2, err
    (line,) = error_lines(err)
    assert line.startswith("error: ")
    return line
