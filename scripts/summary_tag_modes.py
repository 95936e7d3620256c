"""How often the default and authors summary failure tags differ on the shipped reference summaries (each
reference scored as if it were a model output, against itself), and the ROUGE aggregate difference between
the two modes on reference-vs-first-sentence-of-source pairs.

Usage: python scripts/summary_tag_modes.py DATA_DIR   (the evaluation data folder)
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from dsl_llada.eval import metrics as M

FILES = {"XSum": "summ_xsum.jsonl", "CNN/DM": "summ_cnndm.jsonl", "PubMed": "summ_pubmed.jsonl",
         "arXiv": "summ_arxiv.jsonl"}


def main() -> None:
    if len(sys.argv) != 2 or not Path(sys.argv[1]).is_dir():
        sys.exit(f"usage: python scripts/summary_tag_modes.py DATA_DIR (the evaluation data folder); got {sys.argv[1:]}")
    data = Path(sys.argv[1])
    print("| dataset | n | tag | default % | authors % | samples that differ |")
    print("|---|---|---|---|---|---|")
    for name, f in FILES.items():
        rows = [json.loads(x) for x in (data / f).read_text(encoding="utf-8").splitlines() if x.strip()]
        refs = [r["reference"] for r in rows]
        d = [M.summary_failure_tags(t, reference=t).as_dict() for t in refs]
        a = [M.summary_failure_tags(t, "authors", reference=t).as_dict() for t in refs]
        for tag in ("premature_eos", "repetition", "degen_ending"):
            nd, na = sum(x[tag] for x in d), sum(x[tag] for x in a)
            diff = sum(x[tag] != y[tag] for x, y in zip(d, a))
            print(f"| {name} | {len(refs)} | {tag} | {100 * nd / len(refs):.1f} | {100 * na / len(refs):.1f} | {diff} |")
    print()
    print("| dataset | ROUGE-1 default | ROUGE-1 authors | ROUGE-L default | ROUGE-L authors |")
    print("|---|---|---|---|---|")
    for name, f in FILES.items():
        rows = [json.loads(x) for x in (data / f).read_text(encoding="utf-8").splitlines() if x.strip()]
        # a weak 'system': the first 40 words of the prompt's document
        preds = [" ".join(r["prompt"].split("\n\n", 1)[-1].split()[:40]) for r in rows]
        sc = M.rouge_scores(preds, [r["reference"] for r in rows])
        d, a = M.rouge_aggregate(sc), M.rouge_aggregate(sc, mode="authors")
        print(f"| {name} | {d['rouge1']:.4f} | {a['rouge1']:.4f} | {d['rougeL']:.4f} | {a['rougeL']:.4f} |")


if __name__ == "__main__":
    main()
