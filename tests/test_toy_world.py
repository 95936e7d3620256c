"""Tests of the embedded toy world (dsl_llada.toy): exactness, determinism, tokenizer, tasks."""

from __future__ import annotations

import math
from collections import Counter

import numpy as np
import pytest

from dsl_llada import toy
from dsl_llada.toy import words as W
from dsl_llada.toy.pfsa import FINAL, PfsaBuilder
from dsl_llada.toy.world import _PL_DETS, _SG_DETS


@pytest.fixture(scope="module")
def world():
    return toy.ToyWorld()


@pytest.fixture(scope="module")
def tokenizer(world):
    return toy.build_tokenizer(world)


def tiny_world(max_sentences, adjectives):
    """Enumerable sub-world: ocean only, whale/shark/fish, one verb of each kind, no openers."""
    cfg = toy.ToyWorldConfig(n_topics=1, nouns_per_topic=3, verbs_per_topic=1,
                             adjectives_per_topic=adjectives, general_adjectives=adjectives,
                             max_sentences=max_sentences, p_opener=0.0, min_doc_sentences=1)
    return toy.ToyWorld(cfg)


# ------------------------------------------------------------------ config / seeds
def test_config_roundtrip_and_validation():
    cfg = toy.ToyWorldConfig(seed=3, stop_prob=0.5)
    assert toy.ToyWorldConfig.from_dict(cfg.to_dict()) == cfg
    with pytest.raises(ValueError, match="unknown"):
        toy.ToyWorldConfig.from_dict({"nope": 1})
    with pytest.raises(ValueError, match="gen_length"):
        toy.ToyWorld(toy.ToyWorldConfig(gen_length=20))


def test_seeded_determinism(world):
    a = toy.make_corpus(world, 20, "mixed", 123)
    b = toy.make_corpus(world, 20, "mixed", np.random.default_rng(123))
    assert [e.to_dict() for e in a] == [e.to_dict() for e in b]
    assert toy.make_split(world, 10, "summarize", "train") == toy.make_split(world, 10, "summarize", "train")
    train = toy.make_split(world, 50, "summarize", "train")
    test = toy.make_split(world, 50, "summarize", "test", exclude={e.prompt for e in train})
    assert not {e.prompt for e in train} & {e.prompt for e in test}
    other = toy.make_corpus(toy.ToyWorld(), 20, "mixed", 124)
    assert [e.response for e in other] != [e.response for e in a]
    assert toy.TaskExample.from_dict(a[1].to_dict()) == a[1]


# ------------------------------------------------------------------ lexicon / tokenizer
def test_lexicon_surface_forms_are_unique():
    owner: dict[str, tuple] = {}
    for t in W.ALL_TOPICS:
        entries = [(w, ("noun", t, i)) for i, pair in enumerate(W.TOPIC_NOUNS[t]) for w in set(pair)]
        entries += [(w, ("iv", t)) for pair in W.TOPIC_INTRANSITIVE[t] for w in pair]
        entries += [(w, ("tv", t)) for pair in W.TOPIC_TRANSITIVE[t] for w in pair]
        entries += [(w, ("adj", t)) for w in W.TOPIC_ADJECTIVES[t]]
        entries += [(t, ("topic", t))]
        for w, who in entries:
            assert w not in owner, f"{w!r} used by {owner[w]} and {who}"
            owner[w] = who
    function = set(W.PUNCT + W.SINGULAR_DETS + W.PLURAL_DETS + W.OPENERS + W.GENERAL_ADJECTIVES
                   + W.CONJUNCTIONS + W.PROMPT_WORDS + W.ROLE_WORDS) | set(W.PRONOUNS.values())
    assert not function & set(owner)


def test_vocab_and_special_ids(world, tokenizer):
    assert 200 <= world.vocab_size <= 400
    ids = toy.special_ids(tokenizer)
    assert ids == world.special_ids()
    assert set(ids) >= {"mask", "eos", "eot", "pad", "bos", "start_header", "end_header"}
    assert ids["pad"] == ids["eos"]
    distinct = [ids[k] for k in ("mask", "eos", "eot", "bos", "start_header", "end_header", "unk")]
    assert len(set(distinct)) == len(distinct)
    assert tokenizer.mask_token_id == ids["mask"] and tokenizer.bos_token_id == ids["bos"]
    assert len(tokenizer) == world.vocab_size
    assert tokenizer.convert_ids_to_tokens(list(range(world.vocab_size))) == world.tokens


def test_tokenizer_roundtrip(world, tokenizer):
    rng = np.random.default_rng(0)
    for topic in world.topics:
        text = " ".join(world.sample_response(topic, rng))
        ids = tokenizer.encode(text, add_special_tokens=False)
        assert ids == [world.token_to_id[w] for w in text.split()]
        assert tokenizer.decode(ids) == text
    assert tokenizer.decode(tokenizer.encode(toy.render_prompt("describe space ."))) == \
        toy.render_prompt("describe space .")


def test_tokenizer_save_load_offline(tokenizer, tmp_path, monkeypatch):
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    tokenizer.save_pretrained(tmp_path)
    text = toy.render_prompt("write about the farm .") + " the cow runs . " + W.EOT
    for loader in (PreTrainedTokenizerFast, AutoTokenizer):
        t2 = loader.from_pretrained(str(tmp_path))
        assert t2.encode(text, add_special_tokens=False) == tokenizer.encode(text, add_special_tokens=False)
        assert toy.special_ids(t2) == toy.special_ids(tokenizer)
        assert t2.decode(t2.encode(text, add_special_tokens=False)) == text
        chat = t2.apply_chat_template([{"role": "user", "content": "describe space ."}],
                                      tokenize=False, add_generation_prompt=True)
        assert chat == toy.render_prompt("describe space .")


# ------------------------------------------------------------------ exactness
def test_outgoing_probabilities_sum_to_one(world):
    machines = [world.machine(t) for t in world.topics]
    ex = toy.make_example(world, "summarize", 5)
    machines.append(toy.summary_machine(world, ex.document))
    for m in machines:
        mass = m.out_mass()
        nonfinal = np.arange(m.n_states) != m.final
        np.testing.assert_allclose(mass[nonfinal], 1.0, atol=1e-12)
        assert mass[m.final] == 0.0


@pytest.mark.parametrize("max_sentences,adjectives", [(2, 0), (1, 1)])
def test_forward_matches_brute_force_enumeration(max_sentences, adjectives):
    w = tiny_world(max_sentences, adjectives)
    m = w.machine(0)
    strings = m.enumerate()  # every string of the sub-world with its summed path probability
    assert len(strings) > 1000
    assert sum(strings.values()) == pytest.approx(1.0, abs=1e-9)
    ambiguous = 0
    for ids, p in list(strings.items())[::40]:
        lp = w.log_prob([w.tokens[i] for i in ids], 0, epsilon=0.0)
        assert lp == pytest.approx(math.log(p), abs=1e-9)
        ambiguous += "fish" in [w.tokens[i] for i in ids]
    assert ambiguous > 0  # "fish" is number-ambiguous: these strings exercise several hidden paths
    # a string outside the support: -inf without smoothing, finite with it
    assert w.log_prob("the fish swims swims .", 0, epsilon=0.0) == -math.inf
    assert math.isfinite(w.log_prob("the fish swims swims .", 0))


def test_forward_sums_over_hidden_number_of_invariant_objects(world):
    """"the fish" as an object may be singular or plural: two complete paths, both counted."""
    c = world.config
    fish = world.log_prob("the whale chases the fish .", "ocean", epsilon=0.0)
    shark = world.log_prob("the whale chases the shark .", "ocean", epsilon=0.0)
    p_sg_the = (1 - c.p_plural) * dict(_SG_DETS)["the"]
    p_pl_the = c.p_plural * dict(_PL_DETS)["the"]
    assert math.exp(fish - shark) == pytest.approx((p_sg_the + p_pl_the) / p_sg_the, rel=1e-9)


def test_epsilon_smoothing_closed_form():
    b = PfsaBuilder("s")
    b.add("s", "t", "a", 1.0)
    b.add("t", FINAL, "end", 1.0)
    m = b.compile({"a": 0, "end": 1}, "end")
    eps = 0.1
    assert m.log_prob([], eps) == pytest.approx(math.log(eps / 2))
    expected = (1 - eps) * (1 - eps + eps / 2) + (eps / 2) ** 2
    assert m.log_prob([0], eps) == pytest.approx(math.log(expected))
    total = sum(math.exp(m.log_prob([0] * n, eps)) for n in range(400))
    assert total == pytest.approx(1.0, abs=1e-9)
    with pytest.raises(ValueError):
        m.log_prob([1], eps)


def test_sampled_responses_beat_shuffled(world):
    rng = np.random.default_rng(1)
    for k in range(40):
        topic = world.topics[k % len(world.topics)]
        ws = world.sample_response(topic, rng)
        lp = world.log_prob(ws, topic)
        assert math.isfinite(lp)
        shuffled = list(ws)
        while shuffled == ws and len(set(ws)) > 1:
            rng.shuffle(shuffled)
        if shuffled != ws:
            assert world.log_prob(shuffled, topic) < lp - 3.0


@pytest.mark.parametrize("good,bad", [
    ("the whale swims .", "the whale swim ."),
    ("the whales swim .", "the whales swims ."),
    ("an octopus dives .", "a octopus dives ."),
    ("this shark bites the boats .", "these shark bites the boats ."),
    ("the whale swims . it dives .", "the whale swims . they dives ."),
    ("the whale swims . it dives .", "the whale swims . they dive ."),
    ("the whale chases the boat .", "the whale chases the owl ."),  # off-topic noun
])
def test_violations_score_much_lower(world, good, bad):
    lg, lb = world.log_prob(good, "ocean"), world.log_prob(bad, "ocean")
    assert math.isfinite(lg) and lb < lg - 5.0
    assert world.log_prob(bad, "ocean", epsilon=0.0) == -math.inf


def test_mean_nll_matches_entropy_and_lengths(world):
    rng = np.random.default_rng(2)
    m = world.machine("forest")
    nll, lens = [], []
    for _ in range(1500):
        ws = world.sample_response("forest", rng)
        nll.append(-world.log_prob(ws, "forest", epsilon=0.0))
        lens.append(len(ws))
    se = np.std(nll) / math.sqrt(len(nll))
    h_path = m.path_entropy()  # ≥ string entropy; equal up to the small number ambiguity
    assert h_path - 1.0 - 4 * se < np.mean(nll) < h_path + 4 * se
    assert abs(np.mean(lens) - m.expected_length()) < 4 * np.std(lens) / math.sqrt(len(lens))
    assert m.max_length() == world.config.max_response_words
    assert min(lens) >= 4 and max(lens) <= world.config.max_response_words
    assert 10 <= np.mean(lens) <= 20


def test_topic_marginal(world):
    ws = "the whale swims ."
    lp = world.log_prob(ws, "ocean", epsilon=0.0)
    assert world.log_prob(ws, None, epsilon=0.0) == pytest.approx(lp - math.log(len(world.topics)))


def test_factorised_decoding_breaks_the_world(world):
    """Sampling every position independently from its marginal yields text outside the support."""
    rng = np.random.default_rng(3)
    L = world.config.gen_length
    samples = [world.sample_response("city", rng) + [W.EOT] for _ in range(1000)]
    marg = [Counter() for _ in range(L)]
    for s in samples:
        for i, t in enumerate(s + [W.EOS] * (L - len(s))):
            marg[i][t] += 1
    ex = toy.TaskExample("open", "describe the city .", "", "city")
    fact, true = [], []
    for s in samples[:100]:
        seq = []
        for c in marg:
            toks, counts = zip(*c.items())
            seq.append(toks[rng.choice(len(toks), p=np.array(counts) / sum(counts))])
        fact.append(toy.score_response(world, seq, ex))
        true.append(toy.score_response(world, " ".join(s), ex))
    assert np.mean([s["in_support"] for s in true]) == 1.0
    assert np.mean([s["in_support"] for s in fact]) < 0.1
    assert toy.corpus_ppl(fact) > 10 * toy.corpus_ppl(true)


# ------------------------------------------------------------------ tasks / rendering
def test_sft_rendering(world, tokenizer):
    ids_ = toy.special_ids(tokenizer)
    ex = toy.make_example(world, "open", 0)
    ids, plen = toy.render_sft_example(ex.prompt, ex.response, 48, tokenizer)
    n = len(ex.response.split())
    assert len(ids) == plen + 48
    assert ids[0] == ids_["bos"] and ids[plen - 1] == ids_["end_header"]
    assert tokenizer.decode(ids[:plen]) == toy.render_prompt(ex.prompt)
    assert tokenizer.decode(ids[plen:plen + n]) == ex.response
    assert ids[plen + n] == ids_["eot"]
    assert all(i == ids_["eos"] for i in ids[plen + n + 1:])
    with pytest.raises(ValueError, match="gen_length=5"):
        toy.render_sft_example(ex.prompt, "the cow runs . it rests .", 5, tokenizer)
    empty, plen2 = toy.render_sft_example(ex.prompt, "", 4, tokenizer)
    assert empty[plen2:] == [ids_["eot"]] + [ids_["eos"]] * 3


def test_prompt_lengths(world, tokenizer):
    for ex in toy.make_corpus(world, 200, "mixed", 9):
        p = toy.render_prompt(ex.prompt).split()
        limit = 24 if ex.task == "open" else 8 + 64
        assert len(p) <= limit
        assert len(ex.response.split()) + 1 <= world.config.gen_length


def test_summarisation(world):
    exs = toy.make_corpus(world, 60, "summarize", 4)
    for ex in exs:
        m = toy.summary_machine(world, ex.document)
        assert sum(m.enumerate().values()) == pytest.approx(1.0, abs=1e-12)
        doc = set(ex.document.split())
        ref = ex.reference.split()
        content = [w for w in ref if w not in ("the", ".")]
        assert content and set(content) <= doc
        assert ex.prompt == f"summarize : {ex.document}"
        s_ref = toy.score_response(world, ex.reference, ex)
        s_resp = toy.score_response(world, ex.response, ex)
        assert s_ref["in_support"] == 1.0 and s_resp["in_support"] == 1.0
        assert s_ref["log_prob"] >= s_resp["log_prob"] - 1e-12  # reference is the mode
        assert set(ex.response.split()) - {"the", "this", "these", "and", "."} <= doc
        # an off-document summary is outside the support
        off = toy.score_response(world, "the owl hunts .", ex)
        assert off["in_support"] == 0.0 and off["log_prob"] < s_ref["log_prob"] - 5
    a = toy.analyze_document(world, "these fish swim . they chase the boat . a whale dives .")
    assert (a.main, a.main_num, a.predicates) == ("fish", "pl", [("swim", None), ("chase", "boat")])
    assert toy.summary_reference(a) == "the fish swim ."


def test_score_response_cuts_at_end_tokens(world):
    ex = toy.TaskExample("open", "describe the farm .", "", "farm")
    plain = toy.score_response(world, "the cow runs .", ex)
    padded = toy.score_response(world, f"the cow runs . {W.EOT} {W.EOS} {W.EOS} junk", ex)
    assert plain == padded and plain["n_tokens"] == 5.0
    assert plain["ppl"] == pytest.approx(math.exp(plain["nll_sum"] / 5))
    early = toy.score_response(world, f"the cow {W.EOS}", ex)  # premature end
    assert early["in_support"] == 0.0 and early["nll_per_token"] > plain["nll_per_token"] + 2
