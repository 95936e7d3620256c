"""`dsl-llada serve`, `dsl-llada ray-serve` and `dsl-llada ui`: their flags, parsed into the settings of the library
calls `run_serve`, `run_ui` (server.py) and `run_ray_serve` (ray_deploy.py); the app itself lives in app.py / ui.py."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..serve.settings import RAY_INSTALL, SERVE_PORT, UI_PORT

if TYPE_CHECKING:
    from ..serve.ray_deploy import RayServeSettings
    from ..serve.server import ServeSettings


def _positive(kind: type[int] | type[float]) -> Callable[[str], float]:
    def parse(text: str) -> float:
        try:
            v = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        too_small = v < 1 if kind is int else v < 0
        if too_small:
            raise argparse.ArgumentTypeError(f"{text!r} must be {'>= 1' if kind is int else '>= 0'}")
        return v
    return parse


TOY_MODEL_HELP = ("checkpoint folder (a DSL checkpoint or a bare backbone); default: the embedded toy world's DSL model "
                  "(trained by `demo --quick` once, then cached)")


def _add_model_args(p: argparse.ArgumentParser, *, required: bool, port: int) -> None:
    """The model flags (ModelSource's), the address and the port."""
    from .flags import add_model_source_args

    add_model_source_args(p, required=required, path_help=None if required else TOY_MODEL_HELP)
    p.add_argument("--host", default="127.0.0.1", help="interface to bind (default 127.0.0.1: this machine only)")
    p.add_argument("--port", type=int, default=port, help=f"TCP port (default {port}; 0 = any free port)")


def _add_serve_options(s: argparse.ArgumentParser, *, ui: bool) -> None:
    """The options of `serve` (and of `ray-serve`, where each replica serves with them): the model, the address,
    batching, the API key, the request limits and shutdown; `--ui` only when `ui`."""
    from .flags import add_config_args
    from ..serve.settings import ServerConfig

    _add_model_args(s, required=True, port=SERVE_PORT)
    s.add_argument("--served-model-name", default=None, help="model id in the API (default: the folder name)")
    add_config_args(s.add_argument_group("batching"), (ServerConfig, "server"))
    key = s.add_mutually_exclusive_group()
    key.add_argument("--api-key", default=None, help="require 'Authorization: Bearer KEY' (checked in constant time)")
    key.add_argument("--api-key-file", default=None, help="read the API key from this file (keeps it out of `ps`)")
    if ui:
        s.add_argument("--ui", action="store_true", help="also mount the Gradio web UI at /ui (not with an API key)")
    lim = s.add_argument_group("request limits (defaults derive from the served model; see docs/serving.md)")
    lim.add_argument("--max-nfe", type=_positive(int), default=None,
                     help="most model evaluations per SDE request (default: ~1 minute of worst-case compute for "
                          "this model on a small CPU, between 64 and 1024)")
    lim.add_argument("--max-steps", type=_positive(int), default=None,
                     help="most denoising steps per remasking request (default: as --max-nfe)")
    lim.add_argument("--max-tokens", type=_positive(int), default=None,
                     help="most response tokens per request (default: the model's context length)")
    lim.add_argument("--max-prompt-tokens", type=_positive(int), default=None,
                     help="most prompt tokens per prompt (default: the context length - 1)")
    lim.add_argument("--max-body-bytes", type=_positive(int), default=None,
                     help="largest request body; more gets HTTP 413 (default: 64 bytes per context token, >= 1 MiB)")
    lim.add_argument("--request-timeout-s", type=_positive(float), default=None,
                     help="cancel a request not finished this many seconds after it arrived (default 600); "
                          "/health fails when the worker makes no step for this long")
    s.add_argument("--shutdown-grace-s", type=_positive(float), default=30.0,
                   help="on SIGTERM/Ctrl-C, wait this long for running and queued requests, then cancel them and "
                        "exit (default 30)")
    s.add_argument("--allowed-host", action="append", default=[], metavar="NAME",
                   help="also accept requests whose Host header is NAME (repeatable; default: only the bound "
                        "address and, for loopback, localhost; other Host headers get 403)")


def add_serve_parser(sub: Any) -> None:
    """Register `serve`, `ray-serve` and `ui` on the `dsl-llada` subparsers."""
    s = sub.add_parser("serve", help="OpenAI-compatible HTTP server with continuous batching and streamed denoising")
    _add_serve_options(s, ui=True)
    s.set_defaults(func=cmd_serve)

    r = sub.add_parser("ray-serve", help="the same server as Ray Serve replicas, on this machine or a Ray cluster "
                                          f"(needs {RAY_INSTALL!r})",
                       description="Serve the model from several Ray Serve replicas behind Ray Serve's HTTP proxy "
                                   "(--host/--port are the proxy's). Each replica opens the model once and serves "
                                   "it as `dsl-llada serve` does, with the same options. See docs/serving.md, "
                                   "'Ray Serve'.")
    add_ray_serve_args(r)
    r.set_defaults(func=cmd_ray_serve)

    u = sub.add_parser("ui", help="web UI: watch DSL-SDE and LLaDA remasking denoise side by side (Gradio)")
    _add_model_args(u, required=False, port=UI_PORT)
    u.add_argument("--toy-dir", default=None,
                   help="where the default toy model is cached/trained (default: ~/.cache/dsl-llada/toy-demo)")
    u.set_defaults(func=cmd_ui)


def add_ray_serve_args(p: argparse.ArgumentParser) -> None:
    """`ray-serve`'s options: `serve`'s (but --ui), the replicas (RayConfig's fields), and the Ray instance."""
    from .flags import add_config_args, field_docs
    from ..serve.ray_deploy import RayConfig

    _add_serve_options(p, ui=False)
    docs = field_docs(RayConfig)  # the optional ones say their default in words
    add_config_args(p.add_argument_group("Ray Serve replicas"), (RayConfig, "ray"),
                    helps={n: " ".join(docs[n].split()) for n in ("num_replicas", "min_replicas", "max_replicas",
                                                                  "target_ongoing_requests")},
                    metavars={"num_replicas": "N", "min_replicas": "N", "max_replicas": "N",
                              "target_ongoing_requests": "N", "max_ongoing_requests": "N"})
    ray = p.add_argument_group("Ray instance")
    ray.add_argument("--ray-address", default=None, metavar="ADDRESS",
                     help="deploy on this Ray cluster: 'auto' (the cluster this machine joined with `ray start`) or "
                          "HOST:PORT of its head node (default: start Ray on this machine for this command alone)")
    ray.add_argument("--ray-temp-dir", default=None, metavar="FOLDER",
                     help="session files and logs of the Ray instance started here (default: Ray's own, /tmp/ray)")


LIMIT_FLAGS = ("max_nfe", "max_steps", "max_tokens", "max_prompt_tokens", "max_body_bytes", "request_timeout_s")


def serve_settings(a: argparse.Namespace) -> ServeSettings:
    """The ServeSettings of `serve`'s parsed flags (the API key read from --api-key-file here, where it enters)."""
    from .flags import config_from_args
    from .flags import model_source_from_args
    from ..serve.server import ServeSettings
    from ..serve.settings import ServerConfig

    server = config_from_args(ServerConfig, a)
    api_key = a.api_key
    if a.api_key_file:
        api_key = Path(a.api_key_file).read_text().strip()
        if not api_key:
            raise ValueError(f"--api-key-file {a.api_key_file!r} is empty")
    return ServeSettings(source=model_source_from_args(a), server=server, served_model_name=a.served_model_name,
                         api_key=api_key, ui=getattr(a, "ui", False), limits={k: getattr(a, k) for k in LIMIT_FLAGS},
                         shutdown_grace_s=a.shutdown_grace_s, host=a.host, port=a.port,
                         allowed_hosts=tuple(a.allowed_host))


def ray_serve_settings(a: argparse.Namespace) -> RayServeSettings:
    """The RayServeSettings of `ray-serve`'s parsed flags."""
    from .flags import config_from_args
    from ..serve.ray_deploy import RayConfig, RayServeSettings

    return RayServeSettings(serve=serve_settings(a), ray=config_from_args(RayConfig, a), address=a.ray_address,
                            temp_dir=a.ray_temp_dir)


def cmd_ray_serve(a: argparse.Namespace) -> int:
    from ..serve.ray_deploy import import_ray, run_ray_serve

    import_ray()  # before anything else: without Ray, the one line that says how to install it
    return run_ray_serve(ray_serve_settings(a))


def cmd_serve(a: argparse.Namespace) -> int:
    from ..serve.server import run_serve

    return run_serve(serve_settings(a))


def cmd_ui(a: argparse.Namespace) -> int:
    from .flags import model_source_from_args
    from ..serve.server import UISettings, run_ui

    return run_ui(UISettings(source=model_source_from_args(a), host=a.host, port=a.port, toy_dir=a.toy_dir))
