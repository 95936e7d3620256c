"""`dsl-llada serve` and `dsl-llada ui`: argument parsing and start-up only (the app lives in app.py / ui.py)."""

from __future__ import annotations

import argparse
import errno
import logging
import socket
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..loading import ModelHandle

log = logging.getLogger(__name__)


def _positive(kind):
    def parse(text: str):
        try:
            v = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        too_small = v < 1 if kind is int else v < 0
        if too_small:
            raise argparse.ArgumentTypeError(f"{text!r} must be {'>= 1' if kind is int else '>= 0'}")
        return v
    return parse


SERVE_PORT = 8000
UI_PORT = 7860


def check_port_free(host: str, port: int) -> None:
    """One clear error before the model loads when the address cannot be bound (port taken, unknown host)."""
    if port == 0:
        return
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds
        try:
            s.bind((host, port))
        except OSError as e:
            if e.errno == errno.EADDRINUSE:
                raise ValueError(f"port {port} on {host} is already in use; pick another with --port "
                                 f"(or stop the process that holds it)") from None
            raise ValueError(f"cannot listen on {host}:{port}: {e.strerror or e}") from None


TOY_MODEL_HELP = ("checkpoint folder (a DSL checkpoint or a bare backbone); default: the embedded toy world's DSL model "
                  "(trained by `demo --quick` once, then cached)")


def _add_model_args(p: argparse.ArgumentParser, *, required: bool, port: int) -> None:
    from ..model_source import add_model_source_args

    add_model_source_args(p, required=required, path_help=None if required else TOY_MODEL_HELP)
    p.add_argument("--host", default="127.0.0.1", help="interface to bind (default 127.0.0.1: this machine only)")
    p.add_argument("--port", type=int, default=port, help=f"TCP port (default {port}; 0 = any free port)")


def add_serve_parser(sub) -> None:
    """Register `serve` and `ui` on the `dsl-llada` subparsers."""
    from ..cli_config import add_config_args
    from .settings import ServerConfig

    s = sub.add_parser("serve", help="OpenAI-compatible HTTP server with dynamic batching and streamed denoising")
    _add_model_args(s, required=True, port=SERVE_PORT)
    s.add_argument("--served-model-name", default=None, help="model id in the API (default: the folder name)")
    add_config_args(s.add_argument_group("batching"), (ServerConfig, "server"))
    key = s.add_mutually_exclusive_group()
    key.add_argument("--api-key", default=None, help="require 'Authorization: Bearer KEY' (checked in constant time)")
    key.add_argument("--api-key-file", default=None, help="read the API key from this file (keeps it out of `ps`)")
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
    s.set_defaults(func=cmd_serve)

    u = sub.add_parser("ui", help="web UI: watch DSL-SDE and LLaDA remasking denoise side by side (Gradio)")
    _add_model_args(u, required=False, port=UI_PORT)
    u.add_argument("--toy-dir", default=None,
                   help="where the default toy model is cached/trained (default: ~/.cache/dsl-llada/toy-demo)")
    u.set_defaults(func=cmd_ui)


def _open(a: argparse.Namespace) -> ModelHandle:
    from ..loading import open_model
    from ..model_source import model_source_from_args

    return open_model(model_source_from_args(a))


def freeze_startup_objects() -> None:
    """Take every object alive now (the model, torch, transformers, FastAPI: about 400k objects for a tiny model)
    out of the cyclic garbage collector's scans (`gc.freeze`). Busy request handling allocates enough to trigger
    full collections now and then, and each one rescanned all of them: a 100-200 ms pause of every thread (the
    event loop and the sampler) on the serving benchmark's machine. Garbage made later is still collected."""
    import gc

    gc.collect()
    gc.freeze()


def _run_uvicorn(app, host: str, port: int, grace_s: float | None = None, on_exit=None) -> int:
    """Serve until SIGINT/SIGTERM; `on_exit()` runs first thing on the signal (the app starts draining), and the
    HTTP server cancels connections still open `grace_s` + 2 s later (after the app's own cancellation answered
    them with 503)."""
    import uvicorn

    class Server(uvicorn.Server):
        def handle_exit(self, sig, frame):
            if on_exit is not None:
                on_exit()
            super().handle_exit(sig, frame)

    timeout = None if grace_s is None else int(grace_s + 2)
    Server(uvicorn.Config(app, host=host, port=port, log_level="info", timeout_graceful_shutdown=timeout)).run()
    return 0


def cmd_serve(a: argparse.Namespace) -> int:
    from ..cli_config import config_from_args
    from .app import create_app
    from .settings import ServerConfig

    settings = config_from_args(ServerConfig, a)
    api_key = a.api_key
    if a.api_key_file:
        api_key = Path(a.api_key_file).read_text().strip()
        if not api_key:
            raise ValueError(f"--api-key-file {a.api_key_file!r} is empty")
    if a.ui and api_key:
        raise ValueError("--ui cannot be combined with --api-key (a browser cannot send the key); run `dsl-llada ui` "
                         "separately")
    check_port_free(a.host, a.port)
    from .limits import Limits
    from .middleware import allowed_hosts
    from .service import parameter_count

    handle = _open(a)
    model, tok, path = handle.model, handle.tokenizer, handle.path
    limits = Limits.for_model(handle.context, parameter_count(model), max_nfe=a.max_nfe, max_steps=a.max_steps,
                              max_tokens=a.max_tokens, max_prompt_tokens=a.max_prompt_tokens,
                              max_body_bytes=a.max_body_bytes, request_timeout_s=a.request_timeout_s)
    app = create_app(model, tok, model_name=a.served_model_name or path.name, api_key=api_key, limits=limits,
                     allowed_hosts=allowed_hosts(a.host, a.allowed_host), bind_host=a.host,
                     shutdown_grace_s=a.shutdown_grace_s, **settings.to_dict())
    batcher, begin_shutdown = app.state.service.batcher, app.state.begin_shutdown
    if a.ui:
        from .ui import mount_ui

        app = mount_ui(app, model, tok, path="/ui")
    print(f"serving {path} as {a.served_model_name or path.name!r} on http://{a.host}:{a.port} "
          f"(max_batch={settings.max_batch}, max_wait_ms={settings.max_wait_ms:g}, max_queue={settings.max_queue}; "
          f"limits: {limits.describe()})", flush=True)
    freeze_startup_objects()
    _run_uvicorn(app, a.host, a.port, a.shutdown_grace_s, on_exit=begin_shutdown)
    if batcher.abandoned:  # a sampler thread that never returned would block interpreter exit
        import os

        os._exit(0)
    return 0


def cmd_ui(a: argparse.Namespace) -> int:
    from .ui import build_app

    check_port_free(a.host, a.port)
    if getattr(a, "path", None) is None:
        from .ui import toy_model

        toy = Path(a.toy_dir) if a.toy_dir else Path.home() / ".cache" / "dsl-llada" / "toy-demo"
        print(f"no --model: using the embedded toy world's DSL model cached under {toy}/cache "
              f"(trained there by the `demo --quick` stages first if missing)", flush=True)
        model, tok = toy_model(toy)
        name = "toy world (demo --quick)"
    else:
        handle = _open(a)
        model, tok, name = handle.model, handle.tokenizer, handle.path.name
    print(f"web UI for {name} on http://{a.host}:{a.port}", flush=True)
    return _run_uvicorn(build_app(model, tok, title=f"dsl-llada: {name}"), a.host, a.port)
