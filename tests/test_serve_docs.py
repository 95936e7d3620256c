"""docs/serving.md runs as written: every `curl` block and every Python client block is executed against a tiny
served model on 127.0.0.1 (the docs' address swapped for the test server's), and must succeed (HTTP 2xx, exit 0)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from serve_helpers import save_tiny_toy_dsl, uvicorn_server

from dsl_llada.core.loading import load_model, load_tokenizer
from dsl_llada.serve.app import create_app

pytestmark = pytest.mark.usefixtures("one_thread")

DOC = Path(__file__).resolve().parents[1] / "docs" / "serving.md"
DOC_URL = "http://127.0.0.1:8000"


def blocks(lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", DOC.read_text(encoding="utf-8"), flags=re.S)


def curl_blocks() -> list[str]:
    return [b for b in blocks("bash") if "curl " in b]


def client_blocks() -> list[str]:
    return [b for b in blocks("python") if DOC_URL in b]


def test_the_docs_have_examples_to_run():
    assert len(curl_blocks()) >= 1 and sum(b.count("curl ") for b in curl_blocks()) >= 4
    assert len(client_blocks()) >= 2 and any("from openai import OpenAI" in b for b in client_blocks())
    assert "my-model" not in DOC.read_text(encoding="utf-8")


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    path = save_tiny_toy_dsl(tmp_path_factory.mktemp("docs") / "tiny")
    app = create_app(load_model(path), load_tokenizer(path), model_name="tiny")
    with uvicorn_server(app) as (base, _):
        yield base


@pytest.mark.parametrize("i", range(len(curl_blocks())))
def test_curl_examples_run(served, i):
    script = curl_blocks()[i].replace(DOC_URL, served).replace("curl -s", "curl --fail-with-body -s")
    r = subprocess.run(["bash", "-euo", "pipefail", "-c", script], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert '"error"' not in r.stdout and '"choices"' in r.stdout and "data: [DONE]" in r.stdout


@pytest.mark.parametrize("i", range(len(client_blocks())))
def test_python_client_examples_run(served, i):
    pytest.importorskip("openai", reason="pip install openai")
    code = client_blocks()[i].replace(DOC_URL, served)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.strip()
