"""A non-editable install works without the checkout: the package is built into a wheel, installed into a fresh
virtual environment and its `dsl-llada` command run from a folder outside the checkout.

The fresh environment sees this interpreter's third-party packages (torch, transformers, ...) through a path file,
but not the checkout: no PYTHONPATH, no editable finder (a path file's own path files are not read), another working
directory. The wheel is built from a copy of the sources, offline (`--no-build-isolation`), so the checkout gets no
build/ folder."""

from __future__ import annotations

import json
import os
import shutil
import site
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest
from helpers import toy_backbone_folder

from dsl_llada.cli.main import main

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.install


def _run(args: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    out = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, f"{args[:3]} exited {out.returncode}:\n{out.stdout[-2000:]}\n{out.stderr[-3000:]}"
    return out


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> tuple[Path, dict[str, str], Path]:
    """(the fresh environment's bin/ folder, the environment variables to run it with, the built wheel)."""
    tmp = tmp_path_factory.mktemp("install")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    src = tmp / "source"
    shutil.copytree(ROOT / "src", src / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, src / name)
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-q",
          "-w", str(tmp / "dist"), str(src)], tmp, env)
    wheel = next((tmp / "dist").glob("dsl_llada-*.whl"))
    venv = tmp / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", str(venv)], tmp, env)
    bin_dir = venv / ("Scripts" if os.name == "nt" else "bin")
    python = bin_dir / "python"
    purelib = Path(_run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], tmp,
                        env).stdout.strip())
    # this interpreter's third-party packages, after the environment's own (dsl_llada comes from the wheel)
    parents = dict.fromkeys([*site.getsitepackages(), sysconfig.get_paths()["purelib"]])
    (purelib / "parent_packages.pth").write_text("".join(f"{p}\n" for p in parents))
    _run([sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "--no-build-isolation",
          "--no-index", "-q", str(wheel)], tmp, env)
    return bin_dir, env, wheel


def test_the_wheel_holds_the_package_and_no_checkout_tool(installed):
    _, _, wheel = installed
    names = zipfile.ZipFile(wheel).namelist()
    assert "dsl_llada/cli/main.py" in names and "dsl_llada/sampling/sde.py" in names and "dsl_llada/py.typed" in names
    assert not [n for n in names if n.startswith(("tests/", "scripts/", "benchmarks/", "docs/"))]
    assert "dsl_llada/docs_tables.py" not in names
    entry_points = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
    assert "dsl-llada = dsl_llada.cli.main:main" in zipfile.ZipFile(wheel).read(entry_points).decode()


def test_the_installed_command_runs_outside_the_checkout(installed, tmp_path):
    bin_dir, env, _ = installed
    where = _run([str(bin_dir / "python"), "-c", "import dsl_llada; print(dsl_llada.__file__)"], tmp_path, env)
    assert Path(where.stdout.strip()).is_relative_to(bin_dir.parent)  # the wheel's copy, not the checkout's
    out = _run([str(bin_dir / "dsl-llada"), "--help"], tmp_path, env).stdout
    for sub in ("generate", "convert", "train", "demo", "eval", "serve"):
        assert sub in out
    assert "--model" in _run([str(bin_dir / "dsl-llada"), "generate", "--help"], tmp_path, env).stdout


def test_the_installed_generate_matches_the_checkout(installed, tmp_path, one_thread):
    """`dsl-llada convert` then `generate --sampler sde` from the installed command give the same tokens as the
    checkout's `main` with the same arguments, and the sampler reads the seed (another seed, other tokens)."""
    bin_dir, env, _ = installed
    backbone = toy_backbone_folder(tmp_path / "backbone")
    _run([str(bin_dir / "dsl-llada"), "convert", str(backbone), str(tmp_path / "dsl"), "--noise-dim", "16"],
         tmp_path, env)
    args = ["generate", "--model", str(tmp_path / "dsl"), "--sampler", "sde", "--nfe", "4", "--gen-length", "8",
            "--dtype", "float32", "--threads", "1", "-q", "--prompt", "write about the ocean .",
            "--prompt", "describe the forest ."]
    _run([str(bin_dir / "dsl-llada"), *args, "--output", str(tmp_path / "installed.jsonl")], tmp_path, env)
    assert main([*args, "--output", str(tmp_path / "checkout.jsonl")]) == 0
    assert main([*args, "--seed", "7", "--output", str(tmp_path / "seed7.jsonl")]) == 0

    def ids(name: str) -> list[list[int]]:
        return [json.loads(line)["response_ids"] for line in (tmp_path / name).read_text().splitlines()]

    assert len(ids("installed.jsonl")) == 2
    assert ids("installed.jsonl") == ids("checkout.jsonl")
    assert ids("seed7.jsonl") != ids("checkout.jsonl")
