"""Shared pieces of the training tests and their launch scripts (tiny model, synthetic corpus, tokenizer,
a rank-independent objective, parameter checksums). Importable from `tests/` and `tests/scripts/`."""

from __future__ import annotations

import hashlib
import json
import random
from pathlib import Path

import torch

from dsl_llada.core.backbones import save_backbone
from dsl_llada.core.backbones.llada import LLaDABackbone, tiny_llada_config
from dsl_llada.train.train_config import TrainConfig
from dsl_llada.train.objectives import ObjectiveOutput, get_objective

VOCAB = 64  # [MASK] = 63, EOS = 62 (tiny_llada_config defaults); letters a..t are ids 0..19
N_SYMBOLS = 20


def make_backbone_dir(folder: str | Path, *, seed: int = 0, d_model: int = 32, n_layers: int = 2,
                      max_sequence_length: int = 256) -> Path:
    """A randomly initialised (std 0.02) tiny LLaDA saved as a Hugging Face-style folder."""
    bb = LLaDABackbone(tiny_llada_config(VOCAB, d_model=d_model, n_layers=n_layers,
                                         max_sequence_length=max_sequence_length))
    bb.init_weights(torch.Generator().manual_seed(seed), std=0.02)
    return save_backbone(bb, folder)


def corpus(n_docs: int = 200, seed: int = 0) -> list[str]:
    """Periodic letter strings ('abcabcab...', period 2-5) of 40-80 characters: learnable from context."""
    rng = random.Random(seed)
    docs = []
    for _ in range(n_docs):
        period = rng.randint(2, 5)
        pattern = [rng.randrange(N_SYMBOLS) for _ in range(period)]
        docs.append("".join(chr(97 + pattern[i % period]) for i in range(rng.randint(40, 80))))
    return docs


def letters(text: str) -> list[int]:
    """The in-memory tokenizer: one id per letter (a=0 ... t=19)."""
    return [ord(c) - 97 for c in text]


class ContentSeededObjective:
    """The registered objective, but each sequence's noise comes from a generator seeded by the sequence's own
    tokens (and the loss is the mean of per-sequence losses). The noise a sequence gets therefore does not depend
    on which process, micro-batch or batch position it lands in, so a 2-process run and a 1-process run with the
    same global batch composition compute the same losses and gradients (up to float summation order)."""

    def __init__(self, name: str, **options):
        self.inner = get_objective(name, **options)

    def __call__(self, model, batch, generator=None) -> ObjectiveOutput:
        ids = batch["input_ids"]
        losses, n = [], 0
        for row in ids:
            seed = int(hashlib.sha256(row.cpu().numpy().tobytes()).hexdigest()[:12], 16)
            g = torch.Generator(device=ids.device).manual_seed(seed)
            out = self.inner(model, {"input_ids": row[None]}, g)
            losses.append(out.loss)
            n += out.n_tokens
        loss = torch.stack(losses).mean()
        return ObjectiveOutput(loss=loss, metrics={"loss": float(loss.detach())}, n_tokens=n)


def multiproc_config(objective: str, backbone: str | Path, out: str | Path, *, world_size: int, steps: int,
                     sharding: str = "none") -> TrainConfig:
    """The run of the multi-process tests: global batch 2 sequences x 2 micro-batches per update. With world_size=2
    each process has 1 sequence per micro-batch; the 1-process reference has 2. Monitoring at update 5 (and at the
    last update) sees the same 4 blocks in both layouts."""
    return TrainConfig(objective=objective, init_from=str(backbone), output_dir=str(out), world_size=world_size,
                       sharding=sharding, dsl={"converter": {"noise_dim": 16}},
                       data={"block_size": 32, "shuffle_buffer": 0, "repeat": True}, lr=3e-3, converter_lr_mult=10.0,
                       warmup_steps=2, max_steps=steps, per_device_batch_size=2 // world_size, grad_accum=2,
                       save_every=0, log_every=1, eval_every=5, eval_batches=2, progress=False, resume="auto")


def param_checksum(model: torch.nn.Module) -> str:
    """sha256 over every parameter's and buffer's full bytes (as float32). Sharded (DTensor) tensors are gathered
    first, so under FSDP every process must call this, in the same order."""
    h = hashlib.sha256()
    for name, t in sorted(model.state_dict().items()):
        if hasattr(t, "full_tensor"):  # a DTensor shard (FSDP2)
            t = t.full_tensor()
        h.update(name.encode())
        h.update(t.detach().float().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def write_json(path: str | Path, data) -> None:
    Path(path).write_text(json.dumps(data, indent=1))
