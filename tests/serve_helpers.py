"""Shared pieces of the serving tests: a tiny saved DSL model over the toy world's vocabulary, the library's own
answer for a prompt (the reference the server must reproduce), and a real uvicorn server on 127.0.0.1."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from pathlib import Path

import torch

from dsl_llada.core.backbones import LLaDABackbone, tiny_llada_config
from dsl_llada.core.backbones.base import SpecialTokens
from dsl_llada.config import ConverterConfig, DSLConfig
from dsl_llada.core.loading import encode_prompt
from dsl_llada.core.model import DSLModel
from dsl_llada.sampling import PromptBatch, sample_remask, sample_remdm, sample_sde
from dsl_llada.toy import ToyWorld, ToyWorldConfig, build_tokenizer, special_ids


def save_tiny_toy_dsl(path: Path, *, max_sequence_length: int = 64, seed: int = 0) -> Path:
    """A random tiny DSL model (d=32, 2 layers, context `max_sequence_length`) with the toy world's tokenizer."""
    world = ToyWorld(ToyWorldConfig(n_topics=2))
    tok = build_tokenizer(world)
    s = special_ids(tok)
    cfg = tiny_llada_config(world.vocab_size, mask_token_id=s["mask"], eos_token_id=s["eos"], eot_token_id=s["eot"],
                            bos_token_id=s["bos"], max_sequence_length=max_sequence_length)
    bb = LLaDABackbone(cfg, SpecialTokens(mask=s["mask"], eos=s["eos"], eot=s["eot"], pad=s["pad"], bos=s["bos"]))
    bb.init_weights(torch.Generator().manual_seed(seed), std=0.3)
    model = DSLModel.convert(bb, DSLConfig(converter=ConverterConfig(noise_dim=16))).eval()
    model.save_pretrained(path)
    tok.save_pretrained(str(path))
    return path


def library_ids(model, tokenizer, prompt: str, sampler: str, config, seed: int, *, chat_template: bool = True) -> list[int]:
    """What the library itself samples for one prompt with a CPU generator seeded `seed` (batch of one)."""
    ids = encode_prompt(tokenizer, prompt, chat_template=chat_template)
    batch = PromptBatch.from_lists([ids], pad_id=model.special.pad_id)
    fn = {"sde": sample_sde, "block-sde": sample_sde, "remask": sample_remask, "remdm": sample_remdm}[sampler]
    out = fn(model, batch, config, generator=torch.Generator().manual_seed(seed))
    return out.responses()[0]


def library_batch_texts(model, tokenizer, prompts: list[str], sampler: str, config, seed: int) -> list[str]:
    """What the library samples for `prompts` in one batched call (left-padded, prompt i with a generator seeded
    `seed + i`, as `generation.generate` runs them), chat template applied."""
    ids = [encode_prompt(tokenizer, p, chat_template=True) for p in prompts]
    batch = PromptBatch.from_lists(ids, pad_id=model.special.pad_id)
    fn = {"sde": sample_sde, "block-sde": sample_sde, "remask": sample_remask, "remdm": sample_remdm}[sampler]
    out = fn(model, batch, config, generator=[torch.Generator().manual_seed(seed + i) for i in range(len(ids))])
    return [tokenizer.decode(r, skip_special_tokens=True) for r in out.responses()]


def library_text(model, tokenizer, prompt: str, sampler: str, config, seed: int, *, chat_template: bool = True) -> str:
    return tokenizer.decode(library_ids(model, tokenizer, prompt, sampler, config, seed, chat_template=chat_template),
                            skip_special_tokens=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def uvicorn_server(app, *, timeout: float = 30.0):
    """Run `app` on 127.0.0.1:<free port> in a thread; yields (base URL, uvicorn.Server); stops (draining) on exit."""
    import uvicorn

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="on"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    t0 = time.monotonic()
    while not server.started:
        if not thread.is_alive() or time.monotonic() - t0 > timeout:
            raise RuntimeError("uvicorn did not start")
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}", server
    finally:
        server.should_exit = True
        thread.join(timeout)
