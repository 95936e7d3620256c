"""Mask calibration / ECE, reliability diagram, context robustness and the converter phase table."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from helpers import MASK, V, perturb_converter, tiny_backbone, tiny_dsl

from dsl_llada.eval import forward_probes as P


class _Special:
    mask, eos, eot, pad, bos = MASK, V - 2, None, V - 2, None


class Oracle(torch.nn.Module):
    """Puts logit ln(3(V-1)) on the original token of each known text (found by length), 0 elsewhere:
    every prediction is correct with confidence exactly 3(V-1) / (3(V-1) + V-1) = 0.75."""

    special = _Special()
    vocab_size = V

    def __init__(self, texts):
        super().__init__()
        self.by_len = {len(t): t for t in texts}
        self.inputs = []

    def logits_from_ids(self, ids, attention_mask=None):
        self.inputs.append(ids.clone())
        out = torch.zeros(*ids.shape, V)
        for b in range(ids.shape[0]):
            n = int(attention_mask[b].sum()) if attention_mask is not None else ids.shape[1]
            gold = torch.tensor(self.by_len[n])
            out[b, torch.arange(n), gold] = math.log(3 * (V - 1))
        return out


def _texts(n=5, base=24):
    return [[(5 * i + 7 * j) % 60 for j in range(base + 4 * i)] for i in range(n)]


def test_mask_calibration_oracle_hand_values():
    texts = _texts()
    m = Oracle(texts)
    recs = P.mask_calibration_records(m, None, texts, mask_rate=0.3, seed=42, batch_size=2)
    assert [len(r["positions"]) for r in recs] == [max(1, math.floor(len(t) * 0.3)) for t in texts]
    assert all(c == pytest.approx(0.75) for r in recs for c in r["confidence"])
    s = P.calibration_summary(recs)
    assert s["accuracy"] == 1.0 and s["ece"] == pytest.approx(0.25)
    assert s["n_tokens"] == sum(len(r["positions"]) for r in recs)
    assert sum(b["count"] for b in s["bins"]) == s["n_tokens"] and len(s["bins"]) == 15
    # the masked positions really were the MASK id, the rest untouched; positions follow default_rng(42 + id)
    for r in recs:
        assert r["positions"] == sorted(np.random.default_rng(42 + r["text_id"]).choice(
            r["n_tokens"], size=len(r["positions"]), replace=False).tolist())
    m1 = Oracle(texts)
    recs1 = P.mask_calibration_records(m1, None, texts, mask_rate=0.3, seed=42, batch_size=1)
    assert [r["positions"] for r in recs1] == [r["positions"] for r in recs]
    fed = {int(x.shape[1]): x[0].tolist() for x in m1.inputs}
    for r, t in zip(recs1, texts):
        f = fed[len(t)]
        assert [i for i, x in enumerate(f) if x == MASK] == r["positions"]
        assert all(f[i] == t[i] for i in range(len(t)) if i not in r["positions"])


def test_calibration_summary_hand_values():
    recs = [{"confidence": [0.2, 0.4], "correct": [0, 1]}, {"confidence": [0.6, 0.9], "correct": [1, 1]}]
    s = P.calibration_summary(recs, bins=2)
    assert s["ece"] == pytest.approx(0.225) and s["accuracy"] == pytest.approx(0.75)
    assert [b["count"] for b in s["bins"]] == [2, 2]
    assert s["bins"][0]["acc"] == pytest.approx(0.5) and s["bins"][1]["conf"] == pytest.approx(0.75)
    out = P.calibration_summary([{"confidence": [0.2, 0.4, 0.6, 0.9, 1.5], "correct": [0, 1, 1, 1, 1]}],
                                bins=2, mode="authors")
    assert out["ece"] == pytest.approx(0.18)
    with pytest.raises(ValueError):
        P.calibration_summary([])


def test_reliability_diagram_png(tmp_path):
    s = P.calibration_summary([{"confidence": [0.2, 0.4, 0.6, 0.9], "correct": [0, 1, 1, 1]}], bins=4)
    out = P.reliability_diagram(s, tmp_path / "sub" / "rel.png")
    data = out.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 2000
    assert sorted(p.name for p in out.parent.iterdir()) == ["rel.png"]  # no temp file left behind


def test_mask_calibration_batch_invariance_and_seed_twin():
    model = tiny_backbone(seed=2)
    texts = _texts(4)
    a = P.mask_calibration_records(model, None, texts, mask_rate=0.5, seed=0, batch_size=1)
    b = P.mask_calibration_records(model, None, texts, mask_rate=0.5, seed=0, batch_size=3)
    assert [r["pred"] for r in a] == [r["pred"] for r in b]
    assert [r["confidence"] for r in a] == [pytest.approx(r["confidence"], abs=1e-5) for r in b]
    c = P.mask_calibration_records(model, None, texts, mask_rate=0.5, seed=1, batch_size=3)
    assert [r["positions"] for r in a] != [r["positions"] for r in c]
    dsl = perturb_converter(tiny_dsl(seed=2))
    conv = P.mask_calibration_records(dsl, None, texts, mask_rate=0.5, seed=0, path="converter")
    disc = P.mask_calibration_records(dsl, None, texts, mask_rate=0.5, seed=0, path="discrete")
    assert [r["positions"] for r in conv] == [r["positions"] for r in disc]
    assert [r["confidence"] for r in conv] != [r["confidence"] for r in disc]
    with pytest.raises(ValueError, match="path"):
        P.mask_calibration_records(model, None, texts, mask_rate=0.5, path="converter")


def test_context_robustness_counts_and_oracle():
    texts = _texts(3)
    m = Oracle(texts)
    recs = P.context_robustness_records(m, None, texts, seed=0, batch_size=1)
    assert len(recs) == 3 * 5
    summ = P.context_robustness_summary(recs)
    assert [s["corrupt_pct"] for s in summ] == [0, 10, 20, 30, 50] and all(s["accuracy"] == 1.0 for s in summ)
    # inspect what was fed: the same masked positions at every c, exactly floor(|ctx| c / 100) context changes
    for t_i, t in enumerate(texts):
        fed = [x[0] for x in m.inputs if x.shape[1] == len(t)]
        assert len(fed) == 5
        masked = [set(torch.nonzero(f == MASK).flatten().tolist()) for f in fed]
        assert all(s == masked[0] for s in masked) and len(masked[0]) == math.floor(len(t) * 0.3)
        n_ctx = len(t) - len(masked[0])
        for c, f in zip((0, 10, 20, 30, 50), fed):
            changed = sum(int(f[i]) != t[i] for i in range(len(t)) if i not in masked[0])
            assert changed == math.floor(n_ctx * c / 100)
            assert all(int(f[i]) not in (MASK, V - 2) for i in range(len(t)) if i not in masked[0])
    short = P.context_robustness_records(m, None, [[1, 2, 3]], seed=0)
    assert short == []  # fewer than 20 tokens: skipped


def test_context_robustness_tiny_model_seed_twin():
    model = tiny_backbone(seed=5)
    texts = _texts(3)
    a = P.context_robustness_records(model, None, texts, seed=0, corrupt_pcts=(0, 50))
    b = P.context_robustness_records(model, None, texts, seed=0, corrupt_pcts=(0, 50), batch_size=2)
    c = P.context_robustness_records(model, None, texts, seed=1, corrupt_pcts=(0, 50))
    assert a == b
    assert [r["n_correct"] for r in a] != [r["n_correct"] for r in c] or a != c
    with pytest.raises(ValueError, match="corrupt_pcts"):
        P.context_robustness_records(model, None, texts, corrupt_pcts=(120,))


def test_converter_phase_table_phases():
    model = tiny_dsl(seed=0, beta_init=1.0)
    rows = P.converter_phase_table(model, [5, 17], snrs=(0.01, 1e4), n_seeds=6, seed=0)
    assert len(rows) == 4
    low = [r for r in rows if r["snr"] == 0.01]
    high = [r for r in rows if r["snr"] == 1e4]
    # near-zero SNR: the mask slot (logit bias ln V) wins for every seed; very high SNR: the gold token
    assert all(r["top1"] == "[MASK]" and r["mask_top1"] == 6 and r["hit"] == 0 for r in low)
    assert all(r["hit"] == 6 and r["top1"] == str(r["token_id"]) and r["gold_cos"] > 0.99 for r in high)
    assert all(r["gold_cos"] < h["gold_cos"] for r, h in zip(low, high))
    again = P.converter_phase_table(model, [5], snrs=(8.0,), n_seeds=6, seed=0)
    twin = P.converter_phase_table(model, [5], snrs=(8.0,), n_seeds=6, seed=1)
    assert again == P.converter_phase_table(model, [5], snrs=(8.0,), n_seeds=6, seed=0)
    assert again[0]["gold_cos"] != twin[0]["gold_cos"]
    with pytest.raises(ValueError, match="outside the vocabulary"):
        P.converter_phase_table(model, [V + 3])
    with pytest.raises(ValueError, match="needs a DSL model"):
        P.converter_phase_table(tiny_backbone(), [1])
