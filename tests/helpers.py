"""Tiny model builders shared by the tests (import as `from helpers import tiny_backbone, tiny_dsl`).

pytest's default ("prepend") import mode puts `tests/` on sys.path because the folder has no __init__.py,
so this module is importable from every test file without installing anything.

Conventions of the tiny LLaDA (see `tiny_llada_config`): vocabulary V = 64, [MASK] = V - 1 = 63,
EOS = V - 2 = 62 (also the padding id), hidden size 32, 2 layers, 4 heads.
Weights are drawn with std 0.3 by default (not the 0.02 of a real init): at 0.02 the logits are nearly flat and
greedy decoding emits one token everywhere, which would make determinism / batch-equivalence checks vacuous.
"""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer

import torch

from dsl_llada.core.backbones.llada import LLaDABackbone, tiny_llada_config
from dsl_llada.config import ConverterConfig, DSLConfig
from dsl_llada.core.model import DSLModel

V = 64
MASK = V - 1
EOS = V - 2
HIDDEN = 32


def gen(seed: int = 0) -> torch.Generator:
    """A CPU generator seeded with `seed`."""
    return torch.Generator().manual_seed(seed)


def tiny_backbone(vocab: int = V, seed: int = 0, *, std: float = 0.3, d_model: int = HIDDEN, n_layers: int = 2,
                  **config_kw) -> LLaDABackbone:
    """A randomly initialised tiny LLaDA backbone in eval mode (fp32, CPU). `config_kw` go to tiny_llada_config
    (e.g. eot_token_id=61, max_sequence_length=16, n_kv_heads=2)."""
    cfg = tiny_llada_config(vocab, d_model=d_model, n_layers=n_layers, **config_kw)
    bb = LLaDABackbone(cfg)
    bb.init_weights(gen(seed), std=std)
    return bb.eval()


def tiny_dsl(vocab: int = V, seed: int = 0, *, noise_dim: int = 16, std: float = 0.3,
             context_embedding: str = "converter", backbone_kw: dict | None = None, **converter_kw) -> DSLModel:
    """`DSLModel.convert` around `tiny_backbone(vocab, seed, std=std, **backbone_kw)`, eval mode.

    `converter_kw` are ConverterConfig fields (layout='paper', residual=True, beta_init=2.0, token_chunk=3, ...).
    """
    bb = tiny_backbone(vocab, seed, std=std, **(backbone_kw or {}))
    cfg = DSLConfig(converter=ConverterConfig(noise_dim=noise_dim, **converter_kw), context_embedding=context_embedding)
    return DSLModel.convert(bb, cfg).eval()


def toy_backbone(world, seed: int = 0, std: float = 0.3):
    """(tokenizer, tiny random LLaDA) over a ToyWorld's vocabulary with the world's special tokens, eval mode."""
    from dsl_llada.core.backbones.base import SpecialTokens
    from dsl_llada.toy import build_tokenizer, special_ids

    tok = build_tokenizer(world)
    s = special_ids(tok)
    cfg = tiny_llada_config(world.vocab_size, mask_token_id=s["mask"], eos_token_id=s["eos"], eot_token_id=s["eot"],
                            bos_token_id=s["bos"])
    bb = LLaDABackbone(cfg, SpecialTokens(mask=s["mask"], eos=s["eos"], eot=s["eot"], pad=s["pad"], bos=s["bos"]))
    bb.init_weights(gen(seed), std=std)
    return tok, bb.eval()


def perturb_converter(model: DSLModel, seed: int = 1, scale: float = 0.05) -> DSLModel:
    """Move every converter parameter away from its init (so 'converter' and 'wte' context paths differ, value
    bias is non-zero, etc.), in place. Returns the model."""
    g = gen(seed)
    with torch.no_grad():
        for p in model.converter.parameters():
            p.add_(scale * torch.randn(p.shape, generator=g).to(p.dtype))
    return model


class BatchLog:
    """Wraps the model's backbone (a subclass of its own class) so every forward records its batch size."""

    def __init__(self, model):
        self.sizes: list[int] = []
        log = self.sizes
        base = type(model.backbone)

        class Recording(base):  # type: ignore[misc, valid-type]
            def forward(self, x, *args, **kwargs):
                log.append(x.shape[0])
                return super().forward(x, *args, **kwargs)

            def forward_cached(self, x, *args, **kwargs):
                log.append(x.shape[0])
                return super().forward_cached(x, *args, **kwargs)

        self.model, self.base = model, base
        model.backbone.__class__ = Recording

    def __enter__(self) -> "BatchLog":
        return self

    def __exit__(self, *exc) -> None:
        self.model.backbone.__class__ = self.base


# `python -m` entry points run the CLI when imported; they are the only modules `package_modules` leaves out.
ENTRY_POINTS = {"dsl_llada.__main__", "dsl_llada.train.__main__"}


def package_modules() -> list[str]:
    """Every importable module of the installed dsl_llada package (packages included), sorted."""
    import pkgutil

    import dsl_llada

    names = ["dsl_llada"] + [m.name for m in pkgutil.walk_packages(dsl_llada.__path__, prefix="dsl_llada.")]
    return sorted(n for n in names if n not in ENTRY_POINTS)


def toy_backbone_folder(path):
    """A tiny random LLaDA (std 0.3) over a 2-topic toy world's vocabulary, saved at `path` with the world's
    tokenizer and chat template. Returns `path`."""
    from dsl_llada.core.backbones import save_backbone
    from dsl_llada.core.backbones.base import SpecialTokens
    from dsl_llada.toy import ToyWorld, ToyWorldConfig, build_tokenizer, special_ids

    world = ToyWorld(ToyWorldConfig(n_topics=2))
    tok = build_tokenizer(world)
    s = special_ids(tok)
    cfg = tiny_llada_config(world.vocab_size, mask_token_id=s["mask"], eos_token_id=s["eos"], eot_token_id=s["eot"],
                            bos_token_id=s["bos"])
    bb = LLaDABackbone(cfg, SpecialTokens(mask=s["mask"], eos=s["eos"], eot=s["eot"], pad=s["pad"], bos=s["bos"]))
    bb.init_weights(torch.Generator().manual_seed(0), std=0.3)
    save_backbone(bb, path)
    tok.save_pretrained(path)
    return path


@contextlib.contextmanager
def first_shown_judge() -> Iterator[tuple[str, list[int]]]:
    """A local OpenAI-compatible endpoint whose judge always prefers the candidate shown first. Yields its base URL
    and a list that grows by one per request."""
    from dsl_llada.eval.judge import AXES

    calls: list[int] = []

    class Judge(BaseHTTPRequestHandler):
        def do_POST(self):
            calls.append(1)
            self.rfile.read(int(self.headers["Content-Length"]))
            reply = {"a": dict.fromkeys(AXES, 4), "b": dict.fromkeys(AXES, 2), "overall": "A", "rationale": "first"}
            data = json.dumps({"choices": [{"message": {"content": json.dumps(reply)}}]}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *a):
            pass

    srv = HTTPServer(("127.0.0.1", 0), Judge)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}/v1", calls
    finally:
        srv.shutdown()
        srv.server_close()
