"""Where a model comes from and how it is opened: one settings dataclass, `ModelSource`, that every entry point
shares (`generate`, `serve`, `ui`, an evaluation's `models` entries, `lm-eval`'s model_args and the library), so
each offers the same options under the same names. Its command-line flags are generated from its fields
(`cli.flags.add_model_source_args`); `loading.open_model(source)` turns it into a loaded model handle.

    dsl-llada generate --model CKPT --assume-released ...     # a flag
    models: [{name: m, path: CKPT, assume_released: true}]     # an evaluation config entry
    lm_eval --model dsl-llada --model_args model_dir=CKPT,assume_released=true
    open_model(ModelSource(path="CKPT", assume_released=True)) # the library
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

from ..config import ConfigBase, _check
from ..runtime.environment import MAX_THREADS

__all__ = ["DTYPE_NAMES", "MODEL_FLAGS", "ModelSource"]

DTypeName = Literal["auto", "bf16", "bfloat16", "float16", "float32", "fp16", "fp32"]
DTYPE_NAMES: tuple[str, ...] = get_args(DTypeName)
"""What `dtype` accepts: 'auto' or an explicit name (`loading.DTYPES`)."""

@dataclass(frozen=True)
class ModelSource(ConfigBase):
    """A model to open: its folder, tokenizer, device, precision and the explicit opt-ins a checkpoint may need."""

    path: str | None = None
    """Checkpoint folder (a DSL checkpoint or a bare backbone), or a Hugging Face hub id with allow_download."""
    tokenizer: str | None = None
    """Tokenizer folder (default: the model folder). It must be the model's: one with more tokens than the model's
    vocabulary, or whose mask, eos, end-of-turn or pad id differs from the model's, is refused at load."""
    device: str | None = None
    """cpu, cuda or cuda:N (default: cuda when available)."""
    dtype: DTypeName = "auto"
    """auto / float32 / bfloat16 / float16 (auto: bf16 on a GPU and on a CPU with native bf16 (AMX / AVX512-BF16),
    else fp32; the converter softmax, posterior and SDE state stay fp32)."""
    quantize: Literal["none", "int8"] = "none"
    """int8: weight-only int8 backbone linear layers via torchao (about half a bf16 backbone's weight memory;
    measured quality cost in docs/benchmarks/precision-memory.md; needs dsl-llada[quantize])."""
    assume_released: bool = False
    """A DSL checkpoint without dsl_config.json is the released DSL-LLaDA layout (settings inferred:
    context_embedding='wte', frozen noise embedding); without it such a checkpoint is refused."""
    allow_download: bool = False
    """Allow fetching the model from the Hugging Face hub when path is not a local folder."""
    threads: int | None = None
    """torch intra-op threads (default: the CPUs this process may use, from its affinity and cgroup quota)."""

    def __post_init__(self) -> None:
        _check(self.path is None or (isinstance(self.path, str) and self.path != ""),
               f"model path={self.path!r} must be a folder name")
        _check(self.tokenizer is None or (isinstance(self.tokenizer, str) and self.tokenizer != ""),
               f"tokenizer={self.tokenizer!r} must be a folder name")
        _check(self.dtype in DTYPE_NAMES, f"dtype={self.dtype!r} is not valid; expected one of {list(DTYPE_NAMES)}")
        _check(self.quantize in ("none", "int8"), f"quantize={self.quantize!r} is not valid; expected 'none' or 'int8'")
        for name in ("assume_released", "allow_download"):
            _check(isinstance(getattr(self, name), bool), f"{name}={getattr(self, name)!r} must be true or false")
        _check(self.threads is None or (isinstance(self.threads, int) and not isinstance(self.threads, bool)
                                        and 1 <= self.threads <= MAX_THREADS),
               f"threads={self.threads!r} must be an integer from 1 to {MAX_THREADS}")

    @property
    def tokenizer_path(self) -> str | None:
        """The tokenizer folder: `tokenizer`, else the model folder."""
        return self.tokenizer or self.path


MODEL_FLAGS = {"path": "--model"}
"""Fields whose flag is not their own name (the model folder is `--model` on every command)."""
