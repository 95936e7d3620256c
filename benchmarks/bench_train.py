"""How fast does training run? One real DSL-objective run of a LLaDA-shaped model through the project's trainer.

The run is `dsl-llada train --config configs/toy.yaml` with the model swapped for a randomly initialised LLaDA of
the given shape (default about 1.3B parameters: d 2048, 16 layers, 16 heads, MLP 5632, LLaDA's vocabulary of
126,464 ids, of which the byte tokenizer uses 258) and bf16 mixed precision on a GPU: the trainer's own Hugging Face
accelerate loop in one process, AdamW, the toy corpus as UTF-8 bytes. It reports the loss at the first and last
logged windows (falling = the objective trains), tokens/s (median of the logged windows after the first, which
holds the warm-up), and model FLOP utilisation: 3 x the forward FLOPs per token (blocks, output head, the DSL
converter's slot logits and value product) x tokens/s over the bf16 matmul rate measured in the same process.

Usage (GPU):  PYTHONPATH=src python3 benchmarks/bench_train.py --json OUT/train.json
      (CPU, code path only):  PYTHONPATH=src python benchmarks/bench_train.py --tiny --json /tmp/train.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch
from benchlib import ROOT, block_flops_per_token, clock, parse_args, write_json

from dsl_llada.train.train_config import load_train_config
from dsl_llada.train.trainer import train

TINY = dict(d_model=64, n_layers=2, n_heads=4, mlp_hidden_size=176, vocab_size=1024, block=64, batch=4, steps=12,
            noise_dim=32)
FULL = dict(d_model=2048, n_layers=16, n_heads=16, mlp_hidden_size=5632, vocab_size=126464, block=512, batch=8,
            steps=60, noise_dim=100)
MAX_STEPS, MAX_BLOCK, MAX_BATCH = 2000, 4096, 256


def parameters(s: dict) -> dict[str, int]:
    """Parameter counts of the LLaDA shape (untied embedding and head; no biases)."""
    d, F_, V = s["d_model"], s["mlp_hidden_size"], s["vocab_size"]
    blocks = s["n_layers"] * (4 * d * d + 3 * d * F_ + 2 * d)
    return {"blocks": blocks, "embedding": V * d, "head": V * d, "total": blocks + 2 * V * d + d}


def train_flops_per_token(s: dict) -> float:
    """3 x the forward FLOPs of one token: the blocks at this block size, the head, the converter's slot logits
    (noise_dim x (V + 1)) and value product ((V + 1) x d)."""
    d, V = s["d_model"], s["vocab_size"]
    fwd = (s["n_layers"] * block_flops_per_token(d, s["mlp_hidden_size"], s["block"]) + 2.0 * d * V
           + 2.0 * s["noise_dim"] * (V + 1) + 2.0 * (V + 1) * d)
    return 3.0 * fwd


def matmul_peak(device: str, dtype: torch.dtype, n: int) -> float:
    """FLOP/s of the best of 5 n x n x n matmuls (after 2 warm-ups): the MFU denominator."""
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    for _ in range(2):
        clock(lambda: a @ b, device)
    return 2.0 * n ** 3 / min(clock(lambda: a @ b, device) for _ in range(5))


def overrides(s: dict, out: Path, mixed: str, lr: float) -> list[str]:
    vocab = s["vocab_size"]
    model = {"vocab_size": vocab, "d_model": s["d_model"], "n_layers": s["n_layers"], "n_heads": s["n_heads"],
             "mlp_hidden_size": s["mlp_hidden_size"], "max_sequence_length": max(256, s["block"]),
             "eos_token_id": 256, "pad_token_id": 256, "mask_token_id": 257}
    return [f"scratch_model={json.dumps(model)}", f"data.block_size={s['block']}", f"per_device_batch_size={s['batch']}",
            f"max_steps={s['steps']}", f"dsl.converter.noise_dim={s['noise_dim']}", f"mixed_precision={json.dumps(mixed)}",
            f"lr={lr}", f"warmup_steps={max(1, s['steps'] // 6)}", "grad_accum=1", "eval_every=0", "save_every=0",
            "data.validation_every=null", f"log_every={max(1, s['steps'] // 12)}", f"output_dir={out}", "keep_last=1",
            "save_final=false", "progress=false", "resume=null"]


def run(s: dict, device: str, mixed: str, lr: float, workdir: Path) -> dict:
    config = load_train_config(ROOT / "configs" / "toy.yaml", overrides(s, workdir / "run", mixed, lr))
    config = config.replace(data=config.data.replace(files=[str(ROOT / "configs" / "toy-corpus.txt")]))
    t0 = time.perf_counter()
    result = train(config)
    wall = time.perf_counter() - t0
    recs = [json.loads(line) for line in (workdir / "run" / "metrics.jsonl").read_text().splitlines()]
    recs = [r for r in recs if "tokens_per_s" in r]
    steady = [r["tokens_per_s"] for r in recs[1:]] or [r["tokens_per_s"] for r in recs]
    return {"steps": result.final_step, "stop_reason": result.stop_reason, "wall_s": wall,
            "loss_first_window": recs[0]["loss"], "loss_last_window": recs[-1]["loss"],
            "losses": {str(k): v for k, v in sorted(result.losses.items())},
            "tokens_per_s_windows": [r["tokens_per_s"] for r in recs],
            "tokens_per_s": statistics.median(steady), "tokens_per_step": s["block"] * s["batch"]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tiny", action="store_true", help="a tiny model on the CPU in fp32 (tests the code path)")
    ap.add_argument("--steps", type=int, default=None, help="updates (default 60; --tiny 12)")
    ap.add_argument("--layers", type=int, default=None, help="depth (default 16; --tiny 2)")
    ap.add_argument("--block", type=int, default=None, help="tokens per sequence (default 512; --tiny 64)")
    ap.add_argument("--batch", type=int, default=None, help="sequences per update (default 8; --tiny 4)")
    ap.add_argument("--lr", type=float, default=3e-4)
    ap.add_argument("--json", default=None, help="write the result here (JSON)")
    a = parse_args(ap)
    s = dict(TINY if a.tiny else FULL)
    for key, value, hi in (("steps", a.steps, MAX_STEPS), ("n_layers", a.layers, 256), ("block", a.block, MAX_BLOCK),
                           ("batch", a.batch, MAX_BATCH)):
        if value is not None:
            if not 1 <= value <= hi:
                ap.error(f"--{key.replace('n_', '')} {value} is out of range: it must be in [1, {hi}]")
            s[key] = value
    device = "cpu" if a.tiny or not torch.cuda.is_available() else "cuda"
    mixed = "bf16" if device == "cuda" else "no"
    peak = matmul_peak(device, torch.bfloat16 if device == "cuda" else torch.float32, 8192 if device == "cuda" else 512)
    shm = Path("/dev/shm")  # the final checkpoint of a 1B model is ~13 GB with AdamW states: keep it in memory
    with tempfile.TemporaryDirectory(dir=shm if shm.is_dir() and device == "cuda" else None) as tmp:
        res = run(s, device, mixed, a.lr, Path(tmp))
    fpt = train_flops_per_token(s)
    res.update({"shape": s, "parameters": parameters(s), "device": device,
                "device_name": torch.cuda.get_device_name() if device == "cuda" else "cpu",
                "mixed_precision": mixed, "train_flops_per_token": fpt, "matmul_peak_tflops": peak / 1e12,
                "mfu": fpt * res["tokens_per_s"] / peak, "loss_fell": res["loss_last_window"] < res["loss_first_window"]})
    print(f"train: {res['parameters']['total'] / 1e9:.2f}B parameters, {res['steps']} steps on {res['device_name']} "
          f"({mixed}); loss {res['loss_first_window']:.3f} -> {res['loss_last_window']:.3f}; "
          f"{res['tokens_per_s']:.0f} tokens/s; MFU {100 * res['mfu']:.1f} % of {peak / 1e12:.0f} TFLOP/s measured")
    write_json(a.json, res)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
