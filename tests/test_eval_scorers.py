"""GenPPL (CausalLMScorer) and BERTScore scorers: exact values on tiny random models, batching, caching, errors."""

from __future__ import annotations

import json
import math
import time

import pytest
import torch

from dsl_llada.eval.scorers.genppl import CausalLMScorer, ScorerError, gen_ppl

WORDS = [f"w{i}" for i in range(40)]


def _word_tokenizer():
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"[UNK]": 0, "<s>": 1, **{w: i + 2 for i, w in enumerate(WORDS)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", bos_token="<s>")


@pytest.fixture(scope="module")
def tiny_lm_dir(tmp_path_factory):
    """A randomly initialised 2-layer Llama causal LM + a one-token-per-word tokenizer, saved as a folder."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=len(WORDS) + 2, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=256,
                      bos_token_id=1, eos_token_id=1, pad_token_id=0)
    model = LlamaForCausalLM(cfg)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.5)  # larger than the default init so per-token NLLs differ clearly
    d = tmp_path_factory.mktemp("tiny_llama")
    model.save_pretrained(d)
    _word_tokenizer().save_pretrained(d)
    return d


@pytest.fixture(scope="module")
def loaded(tiny_lm_dir):
    """One loaded scorer; `mk(**kw)` makes more around the same model/tokenizer without reloading from disk."""
    base = CausalLMScorer(tiny_lm_dir)

    def mk(**kw):
        return CausalLMScorer(tiny_lm_dir, model=base.model, tokenizer=base.tokenizer, **kw)
    return mk


def _manual_nll(model, ids: list[int]) -> float:
    with torch.no_grad():
        logp = torch.log_softmax(model(input_ids=torch.tensor([ids])).logits[0].double(), -1)
    return -sum(float(logp[t, ids[t + 1]]) for t in range(len(ids) - 1))


def test_exact_ppl_matches_manual(tiny_lm_dir):
    sc = CausalLMScorer(tiny_lm_dir, batch_size=4)
    text = "w3 w1 w4 w1 w5 w9 w2"
    ids = [WORDS.index(w) + 2 for w in text.split()]
    want = _manual_nll(sc.model, ids)
    (s, n), = sc.nll([text])
    assert n == 6 and s == pytest.approx(want, rel=1e-5)
    assert sc.perplexities([text])[0] == pytest.approx(math.exp(want / 6), rel=1e-5)
    # whitespace is normalised before scoring ("first 128 words re-joined with single spaces")
    assert sc.nll(["  w3\tw1  w4 w1\nw5 w9 w2 "])[0][0] == pytest.approx(s, rel=1e-6)


def test_bos_option_scores_every_token(loaded):
    sc = loaded(add_bos=True)
    ids = [1] + [WORDS.index(w) + 2 for w in ["w3", "w1", "w4"]]
    (s, n), = sc.nll(["w3 w1 w4"])
    assert n == 3 and s == pytest.approx(_manual_nll(sc.model, ids), rel=1e-5)


def test_batch_size_invariance_and_padding(loaded):
    texts = [" ".join(WORDS[(3 * i) % 40 : (3 * i) % 40 + 2 + 5 * i]) for i in range(7)] + ["w1"]
    ref = loaded(batch_size=1).nll(texts)
    for bs in (2, 3, 16):
        got = loaded(batch_size=bs).nll(texts)
        assert [n for _, n in got] == [n for _, n in ref]
        assert [s for s, _ in got] == pytest.approx([s for s, _ in ref], rel=1e-5, abs=1e-6)
    assert ref[-1] == (0.0, 0)  # one token: nothing to score
    assert math.isnan(loaded().perplexities(["w1"])[0])


def test_truncation_to_max_words_and_tokens(loaded):
    text = " ".join(WORDS[i % 40] for i in range(200))
    assert loaded().nll([text])[0][1] == 127          # 128 words -> 127 scored tokens
    assert loaded(max_words=None, max_length=50).nll([text])[0][1] == 49
    assert loaded(max_words=10).prepare("a  b\nc") == "a b c"


def test_cache_one_forward_per_unique_text(loaded, tmp_path):
    cache = tmp_path / "ppl.jsonl"
    sc = loaded(batch_size=2, cache_path=cache)
    texts = ["w1 w2 w3", "w4 w5", "w1 w2 w3", "w6 w7 w8 w9"]
    first = sc.nll(texts)
    assert sc.forward_calls == 2          # 3 unique texts in batches of 2
    assert first[0] == first[2]
    assert sc.nll(list(reversed(texts))) == list(reversed(first))
    assert sc.forward_calls == 2          # all cache hits: no second forward
    lines = cache.read_text().splitlines()
    assert len(lines) == 1 + 3 and json.loads(lines[0])["max_words"] == 128
    # a fresh scorer reads the file: no forward at all
    sc2 = loaded(cache_path=cache)
    assert sc2.nll(texts) == first and sc2.forward_calls == 0
    # a torn last line (killed run) is ignored, later appends still parse
    with cache.open("a") as f:
        f.write('{"sha256": "abc", "nll_')
    sc3 = loaded(cache_path=cache)
    sc3.nll(["w10 w11"])
    assert sc3.forward_calls == 1
    assert loaded(cache_path=cache).nll(["w10 w11"]) == sc3.nll(["w10 w11"])
    # other settings never mix with this cache
    with pytest.raises(ScorerError, match=r"other settings.*max_words"):
        loaded(cache_path=cache, max_words=64)


def test_scorer_folder_errors(tmp_path):
    with pytest.raises(ScorerError, match="does not exist"):
        CausalLMScorer(tmp_path / "nope")
    with pytest.raises(ScorerError, match="no config.json"):
        CausalLMScorer(tmp_path)
    from transformers import BertConfig, BertModel

    enc = tmp_path / "bert"
    BertModel(BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                         intermediate_size=32)).save_pretrained(enc)
    with pytest.raises(ScorerError, match="not a causal LM"):  # found when the weights load (first text)
        CausalLMScorer(enc).nll(["a b c"])
    t5 = tmp_path / "t5"
    t5.mkdir()
    (t5 / "config.json").write_text(json.dumps({"model_type": "t5", "d_model": 8}))
    with pytest.raises(ScorerError, match="model_type 't5'"):
        CausalLMScorer(t5)


def test_gen_ppl_aggregate():
    nlls = [(6.0, 3), (0.0, 0), (1.0, 1)]
    assert gen_ppl(nlls) == pytest.approx(math.exp(7 / 4))                  # token-weighted
    assert gen_ppl(nlls, mode="authors") == pytest.approx(math.exp((2 + 1) / 2))  # mean of per-text means
    assert gen_ppl([(0.0, 0)]) is None
    with pytest.raises(ValueError, match="mode"):
        gen_ppl(nlls, mode="x")


@pytest.mark.slow
def test_smollm2_plain_english_vs_shuffled():
    pytest.importorskip("gguf")
    try:
        t0 = time.perf_counter()
        sc = CausalLMScorer.smollm2(batch_size=2)
    except ScorerError as e:
        pytest.skip(str(e))
    plain = "The cat sat on the mat and looked out of the window at the birds in the garden."
    shuffled = "garden the window cat birds at the of sat mat looked the the on out in and The."
    p, s = sc.perplexities([plain, shuffled])
    print(f"SmolLM2 load+score {time.perf_counter() - t0:.1f} s: plain {p:.1f}, shuffled {s:.1f}")
    assert p < 60 and s > 10 * p


# --------------------------------------------------------------------------- BERTScore

@pytest.fixture(scope="module")
def minilm():
    pytest.importorskip("bert_score")
    from dsl_llada.eval.scorers.bertscore import BERTScoreError, local_minilm_dir

    try:
        return local_minilm_dir()
    except BERTScoreError as e:
        pytest.skip(str(e))


def test_bertscore_identity_and_unrelated(minilm):
    from dsl_llada.eval.scorers.bertscore import bertscore

    refs = ["The cat sat on the mat.", "Stocks fell sharply on Monday after the bank raised rates."]
    same = bertscore(refs, refs, model_dir=minilm, num_layers=4)
    assert all(abs(f - 1.0) < 1e-4 and abs(p - 1.0) < 1e-4 for p, _, f in same)
    other = bertscore(list(reversed(refs)), refs, model_dir=minilm, num_layers=4)
    assert all(o[2] < s[2] - 0.1 for o, s in zip(other, same))
    para = bertscore(["A cat was sitting on the mat."], refs[:1], model_dir=minilm, num_layers=4)[0][2]
    assert other[0][2] < para < 1.0  # a paraphrase sits between unrelated and identical


def test_bertscore_order_batch_invariance_and_cache(minilm):
    from dsl_llada.eval.scorers.bertscore import bertscore
    from dsl_llada.eval.scorers.shared import _LOADED

    cands = ["a short one", "the weather today is sunny and warm across the whole country", "hello there",
             "prices rose", "the committee approved the new budget after a long debate"]
    refs = ["a short sentence", "sunny and warm weather is expected nationwide", "hi",
            "prices increased", "after debating for hours the committee passed the budget"]
    base = bertscore(cands, refs, model_dir=minilm, num_layers=4, batch_size=1)
    s2 = _LOADED[("bertscore", (str(minilm.resolve()), 4, "cpu", "None"))]  # the encoder loaded above, reused
    s2._cache.clear()
    s2.forward_pairs = 0
    perm = [3, 0, 4, 2, 1]
    got = s2.score([cands[i] for i in perm], [refs[i] for i in perm], batch_size=3)
    for j, i in enumerate(perm):
        assert got[j] == pytest.approx(base[i], abs=1e-5)
    n = s2.forward_pairs
    again = s2.score(cands + cands[:2], refs + refs[:2], batch_size=3)
    assert s2.forward_pairs == n == 5  # all cache hits
    assert again[5] == again[0]


def test_bertscore_errors(minilm, tmp_path):
    from dsl_llada.eval.scorers.bertscore import BERTScoreError, bertscore

    with pytest.raises(BERTScoreError, match="does not exist"):
        bertscore(["a"], ["a"], model_dir=tmp_path / "nope", num_layers=2)
    with pytest.raises(BERTScoreError, match=r"num_layers must be an integer in \[1, 6\]"):
        bertscore(["a"], ["a"], model_dir=minilm, num_layers=7)
    with pytest.raises(ValueError, match="cands has 1 texts but refs has 2"):
        bertscore(["a"], ["a", "b"], model_dir=minilm, num_layers=2)


def test_context_conditioned_scoring(loaded):
    sc = loaded(batch_size=3)
    ctx, text = "w7 w8 w9", "w3 w1 w4"
    cids = [WORDS.index(w) + 2 for w in ctx.split()]
    tids = [WORDS.index(w) + 2 for w in text.split()]
    with torch.no_grad():
        logp = torch.log_softmax(sc.model(input_ids=torch.tensor([cids + tids])).logits[0].double(), -1)
    want = -sum(float(logp[t - 1, (cids + tids)[t]]) for t in range(3, 6))
    got = sc.nll([text, text, "w5"], contexts=[ctx, "", "w2 w2"])
    assert got[0][1] == 3 and got[0][0] == pytest.approx(want, rel=1e-5)
    # an empty context = no context: the same ids, so the same value at the same batch shape (exactly, on any CPU)
    one = loaded(batch_size=1)
    assert one.nll([text], contexts=[""]) == one.nll([text])
    # in the batch above the row is padded to the context row's length: another matrix shape, whose kernel may sum
    # in another order (under ATEN_CPU_CAPABILITY=default the sum moved by 1 fp32 ulp); a few ulps per scored token
    # are rounding, while a context changes a log-probability by far more (see got[0] against the text alone)
    alone = sc.nll([text])[0]
    assert got[1][1] == alone[1] and got[1][0] == pytest.approx(alone[0], rel=16 * alone[1] * torch.finfo(torch.float32).eps)
    assert abs(got[0][0] - alone[0]) > 1e-3
    assert got[2][1] == 1                       # a one-token text is scorable given a context
    with pytest.raises(ValueError, match="contexts has 1 entries but texts has 2"):
        sc.nll(["a", "b"], contexts=["x"])
