"""Low memory: int8 weight-only quantization of the backbone (torchao) and a memory estimate per configuration.

`quantize_backbone(model, "int8")` replaces the weight of every `nn.Linear` of the backbone (attention and MLP
projections, the output head) by an int8 tensor with one scale per output row (torchao's `Int8WeightOnlyConfig`);
activations stay in the model's dtype, the input embedding (a lookup), the norms and the DSL converter (its value
map W feeds the backbone, its (V+1)-way softmax is fp32) are not quantized. Opt-in (`--quantize int8`): it halves
a bf16 backbone's weight memory at a measured quality cost (docs/benchmarks/precision-memory.md) and is usually not faster on a CPU.

`memory_estimate(config, ...)` counts the bytes of weights a loaded model holds for a LLaDA config (no weights are
read), used by `dsl-llada convert --dry-run`.
"""

from __future__ import annotations

import logging
from typing import Any

from torch import nn

__all__ = ["QUANTIZE_CHOICES", "QuantizationUnavailable", "memory_estimate", "quantize_backbone"]

log = logging.getLogger(__name__)

QUANTIZE_CHOICES = ("none", "int8")


class QuantizationUnavailable(ValueError):
    """The quantization library is not installed (or cannot run here)."""


def _int8_config() -> Any:
    import warnings

    # torchao's import logs a warning per CUDA kernel library it cannot load on a CPU-only torch; none is used here
    quiet = [logging.getLogger(n) for n in ("torchao", "torch.utils._pytree")]
    levels = [lg.level for lg in quiet]
    try:
        for lg in quiet:
            lg.setLevel(logging.ERROR)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            from torchao.quantization import Int8WeightOnlyConfig, quantize_
    except ImportError as e:
        raise QuantizationUnavailable(f"--quantize int8 needs torchao (pip install 'dsl-llada[quantize]' or pip "
                                      f"install torchao): {e}") from None
    finally:
        for lg, level in zip(quiet, levels):
            lg.setLevel(level)
    return quantize_, Int8WeightOnlyConfig()


def quantize_backbone(model: nn.Module, mode: str) -> nn.Module:
    """Quantize the backbone of `model` (a DSLModel or a bare backbone) in place; returns it. `mode` is one of
    QUANTIZE_CHOICES ('none' leaves it unchanged)."""
    if mode not in QUANTIZE_CHOICES:
        raise ValueError(f"quantize={mode!r} is not valid; expected one of {list(QUANTIZE_CHOICES)}")
    if mode == "none":
        return model
    backbone = getattr(model, "backbone", model)
    quantize_, config = _int8_config()
    linears = [name for name, m in backbone.named_modules() if isinstance(m, nn.Linear)]
    if not linears:
        raise ValueError(f"{type(backbone).__name__} has no nn.Linear layers to quantize")
    quantize_(backbone, config, filter_fn=lambda m, _name: isinstance(m, nn.Linear))
    log.info("int8 weight-only quantization of %d linear layers of %s", len(linears), type(backbone).__name__)
    return model


_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


def memory_estimate(cfg: Any, *, noise_dim: int = 100, dtype: str = "bfloat16", quantize: str = "none") -> dict[str, Any]:
    """Bytes of weights a loaded DSL model holds for the LLaDA config `cfg` (a `LLaDAConfig`): the backbone's
    linear layers (int8 + one fp32 scale per output row when quantized), its input embedding and norms, the DSL
    converter's value map W (V+1, H) and bias in `dtype`, the fp32 noise table E (V, d) and logit bias. Activations,
    the (chunk, V+1) converter buffer and a KV cache come on top (they depend on batch and length)."""
    if dtype not in _BYTES:
        raise ValueError(f"dtype={dtype!r} is not valid; expected one of {sorted(_BYTES)}")
    if quantize not in QUANTIZE_CHOICES:
        raise ValueError(f"quantize={quantize!r} is not valid; expected one of {list(QUANTIZE_CHOICES)}")
    d, V, L = cfg.d_model, cfg.vocab_size, cfg.n_layers
    n_kv = cfg.n_kv_heads or cfg.n_heads
    kv = n_kv * (d // cfg.n_heads)
    f = cfg.ffn_hidden
    rows_cols = [(d, d), (kv, d), (kv, d), (d, d), (f, d), (f, d), (d, f)]  # q, k, v, out, ff_proj, up, ff_out
    linear_params = L * sum(r * c for r, c in rows_cols) + (0 if cfg.weight_tying else V * d)
    linear_rows = L * sum(r for r, _ in rows_cols) + (0 if cfg.weight_tying else V)
    b = _BYTES[dtype]
    linear = linear_params + 4 * linear_rows if quantize == "int8" else linear_params * b
    other_backbone = (V * d + (2 * L + 1) * d) * b  # input embedding, norms
    converter = ((V + 1) * d + d) * b + 4 * (V + 1) + 4 + 4 * V * noise_dim
    total = linear + other_backbone + converter
    gib = 1024 ** 3
    return {"dtype": dtype, "quantize": quantize, "backbone_linear_gib": linear / gib,
            "backbone_other_gib": other_backbone / gib, "dsl_converter_and_noise_gib": converter / gib,
            "total_gib": total / gib, "parameters": linear_params + V * d + (2 * L + 1) * d + (V + 1) * d + d
            + (V + 1) + 1 + V * noise_dim}
