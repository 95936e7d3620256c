"""`dsl-llada serve` and `dsl-llada ui` as library calls: `run_serve(ServeSettings(...))` opens the model
(`loading.open_model`), builds the app (`app.create_app`) and serves it until SIGINT/SIGTERM; `run_ui(UISettings(...))`
does the same for the web UI alone. The command line only parses its flags into these settings (`serve_cli.py`)."""

from __future__ import annotations

import errno
import logging
import socket
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..core.loading import open_model
from ..core.model_source import ModelSource
from .settings import SERVE_PORT, UI_PORT, ServerConfig

if TYPE_CHECKING:
    from .batcher import Batcher
    from .limits import Limits

__all__ = ["SERVE_PORT", "UI_PORT", "ServeSettings", "ServedApp", "UISettings", "check_port_free",
           "freeze_startup_objects", "open_serve_app", "run_serve", "run_ui"]

log = logging.getLogger(__name__)

@dataclass(frozen=True)
class ServeSettings:
    """One `serve` process: the model, the batching, the request limits, the address and the access rules."""

    source: ModelSource
    server: ServerConfig = field(default_factory=ServerConfig)
    served_model_name: str | None = None
    """The model id in the API (default: the model folder's name)."""
    api_key: str | None = None
    ui: bool = False
    """Also mount the Gradio web UI at /ui."""
    limits: dict[str, Any] = field(default_factory=dict)
    """`Limits.for_model` overrides (max_nfe, max_steps, max_tokens, max_prompt_tokens, max_body_bytes,
    request_timeout_s); a missing or None one is derived from the model."""
    shutdown_grace_s: float = 30.0
    host: str = "127.0.0.1"
    port: int = SERVE_PORT
    allowed_hosts: tuple[str, ...] = ()
    """Host header names accepted besides the bound address (and, for loopback, localhost)."""

    def __post_init__(self) -> None:
        if self.ui and self.api_key:
            raise ValueError("--ui cannot be combined with --api-key (a browser cannot send the key); run `dsl-llada "
                             "ui` separately")
        if self.api_key is not None and not self.api_key:
            raise ValueError("the API key is empty")


@dataclass(frozen=True)
class UISettings:
    """One `ui` process: the model (None: the embedded toy world's DSL model) and the address."""

    source: ModelSource
    host: str = "127.0.0.1"
    port: int = UI_PORT
    toy_dir: str | None = None
    """Where the default toy model is cached/trained (default: ~/.cache/dsl-llada/toy-demo)."""


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


def freeze_startup_objects() -> None:
    """Take every object alive now (the model, torch, transformers, FastAPI: about 400k objects for a tiny model)
    out of the cyclic garbage collector's scans (`gc.freeze`). Busy request handling allocates enough to trigger
    full collections now and then, and each one rescanned all of them: a 100-200 ms pause of every thread (the
    event loop and the sampler) on the serving benchmark's machine. Garbage made later is still collected."""
    import gc

    gc.collect()
    gc.freeze()


def run_uvicorn(app: Any, host: str, port: int, grace_s: float | None = None,
                on_exit: Callable[[], None] | None = None) -> int:
    """Serve until SIGINT/SIGTERM; `on_exit()` runs first thing on the signal (the app starts draining), and the
    HTTP server cancels connections still open `grace_s` + 2 s later (after the app's own cancellation answered
    them with 503)."""
    import uvicorn

    class Server(uvicorn.Server):
        def handle_exit(self, sig: int, frame: Any) -> None:
            if on_exit is not None:
                on_exit()
            super().handle_exit(sig, frame)

    timeout = None if grace_s is None else int(grace_s + 2)
    Server(uvicorn.Config(app, host=host, port=port, log_level="info", timeout_graceful_shutdown=timeout)).run()
    return 0


@dataclass
class ServedApp:
    """What `open_serve_app` opened: the app, the model's folder, its API name and the limits in force."""

    app: Any
    path: Path
    name: str
    limits: Limits
    batcher: Batcher
    begin_shutdown: Callable[[], None]
    """Start draining (from a signal handler: the app then answers what is still running with 503 at the end of
    the grace period)."""

    def banner(self, settings: ServeSettings, url: str) -> str:
        c = settings.server
        return (f"serving {self.path} as {self.name!r} on {url} (max_batch={c.max_batch}, "
                f"max_wait_ms={c.max_wait_ms:g}, max_queue={c.max_queue}; limits: {self.limits.describe()})")


def open_serve_app(settings: ServeSettings) -> ServedApp:
    """Open the model (`loading.open_model`) and build the serving app around it, as `serve` does; the Ray Serve
    deployment opens each replica's model through this same call."""
    from .app import create_app
    from .limits import Limits
    from .middleware import allowed_hosts
    from .service import parameter_count

    s = settings
    handle = open_model(s.source)
    limits = Limits.for_model(handle.context, parameter_count(handle.model), **s.limits)
    name = s.served_model_name or handle.path.name
    app = create_app(handle.model, handle.tokenizer, model_name=name, server=s.server, api_key=s.api_key,
                     limits=limits, allowed_hosts=allowed_hosts(s.host, list(s.allowed_hosts)), bind_host=s.host,
                     shutdown_grace_s=s.shutdown_grace_s, context=handle.context)
    batcher, begin_shutdown = app.state.service.batcher, app.state.begin_shutdown
    if s.ui:
        from .ui import mount_ui

        app = mount_ui(app, handle.model, handle.tokenizer, path="/ui")
    return ServedApp(app=app, path=handle.path, name=name, limits=limits, batcher=batcher,
                     begin_shutdown=begin_shutdown)


def run_serve(settings: ServeSettings) -> int:
    """Serve the model until SIGINT/SIGTERM (exit code 0); bad settings raise ValueError before the model loads."""
    s = settings
    check_port_free(s.host, s.port)
    served = open_serve_app(s)
    print(served.banner(s, f"http://{s.host}:{s.port}"), flush=True)
    freeze_startup_objects()
    run_uvicorn(served.app, s.host, s.port, s.shutdown_grace_s, on_exit=served.begin_shutdown)
    if served.batcher.abandoned:  # a sampler thread that never returned would block interpreter exit
        import os

        os._exit(0)
    return 0


def run_ui(settings: UISettings) -> int:
    """Serve the web UI until SIGINT/SIGTERM; without a model path, the toy world's DSL model."""
    from .ui import build_app

    check_port_free(settings.host, settings.port)
    if settings.source.path is None:
        from .ui import toy_model

        toy = Path(settings.toy_dir) if settings.toy_dir else Path.home() / ".cache" / "dsl-llada" / "toy-demo"
        print(f"no --model: using the embedded toy world's DSL model cached under {toy}/cache "
              f"(trained there by the `demo --quick` stages first if missing)", flush=True)
        model, tok = toy_model(toy)
        name = "toy world (demo --quick)"
    else:
        handle = open_model(settings.source)
        model, tok, name = handle.model, handle.tokenizer, handle.path.name
    print(f"web UI for {name} on http://{settings.host}:{settings.port}", flush=True)
    return run_uvicorn(build_app(model, tok, title=f"dsl-llada: {name}"), settings.host, settings.port)
