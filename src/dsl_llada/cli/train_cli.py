"""`dsl-llada train` (also `python -m dsl_llada.train`): argument parsing into `train_command.run_train(TrainSettings)`
(no training logic here). The main CLI registers the toy world's training source before `cmd_train` runs.

    dsl-llada train --config configs/paper-8b.yaml init_from=/models/LLaDA-8B-Instruct output_dir=runs/dsl
    accelerate launch --config_file configs/deepspeed_zero2.yaml -m dsl_llada train --config configs/paper-8b.yaml ...
"""

from __future__ import annotations

import argparse
import logging

__all__ = ["INTERRUPTED", "add_train_arguments", "add_train_parser", "cmd_train"]

EPILOG = """\
overrides are dotted TrainConfig keys, e.g.
  lr=1e-4 max_steps=200 data.block_size=64 objective=mdm objective_options.snr.lognormal_per_token=true
  data.files='[corpus/*.jsonl]' resume=null converter_lr_mode=grad_hook freeze_noise_embed=true

multi-process (one process per GPU; the script asserts world_size when it is set):
  accelerate launch --config_file configs/ddp.yaml -m dsl_llada train --config ...
  accelerate launch --config_file configs/deepspeed_zero2.yaml -m dsl_llada train --config configs/paper-8b.yaml ...
  accelerate launch --config_file configs/fsdp.yaml -m dsl_llada train --config ...
exit codes: 0 done, 2 bad configuration or data (or output_dir in use by another run),
  3 training diverged (non-finite loss; last good checkpoint kept)
"""

INTERRUPTED = "interrupted; the last complete checkpoint is kept (resume='auto' continues from it)"
"""What Ctrl-C during a run prints."""


def add_train_arguments(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    p.add_argument("--config", "-c", default=None, metavar="FILE",
                   help="training preset (YAML/JSON TrainConfig), e.g. configs/paper-8b.yaml or configs/toy.yaml")
    p.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="dotted TrainConfig overrides (see below)")
    p.add_argument("--print-config", action="store_true", help="print the resolved TrainConfig as JSON and exit")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    p.add_argument("--overwrite", action="store_true",
                   help="resume=CHECKPOINT older than output_dir's newest checkpoint: discard the later checkpoints "
                        "(without it such a resume is refused; branch into a new output_dir instead)")
    p.set_defaults(func=cmd_train, interrupted=INTERRUPTED)
    return p


def add_train_parser(subparsers) -> argparse.ArgumentParser:
    """Register `train` on the main `dsl-llada` CLI's subparsers."""
    p = subparsers.add_parser("train", help="continued pretraining: DSL, or the MDM-CPT / XDLM controls",
                              description="Train with a YAML/JSON preset plus dotted key=value overrides.",
                              epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    return add_train_arguments(p)


def cmd_train(args: argparse.Namespace) -> int:
    """Parse the preset and overrides into TrainSettings and run the library's `run_train`."""
    from ..train.train_command import TrainSettings, os_rank, run_train
    from ..train.train_config import load_train_config

    if os_rank() != 0:  # one process logs the run
        logging.getLogger().setLevel(logging.WARNING)
    config = load_train_config(args.config, args.overrides)
    if getattr(args, "quiet", False):
        config = config.replace(progress=False)
    if args.print_config:
        print(config.to_json())
        return 0
    return run_train(TrainSettings(config, overwrite=args.overwrite))

