"""`dsl-llada convert` as a library call: `run_convert(ConvertSettings(...))` makes a fresh DSL checkpoint from a
backbone folder (or, with `dry_run`, prints the weight memory it would need and writes nothing):

    from dsl_llada.core.convert_command import ConvertSettings, run_convert
    from dsl_llada.config import ConverterConfig, DSLConfig
    run_convert(ConvertSettings("LLaDA-8B-Instruct", "dsl-ckpt", DSLConfig(converter=ConverterConfig(noise_dim=100))))

The command line only parses its flags into these settings (`cli.cmd_convert`).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import Any, cast
from pathlib import Path

from .backbones.base import Backbone
from ..config import DSLConfig
from ..errors import CheckpointError
from .loading import check_tokenizer_files, is_dsl_checkpoint, open_model, parse_dtype
from .model_source import DTypeName, ModelSource

__all__ = ["ConvertSettings", "memory_estimate_rows", "run_convert"]


@dataclass(frozen=True)
class ConvertSettings:
    """One `convert` job: the backbone folder, the new checkpoint's folder and its DSL config."""

    backbone: str
    """Backbone checkpoint folder (a Hugging Face hub id with `allow_download`)."""
    output: str | None = None
    """Output folder (new or empty; never the backbone folder or one containing it); None only with `dry_run`."""
    config: DSLConfig = field(default_factory=DSLConfig)
    """The converter and noise embedding of the new checkpoint (its dsl_config.json)."""
    dtype: str = "float32"
    """Dtype the backbone is loaded and the checkpoint saved in."""
    overwrite: bool = False
    """Replace a previous DSL checkpoint at `output` (a folder holding anything else is never deleted)."""
    allow_download: bool = False
    dry_run: bool = False
    """Write nothing: print the weight memory of the DSL model from the backbone's config.json alone."""

    def __post_init__(self) -> None:
        parse_dtype(self.dtype)  # one error naming the valid names, before any file is read


def run_convert(settings: ConvertSettings) -> int:
    """Run one convert job; returns the exit code (0). Bad settings or files raise before anything is written."""
    from .backbones import resolve_model_path

    backbone = str(resolve_model_path(settings.backbone, allow_download=settings.allow_download))
    if settings.dry_run:
        return print_memory_estimate(backbone, settings.config.converter.noise_dim, settings.dtype)
    if settings.output is None:
        raise ValueError("convert needs an OUTPUT folder (or --dry-run to only print the memory estimate)")
    _write_checkpoint(settings, backbone, settings.output)
    c = settings.config.converter
    print(f"wrote DSL checkpoint to {settings.output} (noise_dim={c.noise_dim}, beta_init={c.beta_init}, "
          f"layout={c.layout})")
    return 0


def _write_checkpoint(settings: ConvertSettings, backbone: str, output: str) -> None:
    """Lock and check `output`, load the backbone, convert it and save the checkpoint with its tokenizer files."""
    from ..artifacts.locks import output_lock
    from .model import DSLModel
    from ..artifacts.outputs import prepare_output_dir
    from ..artifacts.atomic import remove_stale_temp_folders

    with output_lock(output, what="output folder"):  # one writer per output, before anything is written
        # a symbolic link to a folder is judged and written as the folder it names (the link itself is kept)
        folder = prepare_output_dir(output, overwrite=settings.overwrite, sources=[backbone], kind="checkpoint")
        removed, kept = remove_stale_temp_folders(folder)
        for p in removed:
            print(f"note: removed {str(p)!r}, a temp folder left by an interrupted convert", file=sys.stderr)
        for p in kept:
            print(f"warning: {str(p)!r} looks like a temp folder of an interrupted convert but holds other files; "
                  f"left alone — remove it yourself", file=sys.stderr)
        check_tokenizer_files(backbone)  # copied into the checkpoint below: never copy a damaged file
        if is_dsl_checkpoint(backbone):
            raise CheckpointError(f"{backbone!r} is already a DSL checkpoint (it has a noise embedding); convert "
                                  f"makes one from a backbone folder")
        source = ModelSource(path=backbone, device="cpu", dtype=cast(DTypeName, settings.dtype))
        loaded = open_model(source, chat_template=False, backbone_only=True, tokenizer_optional=True).model
        assert isinstance(loaded, Backbone)
        model = DSLModel.convert(loaded, settings.config)
        model.save_pretrained(folder, tokenizer_from=backbone)  # every tokenizer file, the chat template included


DRY_RUN_ROWS = (("float32", "none"), ("bfloat16", "none"), ("bfloat16", "int8"))
"""The (dtype, quantize) rows `convert --dry-run` prints: fp32, bf16, and bf16 with an int8 backbone."""


def memory_estimate_rows(cfg: Any, noise_dim: int) -> list[dict[str, Any]]:
    """`convert --dry-run`'s rows for a `LLaDAConfig`: `quantize.memory_estimate` at each of `DRY_RUN_ROWS`."""
    from .quantize import memory_estimate

    return [memory_estimate(cfg, noise_dim=noise_dim, dtype=dt, quantize=q) for dt, q in DRY_RUN_ROWS]


def print_memory_estimate(backbone: str, noise_dim: int, dtype: str) -> int:
    """`convert --dry-run`: the DSL model's weight memory in fp32, bf16 and bf16 + int8 backbone, from the LLaDA
    backbone's config.json alone (nothing is loaded or written); returns 0."""
    from .backbones.llada import LLaDAConfig
    from .checkpoint import read_json

    data = read_json(Path(backbone) / "config.json", "backbone config")
    if data.get("model_type", "llada") != "llada":
        raise ValueError(f"--dry-run estimates LLaDA-architecture backbones (model_type 'llada'); {backbone} has "
                         f"model_type={data.get('model_type')!r}")
    cfg = LLaDAConfig.from_hf_dict(data, where=str(Path(backbone) / "config.json"))
    rows = memory_estimate_rows(cfg, noise_dim)
    print(f"DSL model from {backbone}: d_model {cfg.d_model}, {cfg.n_layers} layers, vocabulary {cfg.vocab_size}, "
          f"noise dim {noise_dim}: {rows[0]['parameters'] / 1e9:.2f} B parameters (nothing written)")
    print("| weights | backbone linear GiB | embedding + norms GiB | converter + noise table GiB | total GiB |")
    print("|---|---|---|---|---|")
    for r in rows:
        name = r["dtype"] + (" + int8 backbone (--quantize int8)" if r["quantize"] == "int8" else "")
        print(f"| {name} | {r['backbone_linear_gib']:.2f} | {r['backbone_other_gib']:.2f} | "
              f"{r['dsl_converter_and_noise_gib']:.2f} | {r['total_gib']:.2f} |")
    print("Weights only: activations, the converter's (256, V+1) fp32 buffer and logits come on top; the checkpoint "
          f"on disk is written in --dtype ({dtype}).")
    return 0
