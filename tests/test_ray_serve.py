"""`dsl-llada ray-serve`: the server as Ray Serve replicas. Two replicas of a tiny random DSL model on a local Ray
instance (CPU): requests spread over both, their outputs equal the single-process server's for the same seeds, and a
streamed request works; plus the settings' bounds, the deployment options and the CLI."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from fastapi.testclient import TestClient
from serve_helpers import free_port, save_tiny_toy_dsl

from dsl_llada.cli.main import main
from dsl_llada.config import ConfigError
from dsl_llada.core.model_source import ModelSource
from dsl_llada.serve.ray_deploy import (DEPLOYMENT_NAME, REPLICA_HEADER, RayConfig, RayServeSettings,
                                        deployment_options, replica_serve_settings)
from dsl_llada.serve.server import ServeSettings, open_serve_app
from dsl_llada.serve.settings import ServerConfig

pytestmark = pytest.mark.usefixtures("one_thread")

HAS_RAY = importlib.util.find_spec("ray") is not None and importlib.util.find_spec("ray.serve") is not None
needs_ray = pytest.mark.skipif(not HAS_RAY, reason='Ray Serve is not installed: pip install "dsl-llada[ray]"')

PROMPTS = ["write about the ocean .", "describe the forest and the tall trees near the river .", "hi"]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return save_tiny_toy_dsl(tmp_path_factory.mktemp("ray") / "tiny")


def chat(prompt: str, **extra) -> dict:
    return {"model": "tiny", "messages": [{"role": "user", "content": prompt}], **extra}


def _events(lines) -> list:
    return [p if p == "[DONE]" else json.loads(p) for p in (ln[6:] for ln in lines if ln.startswith("data: "))]


def test_help_lists_the_options(capsys):
    with pytest.raises(SystemExit) as e:
        main(["ray-serve", "--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    for opt in ("--model", "--host", "--port", "--max-batch", "--max-queue", "--api-key", "--max-nfe",
                "--shutdown-grace-s", "--allowed-host", "--threads", "--num-replicas", "--min-replicas",
                "--max-replicas", "--target-ongoing-requests", "--num-cpus", "--num-gpus", "--max-ongoing-requests",
                "--ray-address", "--ray-temp-dir", "(default: 16)"):
        assert opt in out, opt
    assert "--ui" not in out and "(default: None)" not in out.split("Ray Serve replicas:")[1]


@pytest.mark.parametrize(("fields", "message"), [
    ({"num_replicas": 0}, "num_replicas=0 is out of range: it must be >= 1 and <= 1024"),
    ({"num_replicas": 1.5}, "num_replicas=1.5 is not valid: it must be an int >= 1 and <= 1024"),
    ({"max_replicas": 2000}, "max_replicas=2000 is out of range: it must be >= 1 and <= 1024"),
    ({"min_replicas": -1, "max_replicas": 2}, "min_replicas=-1 is out of range: it must be >= 0 and <= 1024"),
    ({"num_cpus": 0}, "num_cpus=0 is out of range: it must be > 0 and <= 1024 (a replica needs CPU time to run its model)"),
    ({"num_gpus": -1}, "num_gpus=-1 is out of range: it must be >= 0 and <= 16"),
    ({"max_ongoing_requests": 0}, "max_ongoing_requests=0 is out of range: it must be >= 1 and <= 4096"),
    ({"target_ongoing_requests": 0, "max_replicas": 2}, "target_ongoing_requests=0 is out of range: it must be > 0"),
    ({"num_replicas": 2, "max_replicas": 4}, "num_replicas=2 and max_replicas=4 cannot be combined"),
    ({"min_replicas": 3, "max_replicas": 2}, "min_replicas=3 must be <= max_replicas=2"),
    ({"min_replicas": 1}, "are autoscaling settings: give max_replicas too"),
    ({"max_replicas": 2, "target_ongoing_requests": 40.0},
     "target_ongoing_requests=40 must be <= max_ongoing_requests=16 (a replica never holds more)"),
])
def test_bad_replica_settings_are_one_clear_error(fields, message):
    with pytest.raises(ConfigError) as e:
        RayConfig(**fields)
    assert message in str(e.value) and "\n" not in str(e.value)


def test_settings_that_cannot_work_together_are_refused(model_dir):
    serve = ServeSettings(source=ModelSource(path=str(model_dir)), server=ServerConfig(max_queue=8))
    with pytest.raises(ConfigError, match=r"max_ongoing_requests=16 must be <= max_queue=8: a replica would answer 429"):
        RayServeSettings(serve=serve)
    with pytest.raises(ValueError, match="--ui is not available under Ray Serve"):
        RayServeSettings(serve=ServeSettings(source=ModelSource(path=str(model_dir)), ui=True))
    with pytest.raises(ConfigError, match="port=0 is not available under Ray Serve"):
        RayServeSettings(serve=ServeSettings(source=ModelSource(path=str(model_dir)), port=0))
    with pytest.raises(ConfigError, match="temp_dir='/tmp/x' applies only to a Ray instance started here"):
        RayServeSettings(serve=ServeSettings(source=ModelSource(path=str(model_dir))), address="auto", temp_dir="/tmp/x")


def test_deployment_options_and_what_each_replica_opens(model_dir):
    serve = ServeSettings(source=ModelSource(path=str(model_dir)), server=ServerConfig(max_batch=4), shutdown_grace_s=5)
    fixed = RayServeSettings(serve=serve, ray=RayConfig(num_replicas=3, num_cpus=2, max_ongoing_requests=12))
    assert deployment_options(fixed) == {
        "name": DEPLOYMENT_NAME, "max_ongoing_requests": 12, "ray_actor_options": {"num_cpus": 2, "num_gpus": 0.0},
        "graceful_shutdown_timeout_s": 7, "max_constructor_retry_count": 3, "num_replicas": 3}
    scaled = RayServeSettings(serve=serve, ray=RayConfig(max_replicas=5, num_gpus=1))
    assert deployment_options(scaled)["autoscaling_config"] == {"min_replicas": 1, "max_replicas": 5,
                                                                "target_ongoing_requests": 4.0}
    assert "num_replicas" not in deployment_options(scaled)
    zero = RayServeSettings(serve=serve, ray=RayConfig(min_replicas=0, max_replicas=2, target_ongoing_requests=3))
    assert deployment_options(zero)["autoscaling_config"] == {"min_replicas": 0, "max_replicas": 2,
                                                              "target_ongoing_requests": 3}
    assert deployment_options(RayServeSettings(serve=serve))["num_replicas"] == 1
    # a replica without --device goes where its reservation says; its threads are its CPUs
    assert replica_serve_settings(fixed).source.device == "cpu" and replica_serve_settings(fixed).source.threads == 2
    assert replica_serve_settings(scaled).source.device == "cuda" and replica_serve_settings(scaled).source.threads == 1
    pinned = RayServeSettings(serve=ServeSettings(source=ModelSource(path=str(model_dir), device="cpu", threads=3)),
                              ray=RayConfig(num_gpus=1))
    assert (replica_serve_settings(pinned).source.device, replica_serve_settings(pinned).source.threads) == ("cpu", 3)


def test_a_replica_that_cannot_start_is_named_by_its_error():
    from types import SimpleNamespace

    from dsl_llada.serve.ray_deploy import APP_NAME, _replica_error

    message = ("The deployment failed to start 3 times in a row.\nTraceback (most recent call last):\n  File x\n"
               "RuntimeError: Traceback ...\n    raise CheckpointError(...)\n"
               "dsl_llada.errors.CheckpointError: 'm/model.safetensors' is not a readable safetensors file\n")
    status = SimpleNamespace(applications={APP_NAME: SimpleNamespace(deployments={DEPLOYMENT_NAME: SimpleNamespace(message=message)})})
    fake = SimpleNamespace(status=lambda: status)
    assert _replica_error(fake) == "dsl_llada.errors.CheckpointError: 'm/model.safetensors' is not a readable safetensors file"
    assert _replica_error(SimpleNamespace(status=lambda: SimpleNamespace(applications={}))) is None


def test_without_ray_the_command_says_how_to_install(capsys, model_dir, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` raises ImportError
    assert main(["ray-serve", "--model", str(model_dir)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: Ray Serve is not installed") and err.endswith('install it with: pip install "dsl-llada[ray]"')
    assert "\n" not in err


@needs_ray
def test_bad_values_on_the_command_line_and_in_a_builder_exit_2(capsys, model_dir):
    from dsl_llada.serve.ray_app import app_builder

    assert main(["ray-serve", "--model", str(model_dir), "--num-replicas", "0"]) == 2
    assert capsys.readouterr().err.strip() == "error: num_replicas=0 is out of range: it must be >= 1 and <= 1024"
    assert main(["ray-serve", "--model", str(model_dir), "--max-ongoing-requests", "300"]) == 2
    assert "max_ongoing_requests=300 must be <= max_queue=256" in capsys.readouterr().err
    assert main(["ray-serve", "--model", str(model_dir / "missing")]) == 2
    assert capsys.readouterr().err.strip() == f"error: checkpoint folder {str(model_dir / 'missing')!r} does not exist"
    with pytest.raises(ValueError, match="num_replicas=0 is out of range"):
        app_builder({"model": str(model_dir), "num_replicas": "0"})
    with pytest.raises(ValueError, match="the following arguments are required: --model"):
        app_builder({"num_replicas": 2})
    with pytest.raises(ValueError, match="unrecognized arguments: --colour blue"):
        app_builder({"model": str(model_dir), "colour": "blue"})


@needs_ray
def test_app_builder_takes_the_commands_options(model_dir):
    from ray.serve import Application

    from dsl_llada.serve.ray_app import app_builder

    app = app_builder({"model": str(model_dir), "num_replicas": "2", "max_batch_tokens": "512", "allowed_host": ["a", "b"]})
    assert isinstance(app, Application)


def _ray_processes(marker: str) -> list[str]:
    """Command lines of live processes that mention `marker` (the Ray instance's temp dir)."""
    out = []
    for pid in os.listdir("/proc"):
        if pid.isdigit() and int(pid) != os.getpid():
            try:
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if marker in cmd:
                out.append(cmd)
    return out


@needs_ray
def test_two_replicas_spread_requests_and_answer_as_one_process(model_dir):
    from dsl_llada.serve.ray_deploy import ray_serve

    serve = ServeSettings(source=ModelSource(path=str(model_dir), device="cpu"), served_model_name="tiny",
                          port=free_port())
    temp = tempfile.mkdtemp(prefix="dslray", dir="/tmp")  # short: Ray's socket paths live under it
    settings = RayServeSettings(serve=serve, ray=RayConfig(num_replicas=2, num_cpus=0.5), temp_dir=temp)
    # concurrent requests of two prompt lengths share a replica's running batch; remasking with temperature gives a
    # row the same tokens in any batch (an SDE row on this untrained model can move with the padding's rounding), so
    # each answer must equal the single-process server's answer to the same request alone
    bodies = [chat(PROMPTS[k % 2], max_tokens=10, sampler="remask", steps=8, temperature=0.7, seed=k) for k in range(8)]
    stream_body = chat(PROMPTS[0], max_tokens=10, nfe=8, seed=2, stream=True, stream_options={"include_usage": True})
    try:
        with ray_serve(settings) as url, httpx.Client(base_url=url, timeout=120) as c:
            with ThreadPoolExecutor(len(bodies)) as pool:
                answers = list(pool.map(lambda b: c.post("/v1/chat/completions", json=b), bodies))
            with c.stream("POST", "/v1/chat/completions", json=stream_body) as r:
                assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
                assert r.headers[REPLICA_HEADER]
                events = _events(r.iter_lines())
            health = c.get("/health")
        assert _ray_processes(temp) == []  # the local Ray instance stopped with the block
    finally:
        shutil.rmtree(temp, ignore_errors=True)
    assert all(a.status_code == 200 for a in answers), [a.text for a in answers]
    assert health.status_code == 200 and health.headers[REPLICA_HEADER]
    replicas = {a.headers[REPLICA_HEADER] for a in answers}
    assert len(replicas) == 2, replicas  # concurrent requests go to the replica with fewer ongoing requests

    # the single-process server (the same ServeSettings -> app path) gives the same outputs for the same seeds
    with TestClient(open_serve_app(serve).app, base_url="http://127.0.0.1") as local:  # a Host the app accepts
        want = [local.post("/v1/chat/completions", json=b).json() for b in bodies]
        want_stream = local.post("/v1/chat/completions", json={**stream_body, "stream": False}).json()
    for got, exp in zip(answers, want):
        g = got.json()
        assert g["choices"] == exp["choices"] and g["usage"] == exp["usage"]
        assert g["dsl_llada"]["seed"] == exp["dsl_llada"]["seed"] and g["dsl_llada"]["nfe"] == exp["dsl_llada"]["nfe"] == 8
    assert len({a.json()["choices"][0]["message"]["content"] for a in answers}) > 1  # the seeds differ, so do outputs

    assert events[-1] == "[DONE]" and events[0]["choices"][0]["delta"] == {"role": "assistant"}
    steps = [e["dsl_llada"]["denoising"]["step"] for e in events if isinstance(e, dict) and "denoising" in e.get("dsl_llada", {})]
    assert steps == [1, 2, 3, 4]
    content = "".join(e["choices"][0]["delta"].get("content", "") for e in events if isinstance(e, dict) and e["choices"])
    assert content == want_stream["choices"][0]["message"]["content"]
    assert events[-2]["usage"] == want_stream["usage"]


@needs_ray
def test_the_docs_serve_config_is_valid_and_builds(model_dir):
    import re

    import yaml
    from ray.serve.schema import ServeDeploySchema

    from dsl_llada.serve.ray_app import app_builder

    doc = (Path(__file__).resolve().parents[1] / "docs" / "serving.md").read_text(encoding="utf-8")
    config = yaml.safe_load(re.search(r"```yaml\n# serve_config.yaml\n(.*?)```", doc, re.S).group(1))
    schema = ServeDeploySchema.model_validate(config) if hasattr(ServeDeploySchema, "model_validate") \
        else ServeDeploySchema.parse_obj(config)
    (app,) = schema.applications
    assert app.import_path == "dsl_llada.serve.ray_app:app_builder" and app.args["model"] == "/models/ckpt"
    assert "serve run dsl_llada.serve.ray_app:app_builder model=" in doc
    from ray.serve import Application

    assert isinstance(app_builder({**app.args, "model": str(model_dir)}), Application)
