"""Build the tiny local model and task of the lm-eval worked example in docs/evaluation.md.

    python scripts/lmeval_tiny_example.py OUT --data DATA_DIR

writes OUT/model (a BPE tokenizer trained on the GSM8K-100 questions + a randomly initialised 2-layer
LLaDA-architecture backbone over it, seed 0) and OUT/tasks/gsm_local.yaml (a local lm-eval generation task over
DATA/gsm8k_100.jsonl, scored with exact_match). Everything is offline and deterministic; the model is untrained,
so expect an accuracy of 0 — the point is the plumbing, not the number.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

TASK = """task: gsm_local
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: generate_until
doc_to_text: "Question: {{{{question}}}}\\nAnswer:"
doc_to_target: "{{{{gold_answer}}}}"
generation_kwargs:
  until: ["\\n\\n", "Question:"]
  max_gen_toks: 8
metric_list:
  - metric: exact_match
    aggregation: mean
    higher_is_better: true
"""


def build(out: str | Path, data_dir: str | Path) -> dict[str, Path]:
    """Write the tiny model folder and the task folder; returns {'model': ..., 'tasks': ...}."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    from dsl_llada.core.backbones import LLaDABackbone, save_backbone, tiny_llada_config
    from dsl_llada.core.backbones.base import SpecialTokens

    out, data = Path(out), Path(data_dir) / "gsm8k_100.jsonl"
    if not data.is_file():
        raise SystemExit(f"error: {data} does not exist (give --data the folder holding gsm8k_100.jsonl)")
    texts = [json.loads(line)["question"] for line in data.read_text(encoding="utf-8").splitlines() if line.strip()]
    specials = ["<|eot_id|>", "<|endoftext|>", "<|startoftext|>", "<|mdm_mask|>"]
    tk = Tokenizer(models.BPE(unk_token=None))
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    tk.train_from_iterator(texts, trainers.BpeTrainer(vocab_size=400, special_tokens=specials, show_progress=False,
                                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, eos_token="<|endoftext|>", bos_token="<|startoftext|>",
                                  mask_token="<|mdm_mask|>", pad_token="<|endoftext|>")
    ids = {s: tk.token_to_id(s) for s in specials}
    cfg = tiny_llada_config(tk.get_vocab_size(), mask_token_id=ids["<|mdm_mask|>"], eos_token_id=ids["<|endoftext|>"],
                            eot_token_id=ids["<|eot_id|>"], bos_token_id=ids["<|startoftext|>"],
                            max_sequence_length=256)
    special = SpecialTokens(mask=ids["<|mdm_mask|>"], eos=ids["<|endoftext|>"], eot=ids["<|eot_id|>"],
                            pad=ids["<|endoftext|>"], bos=ids["<|startoftext|>"])
    bb = LLaDABackbone(cfg, special)
    bb.init_weights(torch.Generator().manual_seed(0), std=0.3)
    save_backbone(bb, out / "model")
    tok.save_pretrained(str(out / "model"))
    (out / "tasks").mkdir(parents=True, exist_ok=True)
    (out / "tasks" / "gsm_local.yaml").write_text(TASK.format(data=data.resolve()), encoding="utf-8")
    return {"model": out / "model", "tasks": out / "tasks"}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out", help="output folder (model/ and tasks/ are written into it)")
    p.add_argument("--data", required=True, help="the evaluation data folder (it must hold gsm8k_100.jsonl)")
    a = p.parse_args()
    paths = build(a.out, a.data)
    print(json.dumps({k: str(v) for k, v in paths.items()}))


if __name__ == "__main__":
    main()
