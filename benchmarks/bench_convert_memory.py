"""Weight memory of a LLaDA backbone as a DSL model: the estimate `dsl-llada convert --dry-run` prints, as a results
file. Counted from the config alone (parameter counts x bytes per dtype; `convert_command.memory_estimate_rows`),
so the figures are the same on every host; nothing is loaded, downloaded or written but the results.

Default config: LLaDA-8B-Instruct's shape, the fields of its config.json that size the weights (d_model 4096,
32 layers, 32 heads, 32 key/value heads, MLP hidden 12,288, vocabulary 126,464, untied output head); `--config`
reads another LLaDA config.json instead. The page's table is rendered from the --json results
(`python scripts/docs_tables.py --write-pages convert-memory-llada8b`).

Usage:  python benchmarks/bench_convert_memory.py [--config CONFIG_JSON] [--noise-dim 100] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from benchlib import parse_args, write_json

from dsl_llada.config import ConverterConfig
from dsl_llada.core.backbones.llada import LLaDAConfig
from dsl_llada.core.convert_command import memory_estimate_rows
from dsl_llada.errors import CheckpointError

LLADA_8B: dict[str, Any] = {"model_type": "llada", "d_model": 4096, "n_layers": 32, "n_heads": 32, "n_kv_heads": 32,
                            "mlp_hidden_size": 12288, "vocab_size": 126464, "embedding_size": 126464,
                            "weight_tying": False, "max_sequence_length": 4096}
"""LLaDA-8B-Instruct's config.json, the fields that size its weights (the rest keep LLaDAConfig's defaults)."""


def estimate(config: dict[str, Any], noise_dim: int, name: str) -> dict[str, Any]:
    """The results: the config's sizes and `convert --dry-run`'s rows for it."""
    cfg = LLaDAConfig.from_hf_dict(config, where=name)
    rows = memory_estimate_rows(cfg, noise_dim)
    return {"model": name, "d_model": cfg.d_model, "n_layers": cfg.n_layers, "n_heads": cfg.n_heads,
            "n_kv_heads": cfg.kv_heads, "mlp_hidden_size": cfg.ffn_hidden, "vocab_size": cfg.vocab_size,
            "weight_tying": cfg.weight_tying, "noise_dim": noise_dim, "parameters": rows[0]["parameters"], "rows": rows}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default=None, help="a LLaDA config.json (default: LLaDA-8B-Instruct's shape)")
    ap.add_argument("--noise-dim", type=int, default=ConverterConfig().noise_dim,
                    help="the converter's noise dimension d (default: the library's, %(default)s)")
    ap.add_argument("--json", default=None, help="write the estimate and this run's environment record here")
    a = parse_args(ap, threads_default=1, argv=argv)
    if a.noise_dim < 1:
        print(f"error: --noise-dim {a.noise_dim} is not valid; give 1 or more", file=sys.stderr)
        return 2
    try:
        if a.config is None:
            config, name = LLADA_8B, "LLaDA-8B-Instruct"
        else:
            config, name = json.loads(Path(a.config).read_text()), a.config
        result = estimate(config, a.noise_dim, name)
    except (OSError, json.JSONDecodeError, CheckpointError) as e:
        print(f"error: --config {a.config}: {e}", file=sys.stderr)
        return 2
    print(json.dumps(result, indent=1))
    write_json(a.json, result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
