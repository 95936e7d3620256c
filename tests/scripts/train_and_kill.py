"""Run by tests/test_trainer.py: train from a JSON TrainConfig and SIGKILL this process right after update KILL_AT
(a real crash: no cleanup, no final save), so the test can resume from the last complete checkpoint.

    python tests/scripts/train_and_kill.py CONFIG.json KILL_AT
"""

import os
import signal
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from train_common import corpus, letters

from dsl_llada.train.train_config import TrainConfig
from dsl_llada.train.trainer import train


def main() -> None:
    config = TrainConfig.load(sys.argv[1])
    kill_at = int(sys.argv[2])

    def on_step(step: int, record: dict) -> None:
        if step == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)

    train(config, tokenizer=letters, texts=corpus(), on_step=on_step)
    raise SystemExit("not killed")


if __name__ == "__main__":
    main()
