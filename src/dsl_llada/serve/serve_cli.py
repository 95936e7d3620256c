"""`dsl-llada serve` and `dsl-llada ui`: argument parsing and start-up only (the app lives in app.py / ui.py)."""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

log = logging.getLogger(__name__)


def _add_model_args(p: argparse.ArgumentParser, *, required: bool) -> None:
    p.add_argument("--model", required=required, default=None,
                   help="checkpoint folder (DSL checkpoint or bare backbone)" + ("" if required else
                        "; default: the embedded toy world's DSL model (trained by `demo --quick` once, then cached)"))
    p.add_argument("--tokenizer", default=None, help="tokenizer folder (default: the model folder)")
    p.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    p.add_argument("--dtype", default="auto", help="auto / float32 / bfloat16 / float16 (auto: bf16 on GPU and on a "
                                                   "CPU with native bf16, else fp32)")
    p.add_argument("--host", default="127.0.0.1", help="interface to bind (default 127.0.0.1: this machine only)")
    p.add_argument("--port", type=int, default=8000, help="TCP port (default 8000; 0 = any free port)")


def add_serve_parser(sub) -> None:
    """Register `serve` and `ui` on the `dsl-llada` subparsers."""
    from ..cli_config import add_config_args
    from .settings import ServerConfig

    s = sub.add_parser("serve", help="OpenAI-compatible HTTP server with dynamic batching and streamed denoising")
    _add_model_args(s, required=True)
    s.add_argument("--served-model-name", default=None, help="model id in the API (default: the folder name)")
    add_config_args(s.add_argument_group("batching"), (ServerConfig, "server"))
    key = s.add_mutually_exclusive_group()
    key.add_argument("--api-key", default=None, help="require 'Authorization: Bearer KEY' (checked in constant time)")
    key.add_argument("--api-key-file", default=None, help="read the API key from this file (keeps it out of `ps`)")
    s.add_argument("--ui", action="store_true", help="also mount the Gradio web UI at /ui (not with an API key)")
    s.set_defaults(func=cmd_serve)

    u = sub.add_parser("ui", help="web UI: watch DSL-SDE and LLaDA remasking denoise side by side (Gradio)")
    _add_model_args(u, required=False)
    u.add_argument("--toy-dir", default=None,
                   help="where the default toy model is cached/trained (default: ~/.cache/dsl-llada/toy-demo)")
    u.set_defaults(func=cmd_ui)


def _load(a: argparse.Namespace):
    from ..backbones import resolve_model_path
    from ..loading import default_device, load_model, load_tokenizer, resolve_dtype

    device = a.device or default_device()
    path = resolve_model_path(a.model)
    dtype = resolve_dtype(a.dtype, device)
    model = load_model(path, dtype=dtype, device=device)
    return model, load_tokenizer(a.tokenizer or path), Path(path)


def _run_uvicorn(app, host: str, port: int) -> int:
    import uvicorn

    uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level="info", timeout_graceful_shutdown=None)).run()
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
    model, tok, path = _load(a)
    app = create_app(model, tok, model_name=a.served_model_name or path.name, api_key=api_key, **settings.to_dict())
    if a.ui:
        from .ui import mount_ui

        app = mount_ui(app, model, tok, path="/ui")
    print(f"serving {path} as {a.served_model_name or path.name!r} on http://{a.host}:{a.port} "
          f"(max_batch={settings.max_batch}, max_wait_ms={settings.max_wait_ms:g}, max_queue={settings.max_queue})",
          flush=True)
    return _run_uvicorn(app, a.host, a.port)


def cmd_ui(a: argparse.Namespace) -> int:
    from .ui import build_app

    if a.model is None:
        from .ui import toy_model

        toy = Path(a.toy_dir) if a.toy_dir else Path.home() / ".cache" / "dsl-llada" / "toy-demo"
        print(f"no --model: using the embedded toy world's DSL model cached under {toy}/cache "
              f"(trained there by the `demo --quick` stages first if missing)", flush=True)
        model, tok = toy_model(toy)
        name = "toy world (demo --quick)"
    else:
        model, tok, path = _load(a)
        name = path.name
    print(f"web UI for {name} on http://{a.host}:{a.port}", flush=True)
    return _run_uvicorn(build_app(model, tok, title=f"dsl-llada: {name}"), a.host, a.port)
