"""The OpenAI-compatible server: library-equal outputs, batching, streaming, errors, queue bound, failures,
disconnects, draining, API key, CLI. A tiny random DSL model over the toy world's vocabulary; servers bind 127.0.0.1."""

from __future__ import annotations

import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from fastapi.testclient import TestClient
from helpers import BatchLog
from serve_helpers import library_batch_texts, library_ids, library_text, save_tiny_toy_dsl, uvicorn_server

from dsl_llada.cli.main import main
from dsl_llada.config import RemaskConfig, SDEConfig
from dsl_llada.core.loading import load_model, load_tokenizer
from dsl_llada.serve.settings import ServerConfig
from dsl_llada.serve.app import create_app
from dsl_llada.serve.schemas import RequestError, SamplingFields, build_sampling

# one intra-op thread (conftest): a busy 2-core CPU makes spinning OpenMP threads ~100x slower on tiny models
pytestmark = pytest.mark.usefixtures("one_thread")

PROMPTS = ["write about the ocean .", "describe the forest and the tall trees near the river .", "hi"]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return save_tiny_toy_dsl(tmp_path_factory.mktemp("serve") / "tiny")


@pytest.fixture(scope="module")
def tiny(model_dir):
    return load_model(model_dir), load_tokenizer(model_dir)


def chat(prompt: str, **extra) -> dict:
    return {"model": "tiny", "messages": [{"role": "user", "content": prompt}], **extra}


def test_models_health_and_metrics(tiny):
    model, tok = tiny
    with TestClient(create_app(model, tok, model_name="tiny")) as c:
        assert c.get("/v1/models").json()["data"][0]["id"] == "tiny"
        health = c.get("/health").json()
        assert {k: health[k] for k in ("status", "model", "queue_length", "running")} == {
            "status": "ok", "model": "tiny", "queue_length": 0, "running": 0}
        assert health["environment"]["dsl_llada"] and health["limits"]["max_tokens"] == 64
        assert 0 <= health["last_progress_s_ago"] < health["limits"]["request_timeout_s"]
        env = health["environment"]  # where the server runs: versions, CPU, threads, dtype, load
        assert env["device"] == "cpu" and env["dtype"] == "float32" and env["threads"]["intra_op"] >= 1
        assert env["cpu_capability"] and env["libraries"]["torch"] and env["load_average_start"] is not None
        r = c.post("/v1/chat/completions", json=chat(PROMPTS[0], max_tokens=8, nfe=4, seed=0))
        assert r.status_code == 200
        text = c.get("/metrics").text
        assert 'dsl_llada_requests_total{endpoint="/v1/chat/completions",status="200"} 1' in text
        # NFE 4 = 2 Heun steps x 2 + the final decode: 5 engine ticks of one row, one forward each
        assert "dsl_llada_batch_size_count 5" in text and "dsl_llada_batch_size_sum 5.000000" in text
        assert "dsl_llada_engine_ticks_total 5" in text and "dsl_llada_forward_passes_total 5" in text
        assert "dsl_llada_queue_length 0" in text and "dsl_llada_jobs_running 0" in text
        assert "dsl_llada_batch_tokens 0" in text
        tokens = r.json()["usage"]["completion_tokens"]
        assert f"dsl_llada_generated_tokens_total {tokens}" in text
        assert "dsl_llada_request_latency_seconds_count 1" in text
        assert "dsl_llada_time_to_first_step_seconds_count 1" in text
        assert r.json()["dsl_llada"]["batch_sizes"] == [1] and r.json()["dsl_llada"]["forward_passes"] == 5


@pytest.mark.parametrize("sampler,fields,config", [
    ("sde", {"nfe": 6}, SDEConfig(nfe=6, gen_length=12)),
    ("block-sde", {"nfe": 2, "block_length": 4}, SDEConfig(nfe=2, gen_length=12, block_length=4)),
    ("remask", {"steps": 6, "temperature": 0.7}, RemaskConfig(steps=6, gen_length=12, temperature=0.7)),
    ("remdm", {"steps": 6, "temperature": 0.7}, RemaskConfig(steps=6, gen_length=12, temperature=0.7, remdm=True)),
    ("block-sde", {"nfe": 2, "block_length": 4, "kv_cache": "dual", "cache_refresh": 2},
     SDEConfig(nfe=2, gen_length=12, block_length=4, kv_cache="dual", cache_refresh=2)),
])
def test_outputs_equal_the_library_and_depend_on_the_seed(tiny, sampler, fields, config):
    model, tok = tiny
    with TestClient(create_app(model, tok, model_name="tiny")) as c:
        texts = {}
        for seed in (3, 4):
            body = c.post("/v1/chat/completions", json=chat(PROMPTS[1], sampler=sampler, max_tokens=12, seed=seed,
                                                            **fields)).json()
            texts[seed] = body["choices"][0]["message"]["content"]
            assert texts[seed] == library_text(model, tok, PROMPTS[1], sampler, config, seed)
            assert body["dsl_llada"]["sampler"] == sampler and body["dsl_llada"]["seed"] == seed
            assert body["dsl_llada"]["config"] == config.to_dict()
        assert texts[3] != texts[4]
        # /v1/completions: a list of prompts, prompt i gets seed + i (as `generation.generate`), raw or templated.
        # The two prompts (of different lengths) run together, left-padded: the library's batched call of the same
        # two (what `generate` runs) gives the same tokens; alone, the padding's rounding can flip a near-tie token
        # of this random model's chaotic SDE trajectory (docs/serving.md, *Batching*)
        r = c.post("/v1/completions", json={"prompt": PROMPTS[:2], "sampler": sampler, "max_tokens": 12, "seed": 3,
                                            "chat_template": True, **fields}).json()
        assert [ch["text"] for ch in r["choices"]] == library_batch_texts(model, tok, PROMPTS[:2], sampler, config, 3)


def test_defaults_are_the_config_defaults(tiny):
    model, tok = tiny
    with TestClient(create_app(model, tok, model_name="tiny")) as c:
        body = c.post("/v1/chat/completions", json=chat("hi", max_tokens=4, seed=0)).json()
        assert body["dsl_llada"]["config"] == SDEConfig(gen_length=4).to_dict()
        body = c.post("/v1/chat/completions", json=chat("hi", sampler="remask", max_tokens=4, seed=0)).json()
        assert body["dsl_llada"]["config"] == RemaskConfig(gen_length=4).to_dict()


def test_n_choices_use_consecutive_seeds_and_stop_strings_cut(tiny):
    model, tok = tiny
    cfg = SDEConfig(nfe=4, gen_length=12, eta=0.5)
    with TestClient(create_app(model, tok, model_name="tiny")) as c:
        body = c.post("/v1/chat/completions", json=chat(PROMPTS[0], n=3, max_tokens=12, nfe=4, eta=0.5, seed=20)).json()
        texts = [ch["message"]["content"] for ch in body["choices"]]
        assert texts == [library_text(model, tok, PROMPTS[0], "sde", cfg, 20 + j) for j in range(3)]
        assert body["usage"]["completion_tokens"] == sum(len(library_ids(model, tok, PROMPTS[0], "sde", cfg, 20 + j))
                                                         for j in range(3))  # response ids, not a re-tokenisation
        words = texts[0].split()
        stop = words[len(words) // 2]
        cut = c.post("/v1/chat/completions", json=chat(PROMPTS[0], max_tokens=12, nfe=4, eta=0.5, seed=20,
                                                       stop=[stop, "never-there"])).json()["choices"][0]
        assert cut["message"]["content"] == texts[0][: texts[0].index(stop)] and cut["finish_reason"] == "stop"


@pytest.mark.parametrize("mixed", [False, True])
def test_concurrent_requests_are_batched_and_equal_alone(tiny, mixed):
    """Equal-length prompts, or prompts of different lengths (left padding + attention mask), run as one batch of
    rows; each row has its own generator, so every request gets the tokens it gets alone. The test runs 'Algorithm 2
    as printed' (predictor_noise=False): with the default predictor noise the first Heun step 0.01 -> 7 is almost
    noiseless, and on this random tiny model it amplifies the ~1e-6 rounding differences between batch shapes into
    other tokens (a trained model is not that chaotic; see docs/serving.md)."""
    model, tok = tiny
    app = create_app(model, tok, model_name="tiny", server=ServerConfig(max_batch=3, max_wait_ms=5000))
    prompts = PROMPTS if mixed else [PROMPTS[1]] * 3
    nfe = 4 if mixed else 16
    cfg = SDEConfig(nfe=nfe, gen_length=10, eta=0.5, predictor_noise=False)
    with BatchLog(model) as forwards, uvicorn_server(app) as (base, _), ThreadPoolExecutor(3) as pool:
        def ask(i):
            return httpx.post(f"{base}/v1/chat/completions", timeout=60,
                              json=chat(prompts[i], max_tokens=10, nfe=nfe, eta=0.5, seed=10 + i,
                                        predictor_noise=False)).json()
        bodies = list(pool.map(ask, range(3)))
    assert [b["dsl_llada"]["batch_sizes"] for b in bodies] == [[3], [3], [3]]
    assert forwards.sizes == [3] * (nfe + 1)  # every tick ran the three rows together
    texts = [b["choices"][0]["message"]["content"] for b in bodies]
    assert texts == [library_text(model, tok, p, "sde", cfg, 10 + i) for i, p in enumerate(prompts)]
    assert len(set(texts)) == 3  # the seeds differ, so do the samples


def _events(lines) -> list:
    out = []
    for line in lines:
        if line.startswith("data: "):
            payload = line[len("data: "):]
            out.append(payload if payload == "[DONE]" else json.loads(payload))
    return out


def test_stream_sends_each_denoising_step_then_the_text(tiny):
    model, tok = tiny
    with TestClient(create_app(model, tok, model_name="tiny")) as c:
        want = c.post("/v1/chat/completions", json=chat(PROMPTS[0], max_tokens=10, nfe=8, seed=2)).json()
        with c.stream("POST", "/v1/chat/completions", json=chat(PROMPTS[0], max_tokens=10, nfe=8, seed=2, stream=True,
                                                                 stream_options={"include_usage": True})) as r:
            assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
            ev = _events(r.iter_lines())
    assert ev[-1] == "[DONE]" and ev[0]["choices"][0]["delta"] == {"role": "assistant"}
    steps = [e["dsl_llada"]["denoising"] for e in ev if isinstance(e, dict) and "denoising" in e.get("dsl_llada", {})]
    assert [s["step"] for s in steps] == [1, 2, 3, 4] and all(s["total_steps"] == 4 for s in steps)
    snrs = [s["snr"] for s in steps]
    assert snrs == sorted(snrs) and snrs[-1] > 70  # the SNR rises to the schedule's end
    assert all(len(s["token_ids"]) == 10 and tok.decode(s["token_ids"]) == s["text"] for s in steps)
    content = "".join(e["choices"][0]["delta"].get("content", "") for e in ev if isinstance(e, dict) and e["choices"])
    assert content == want["choices"][0]["message"]["content"]
    finish = [e["choices"][0]["finish_reason"] for e in ev if isinstance(e, dict) and e["choices"]]
    assert finish[-1] in ("stop", "length") and finish[:-1] == [None] * (len(finish) - 1)
    assert ev[-2]["usage"] == want["usage"] and ev[-2]["choices"] == []


def test_remask_stream_shows_masks_resolving(tiny):
    model, tok = tiny
    body = {"prompt": "hi", "sampler": "remask", "steps": 4, "max_tokens": 8, "seed": 1, "stream": True}
    with TestClient(create_app(model, tok, model_name="tiny")) as c, c.stream("POST", "/v1/completions", json=body) as r:
        ev = _events(r.iter_lines())
    steps = [e["dsl_llada"]["denoising"] for e in ev if isinstance(e, dict) and "dsl_llada" in e]
    masked = [s["token_ids"].count(model.special.mask) for s in steps]
    assert masked == [6, 4, 2, 0] and [s["n_masked"] for s in steps] == masked  # 2 tokens committed per step


@pytest.mark.parametrize("body,param,fragment", [
    ({"messages": []}, "messages", "at least 1"),
    ({"messages": [{"role": "user"}]}, "messages.0.content", "Field required"),
    ({"messages": [{"role": "robot", "content": "x"}]}, "messages.0.role", "'user'"),
    (chat("x", nfe=3), "nfe", "even number"),
    (chat("x", steps=2, nfe=6), "nfe", "disagree"),
    (chat("x", top_mm=3), "top_mm", "unknown field 'top_mm'"),
    (chat("x", top_m="many"), "top_m", "valid integer"),
    (chat("x", sampler="euler"), "sampler", "'sde'"),
    (chat("x", sampler="block-sde"), "block_length", "block_length > 0"),
    (chat("x", sampler="remask", steps=5, max_tokens=8, block_length=4), "steps", "divisible"),
    (chat("x", sampler="remask", eta=0.1), "eta", "SDE samplers"),
    (chat("x", max_tokens=0), "max_tokens", "greater than or equal to 1"),
    (chat("x", n=0), "n", "greater than or equal to 1"),
    (chat("x " * 40, max_tokens=40), "messages", "exceed the model's context of 64"),
    (chat("x " * 60, max_tokens=8), "messages", "more than this server's limit of 63 (--max-prompt-tokens)"),
    (chat("x", nfe=10**9), "nfe", "nfe=1000000000 exceeds this server's limit of 1024 (set by --max-nfe"),
    (chat("x", sampler="remask", steps=5000), "steps", "limit of 1024 (set by --max-steps"),
    (chat("x", max_tokens=10**6), "max_tokens", "set by --max-tokens"),
    (chat("x", sampler="block-sde", block_length=2, max_tokens=40, nfe=64), "nfe", "nfe=1280 exceeds"),
    (chat("x", compile=True), "compile", "not a request field"),
    (chat("x", dtype="float16"), "dtype", "not a request field"),
    (chat("x", threads=64), "threads", "not a request field"),
    (chat("x", tools=[{"type": "function"}]), "tools", "'tools' is not supported"),
    (chat("x", frequency_penalty=0.5), "frequency_penalty", "not supported"),
    (chat("x", top_p=0.9), "top_p", "top_p=0.9 is not supported"),
    (chat("x", top_logprobs=2), "top_logprobs", "needs logprobs=true"),
    (chat("x", n=40), "n", "less than or equal to 16"),
    ({"prompt": ["a"] * 65}, "prompt", "65 prompts exceed"),
    ({"prompt": "a", "logprobs": 9}, "logprobs", "less than or equal to 5"),
    (chat("x", stop=["a", "b", "c", "d", "e"]), "stop", "at most 4"),
    ({"prompt": [5, 10**6]}, "prompt", "outside the vocabulary"),
    (chat("x", kv_cache="full"), "kv_cache", "Input should be 'off', 'prefix' or 'dual'"),
    (chat("x", sampler="remask", kv_cache="dual", cfg_scale=1.0), "kv_cache", "cfg_scale=1.0 is not supported"),
])
def test_invalid_requests_get_400_naming_the_field(tiny, body, param, fragment):
    model, tok = tiny
    url = "/v1/completions" if "prompt" in body else "/v1/chat/completions"
    with TestClient(create_app(model, tok, model_name="tiny")) as c:
        r = c.post(url, json=body)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param and fragment in err["message"] and err["type"] == "invalid_request_error"


def test_malformed_json_unknown_model_and_bare_backbone(tiny, model_dir):
    model, tok = tiny
    with TestClient(create_app(model, tok, model_name="tiny")) as c:
        r = c.post("/v1/chat/completions", content=b'{"messages": [', headers={"content-type": "application/json"})
        assert r.status_code == 400 and "not valid JSON" in r.json()["error"]["message"]
        r = c.post("/v1/chat/completions", json={**chat("x"), "model": "gpt-4"})
        assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"
    with TestClient(create_app(model.backbone, tok, model_name="tiny")) as c:  # a bare backbone: no SDE
        r = c.post("/v1/chat/completions", json=chat("x", sampler="sde"))
        assert r.status_code == 400 and r.json()["error"]["param"] == "sampler"
        r = c.post("/v1/chat/completions", json=chat("x", max_tokens=4, steps=2, seed=0))
        assert r.status_code == 200 and r.json()["dsl_llada"]["sampler"] == "remask"


@pytest.mark.parametrize("raw,param", [
    (b'{"messages": [{"role": "user", "content": "x"}], "eta": Infinity}', "eta"),
    (b'{"messages": [{"role": "user", "content": "x"}], "temperature": NaN, "sampler": "remask"}', "temperature"),
    (b'{"messages": [{"role": "user", "content": "x"}], "top_m": -Infinity}', "top_m"),
    (b'{"messages": [{"role": "user", "content": "x"}], "converter_tolerance": Infinity}', "converter_tolerance"),
    (b'{"messages": [{"role": "user", "content": "x"}], "eta": Infinity, "stream": true}', "eta"),
    (b'{"prompt": "x", "eta": Infinity}', "eta"),
    (b'{"messages": [{"role": "user", "content": "x"}], "eta": "fast"}', "eta"),
    (b'{"messages": [{"role": "user", "content": "x"}], "seed": 1.5}', "seed"),
])
def test_non_finite_and_wrongly_typed_numbers_get_a_json_400(tiny, raw, param):
    model, tok = tiny
    url = "/v1/completions" if b'"prompt"' in raw else "/v1/chat/completions"
    with TestClient(create_app(model, tok, model_name="tiny")) as c:
        r = c.post(url, content=raw, headers={"content-type": "application/json"})
    assert r.status_code == 400 and r.headers["content-type"] == "application/json", r.text
    assert r.json()["error"]["param"] == param


def test_full_queue_gets_429_and_a_request_larger_than_the_queue_400(tiny):
    model, tok = tiny
    with TestClient(create_app(model, tok, model_name="tiny", server=ServerConfig(max_queue=2))) as c:
        r = c.post("/v1/chat/completions", json=chat("x", n=3, max_tokens=4, nfe=2))
        assert r.status_code == 400 and r.json()["error"]["code"] == "request_too_large"  # can never fit
        svc = c.app.state.service
        svc.batcher.pending.extend([object(), object()])  # two jobs waiting: the queue is full
        r = c.post("/v1/chat/completions", json=chat("x", max_tokens=4, nfe=2))
        assert r.status_code == 429 and r.json()["error"]["code"] == "queue_full" and r.headers["retry-after"] == "1"
        svc.batcher.pending.clear()
        r = c.post("/v1/chat/completions", json=chat("x", n=2, max_tokens=4, nfe=2, seed=1))
        assert r.status_code == 200 and [ch["index"] for ch in r.json()["choices"]] == [0, 1]


def test_a_failing_batch_gets_500_and_the_server_keeps_serving(tiny, monkeypatch):
    model, tok = tiny
    real = model.backbone.forward
    calls = {"n": 0}

    def flaky(*a, **k):
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("simulated device failure")
        return real(*a, **k)

    monkeypatch.setattr(model.backbone, "forward", flaky)
    with TestClient(create_app(model, tok, model_name="tiny")) as c:
        r = c.post("/v1/chat/completions", json=chat(PROMPTS[0], max_tokens=8, nfe=4, seed=1))
        assert r.status_code == 500 and "simulated device failure" in r.json()["error"]["message"]
        r = c.post("/v1/chat/completions", json=chat(PROMPTS[0], max_tokens=8, nfe=4, seed=1))
        assert r.status_code == 200
        assert r.json()["choices"][0]["message"]["content"] == library_text(
            model, tok, PROMPTS[0], "sde", SDEConfig(nfe=4, gen_length=8), 1)
        assert "dsl_llada_batches_failed_total 1" in c.get("/metrics").text


def test_disconnect_mid_stream_frees_the_slot_and_spares_the_batch(tiny):
    model, tok = tiny
    app = create_app(model, tok, model_name="tiny", server=ServerConfig(max_batch=2, max_wait_ms=5000))
    svc = app.state.service
    # discrete remasking: long enough to leave mid-run, and free of the SDE's sensitivity to batched-matmul rounding
    body = {"max_tokens": 40, "sampler": "remask", "steps": 40, "temperature": 0.5, "stream": True}
    with BatchLog(model) as forwards, uvicorn_server(app) as (base, _):
        got_first = threading.Event()

        def quitter():
            with httpx.stream("POST", f"{base}/v1/chat/completions", json=chat(PROMPTS[1], seed=1, **body), timeout=60) as r:
                for line in r.iter_lines():
                    if '"denoising"' in line:
                        got_first.set()
                        return  # leave mid-stream: the connection closes

        def stayer():
            with httpx.stream("POST", f"{base}/v1/chat/completions", json=chat(PROMPTS[1], seed=2, **body), timeout=60) as r:
                assert r.status_code == 200
                return _events(r.iter_lines())

        with ThreadPoolExecutor(2) as pool:
            q, s = pool.submit(quitter), pool.submit(stayer)
            q.result()
            ev = s.result()
        assert got_first.is_set() and ev[-1] == "[DONE]"
        text = "".join(e["choices"][0]["delta"].get("content", "") for e in ev if isinstance(e, dict) and e["choices"])
        assert text == library_text(model, tok, PROMPTS[1], "remask", RemaskConfig(steps=40, gen_length=40, temperature=0.5), 2)
        # the quitter's row left the batch; the stayer's stream went on with its own row's step events
        served = forwards.sizes[:40]  # (then the library's reference run above, at batch 1)
        assert served[0] == 2 and served[-1] == 1 and served == sorted(served, reverse=True)
        assert svc.metrics.cancelled == 1 and svc.metrics.ticks == 40  # one tick per step of the stayer
        assert svc.metrics.batch_sizes.count == 40 and svc.metrics.batch_sizes.sum == sum(served)
        steps = [e["dsl_llada"]["denoising"] for e in ev if isinstance(e, dict) and "denoising" in e.get("dsl_llada", {})]
        assert [st["step"] for st in steps] == list(range(1, 41)) and all(steps[-1]["committed"])
        r = httpx.post(f"{base}/v1/chat/completions", json=chat("hi", max_tokens=4, nfe=2), timeout=60)
        assert r.status_code == 200 and svc.batcher.queue_length == 0


def test_shutdown_drains_in_flight_work(tiny):
    model, tok = tiny
    app = create_app(model, tok, model_name="tiny", server=ServerConfig(max_batch=1, max_wait_ms=0))
    svc = app.state.service
    results = []
    with uvicorn_server(app) as (base, server), ThreadPoolExecutor(3) as pool:
        futs = [pool.submit(httpx.post, f"{base}/v1/chat/completions", timeout=60,
                            json=chat(PROMPTS[i], max_tokens=16, nfe=60, seed=i)) for i in range(3)]
        t0 = time.monotonic()
        while svc.batcher.queue_length + len(svc.batcher.running) < 3 and time.monotonic() - t0 < 30:
            time.sleep(0.01)
        server.should_exit = True  # what SIGINT/SIGTERM do
        results = [f.result() for f in futs]
    assert [r.status_code for r in results] == [200, 200, 200]
    assert svc.batcher.closing and svc.batcher.queue_length == 0


def test_api_key(tiny):
    model, tok = tiny
    with TestClient(create_app(model, tok, model_name="tiny", api_key="s3cret")) as c:
        assert c.get("/health").status_code == 200
        assert c.get("/v1/models").status_code == 401
        r = c.post("/v1/chat/completions", json=chat("x"), headers={"Authorization": "Bearer wrong"})
        assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
        assert c.get("/v1/models", headers={"Authorization": "Bearer s3cret"}).status_code == 200


def test_cli_help_and_bad_values(capsys, model_dir):
    for sub, opts in (("serve", ["--model", "--tokenizer", "--host", "--port", "--max-batch", "--max-wait-ms",
                                 "--max-queue", "--max-batch-tokens", "--api-key", "--api-key-file", "--ui", "--max-nfe", "--max-steps",
                                 "--max-tokens", "--max-prompt-tokens", "--max-body-bytes", "--request-timeout-s",
                                 "--shutdown-grace-s", "--allowed-host", "default 8000"]),
                      ("ui", ["--model", "--tokenizer", "--host", "--port", "--toy-dir", "default 7860"])):
        with pytest.raises(SystemExit) as e:
            main([sub, "--help"])
        assert e.value.code == 0
        out = capsys.readouterr().out
        assert all(o in out for o in opts), (sub, out)
    assert main(["serve", "--model", str(model_dir), "--max-batch", "0"]) == 2
    assert "max_batch=0 must be >= 1" in capsys.readouterr().err
    assert main(["serve", "--model", str(model_dir), "--max-wait-ms", "-1"]) == 2
    assert "max_wait_ms=-1.0 must be >= 0" in capsys.readouterr().err
    assert main(["serve", "--model", str(model_dir / "missing")]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert main(["serve", "--model", str(model_dir), "--ui", "--api-key", "k"]) == 2
    assert "--ui cannot be combined with --api-key" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        main(["serve", "--model", str(model_dir), "--max-nfe", "0"])
    assert e.value.code == 2 and "'0' must be >= 1" in capsys.readouterr().err


def test_a_port_in_use_is_one_line_naming_it(capsys, model_dir):
    import socket

    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        for sub in ("serve", "ui"):
            assert main([sub, "--model", str(model_dir), "--port", str(port)]) == 2
            err = capsys.readouterr().err
            assert err.strip() == f"error: port {port} on 127.0.0.1 is already in use; pick another with --port " \
                                  f"(or stop the process that holds it)"


def test_official_openai_client_streams_and_ignores_the_extension(tiny):
    openai = pytest.importorskip("openai", reason="pip install openai")
    model, tok = tiny
    app = create_app(model, tok, model_name="tiny", api_key="k")
    with uvicorn_server(app) as (base, _):
        client = openai.OpenAI(base_url=f"{base}/v1", api_key="k", max_retries=0, timeout=60)
        msgs = [{"role": "user", "content": PROMPTS[0]}]
        full = client.chat.completions.create(model="tiny", messages=msgs, max_tokens=10, seed=4, extra_body={"nfe": 6})
        chunks = list(client.chat.completions.create(model="tiny", messages=msgs, max_tokens=10, seed=4, stream=True,
                                                     extra_body={"nfe": 6}))
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=f"{base}/v1", api_key="wrong", max_retries=0).models.list()
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == full.choices[0].message.content == library_text(
        model, tok, PROMPTS[0], "sde", SDEConfig(nfe=6, gen_length=10), 4)
    steps = [c.model_extra["dsl_llada"]["denoising"]["step"] for c in chunks if "dsl_llada" in (c.model_extra or {})]
    assert steps == [1, 2, 3] and full.model_extra["dsl_llada"]["forward_passes"] == 7


def test_kv_cache_request_on_a_backbone_without_a_cache_is_refused():
    fields = SamplingFields(sampler="remask", kv_cache="prefix")
    with pytest.raises(RequestError, match="kv_cache='prefix' needs a backbone with a key/value cache") as e:
        build_sampling(fields, default_sampler="remask", has_converter=False, has_kv_cache=False)
    assert e.value.param == "kv_cache"
    name, cfg = build_sampling(fields, default_sampler="remask", has_converter=False, has_kv_cache=True)
    assert name == "remask" and cfg.kv_cache == "prefix"
