"""Launched twice-parallel by tests/test_train_multiproc.py, e.g.

    ACCELERATE_USE_CPU=true accelerate launch --multi_gpu --num_processes 2 --main_process_port P \
        tests/scripts/ddp_train.py BACKBONE_DIR OUT_DIR OBJECTIVE [none|fsdp2]
    torchrun --nproc_per_node 2 --master_port P tests/scripts/ddp_train.py BACKBONE_DIR OUT_DIR dsl fsdp2

Trains `train_common.multiproc_config` (STEPS env var updates; resume='auto') with the content-seeded objective and
writes OUT_DIR/rank-{r}-{STEPS}.json: this call's losses and a checksum of the full parameters as this process sees
them (gathered when sharded). Asserts two processes: `accelerate launch --cpu --num_processes 2` silently starts one.
"""

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from train_common import ContentSeededObjective, corpus, letters, multiproc_config, param_checksum, write_json

from dsl_llada.train.trainer import train


def main() -> None:
    backbone, out, objective = sys.argv[1], Path(sys.argv[2]), sys.argv[3]
    sharding = sys.argv[4] if len(sys.argv) > 4 else "none"
    assert int(os.environ.get("WORLD_SIZE", "1")) == 2, f"expected 2 processes, WORLD_SIZE={os.environ.get('WORLD_SIZE')}"
    steps = int(os.environ.get("STEPS", "5"))
    cfg = multiproc_config(objective, backbone, out / "run", world_size=2, steps=steps, sharding=sharding)
    result = train(cfg, tokenizer=letters, texts=corpus(40), objective=ContentSeededObjective(objective))
    assert result.world_size == 2
    write_json(out / f"rank-{os.environ['RANK']}-{steps}.json",
               {"losses": {str(k): v for k, v in sorted(result.losses.items())}, "checksum": param_checksum(result.model),
                "start_step": result.start_step, "final_model": str(result.final_model),
                "evals": {str(k): v for k, v in result.evals.items()}})


if __name__ == "__main__":
    main()
