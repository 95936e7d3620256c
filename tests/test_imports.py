"""Every module of the package imports on its own (no import cycles hidden by a lucky import order)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from helpers import ENTRY_POINTS, package_modules

import dsl_llada

# One fresh interpreter; before each module every dsl_llada module is dropped from sys.modules, so each import starts
# from that module alone (third-party packages stay loaded: only our own import order matters for a cycle).
_SCRIPT = """
import importlib, json, sys, traceback
failed = {}
for name in json.loads(sys.argv[1]):
    for m in [m for m in sys.modules if m == "dsl_llada" or m.startswith("dsl_llada.")]:
        del sys.modules[m]
    try:
        importlib.import_module(name)
    except BaseException:
        failed[name] = traceback.format_exc(limit=-3)
print(json.dumps(failed))
"""


def test_module_discovery_finds_the_whole_package():
    names = package_modules()
    root = Path(dsl_llada.__file__).parent
    on_disk = {".".join(("dsl_llada", *p.relative_to(root).with_suffix("").parts)).removesuffix(".__init__")
               for p in root.rglob("*.py")}
    assert set(names) == on_disk - ENTRY_POINTS  # nothing skipped silently (e.g. a package without __init__)
    assert len(names) >= 30
    for expected in ("dsl_llada.checkpoint", "dsl_llada.backbones.base", "dsl_llada.train.trainer",
                     "dsl_llada.sampling.sde", "dsl_llada.toy.demo"):
        assert expected in names


def test_every_module_imports_on_its_own():
    names = package_modules()
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(Path(dsl_llada.__file__).parents[1]),
                                                        os.environ.get("PYTHONPATH", "")]))
    out = subprocess.run([sys.executable, "-c", _SCRIPT, json.dumps(names)], capture_output=True, text=True,
                         env=env, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    failed = json.loads(out.stdout.strip().splitlines()[-1])
    assert failed == {}, "\n".join(f"{k}:\n{v}" for k, v in failed.items())
