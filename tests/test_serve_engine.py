"""The server on the step-level engine: a short request sent while a long one runs joins the running batch and
finishes first with the tokens it gets alone; the engine metrics move by exact counts; the batch-token cap; the
fixed-batch call for kv_cache requests. A tiny random DSL model; servers bind 127.0.0.1."""

from __future__ import annotations

import json
import threading
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from fastapi.testclient import TestClient
from helpers import BatchLog
from serve_helpers import library_text, save_tiny_toy_dsl, uvicorn_server

from dsl_llada.config import RemaskConfig, SDEConfig
from dsl_llada.core.loading import encode_prompt, load_model, load_tokenizer
from dsl_llada.serve.settings import ServerConfig
from dsl_llada.serve.app import create_app

pytestmark = pytest.mark.usefixtures("one_thread")

LONG_PROMPT = "describe the forest and the tall trees near the river ."
SHORT_PROMPT = "hi"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = save_tiny_toy_dsl(tmp_path_factory.mktemp("serve-engine") / "tiny")
    return load_model(path), load_tokenizer(path)


def chat(prompt: str, **extra) -> dict:
    return {"model": "tiny", "messages": [{"role": "user", "content": prompt}], **extra}


def metric(text: str, name: str) -> float:
    """The value of the unlabelled series `name` in a /metrics page."""
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"{name} not in /metrics")


@pytest.mark.parametrize("seed", [7, 8])
def test_a_short_request_joins_a_running_long_one_and_finishes_first(tiny, seed):
    """A long DSL-SDE request (NFE 1000: 1001 ticks) streams; once its first step arrived, a short remasking request
    with another prompt length and 8 steps is sent. It joins the running batch at the next tick, shares 8 ticks with
    the long row and is answered while the long one still runs, with the tokens of the request run alone (the
    discrete samplers' tokens do not depend on the batch). Order and tick counts only, never times."""
    model, tok = tiny
    app = create_app(model, tok, model_name="tiny", server=ServerConfig(max_batch=4))
    svc = app.state.service
    long_steps: list[int] = []
    order: list[str] = []
    started = threading.Event()
    short_cfg = RemaskConfig(steps=8, gen_length=8, temperature=0.7)
    with BatchLog(model) as forwards, uvicorn_server(app) as (base, _), ThreadPoolExecutor(1) as pool:
        def long_request() -> None:
            body = chat(LONG_PROMPT, nfe=1000, max_tokens=16, seed=5, stream=True)
            with httpx.stream("POST", f"{base}/v1/chat/completions", json=body, timeout=300) as r:
                assert r.status_code == 200
                for line in r.iter_lines():
                    if '"denoising"' in line:
                        long_steps.append(json.loads(line[len("data: "):])["dsl_llada"]["denoising"]["step"])
                        started.set()
                    elif line == "data: [DONE]":
                        order.append("long")

        running = pool.submit(long_request)
        assert started.wait(120)
        short = httpx.post(f"{base}/v1/chat/completions", timeout=300,
                           json=chat(SHORT_PROMPT, sampler="remask", steps=8, max_tokens=8, temperature=0.7, seed=seed))
        order.append("short")
        steps_when_short_done = len(long_steps)
        running.result()
        page = httpx.get(f"{base}/metrics", timeout=30).text
    assert order == ["short", "long"]
    assert 1 <= steps_when_short_done < 500 and long_steps == list(range(1, 501))  # NFE 1000 = 500 Heun steps
    body = short.json()
    assert body["dsl_llada"]["batch_sizes"] == [2] and body["dsl_llada"]["forward_passes"] == 8
    text = body["choices"][0]["message"]["content"]
    assert text == library_text(model, tok, SHORT_PROMPT, "remask", short_cfg, seed)
    assert text != library_text(model, tok, SHORT_PROMPT, "remask", short_cfg, seed + 100)
    # one forward per tick: the long row's 1001, eight of them with the short row beside it
    assert len(forwards.sizes) == 1001 and forwards.sizes.count(2) == 8 and set(forwards.sizes) == {1, 2}
    assert metric(page, "dsl_llada_engine_ticks_total") == 1001
    assert metric(page, "dsl_llada_forward_passes_total") == 1001
    assert metric(page, "dsl_llada_batch_size_count") == 1001 and metric(page, "dsl_llada_batch_size_sum") == 1009
    assert metric(page, "dsl_llada_time_to_first_step_seconds_count") == 2
    assert metric(page, "dsl_llada_jobs_running") == 0 and metric(page, "dsl_llada_batch_tokens") == 0
    assert metric(page, "dsl_llada_generated_tokens_total") == svc.metrics.generated_tokens >= 1
    assert svc.engine.ticks == 1001


def test_running_rows_and_batch_tokens_show_while_a_request_runs(tiny):
    """While a long request runs, /metrics shows its row and its batch tokens (prompt + response); ticks grow."""
    model, tok = tiny
    app = create_app(model, tok, model_name="tiny")
    started = threading.Event()
    pages: list[str] = []
    with uvicorn_server(app) as (base, _), ThreadPoolExecutor(1) as pool:
        def long_request() -> None:
            body = chat(LONG_PROMPT, nfe=1000, max_tokens=16, seed=5, stream=True)
            with httpx.stream("POST", f"{base}/v1/chat/completions", json=body, timeout=300) as r:
                for line in r.iter_lines():
                    if '"denoising"' in line and not started.is_set():
                        started.set()
                        pages.append(httpx.get(f"{base}/metrics", timeout=30).text)

        pool.submit(long_request).result()
        after = httpx.get(f"{base}/metrics", timeout=30).text
    prompt_tokens = len(encode_prompt(tok, LONG_PROMPT, chat_template=True))
    during = pages[0]
    assert metric(during, "dsl_llada_jobs_running") == 1
    assert metric(during, "dsl_llada_batch_tokens") == prompt_tokens + 16
    assert 1 <= metric(during, "dsl_llada_engine_ticks_total") < 1001
    assert metric(after, "dsl_llada_engine_ticks_total") == 1001 and metric(after, "dsl_llada_jobs_running") == 0


def test_requests_are_admitted_first_in_first_out_under_the_row_cap(tiny):
    """max_batch=1: three requests queued together run one after another in arrival order (each alone: its
    batch_sizes is [1]), and every one gets its own seed's tokens."""
    model, tok = tiny
    app = create_app(model, tok, model_name="tiny", server=ServerConfig(max_batch=1, max_wait_ms=5000))
    cfg = RemaskConfig(steps=4, gen_length=8, temperature=0.7)
    with BatchLog(model) as forwards, uvicorn_server(app) as (base, _), ThreadPoolExecutor(3) as pool:
        def ask(seed: int) -> dict:
            return httpx.post(f"{base}/v1/chat/completions", timeout=120,
                              json=chat(SHORT_PROMPT, sampler="remask", steps=4, max_tokens=8, temperature=0.7,
                                        seed=seed)).json()
        bodies = list(pool.map(ask, (1, 2, 3)))
    assert forwards.sizes == [1] * 12  # one row at a time: 3 x 4 ticks
    assert [b["dsl_llada"]["batch_sizes"] for b in bodies] == [[1], [1], [1]]
    assert [b["choices"][0]["message"]["content"] for b in bodies] == [
        library_text(model, tok, SHORT_PROMPT, "remask", cfg, s) for s in (1, 2, 3)]


def test_a_request_over_the_batch_token_cap_gets_400(tiny):
    model, tok = tiny
    with TestClient(create_app(model, tok, model_name="tiny", server=ServerConfig(max_batch_tokens=20))) as c:
        r = c.post("/v1/chat/completions", json=chat(LONG_PROMPT, max_tokens=16, nfe=2))
        err = r.json()["error"]
        assert r.status_code == 400 and err["code"] == "request_too_large" and err["param"] == "messages"
        assert "max_batch_tokens=20" in err["message"]
        r = c.post("/v1/chat/completions", json=chat(SHORT_PROMPT, max_tokens=4, nfe=2, seed=1))
        assert r.status_code == 200  # a request that fits runs


def test_kv_cache_requests_run_as_a_fixed_batch_call(tiny):
    """The engine refuses approximate key/value caching: such a request runs as one fixed-batch sampler call (no
    engine tick) and gets the library's tokens."""
    model, tok = tiny
    cfg = SDEConfig(nfe=2, gen_length=12, block_length=4, kv_cache="dual", cache_refresh=2)
    with TestClient(create_app(model, tok, model_name="tiny")) as c:
        body = c.post("/v1/chat/completions", json=chat(LONG_PROMPT, sampler="block-sde", nfe=2, max_tokens=12,
                                                        block_length=4, kv_cache="dual", cache_refresh=2,
                                                        seed=3)).json()
        page = c.get("/metrics").text
    assert body["choices"][0]["message"]["content"] == library_text(model, tok, LONG_PROMPT, "block-sde", cfg, 3)
    assert body["dsl_llada"]["batch_sizes"] == [1]
    assert metric(page, "dsl_llada_engine_ticks_total") == 0 and metric(page, "dsl_llada_batch_size_count") == 1
    assert metric(page, "dsl_llada_time_to_first_step_seconds_count") == 1
