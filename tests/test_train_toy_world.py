"""`train` on the toy world: the `data.toy_world` source (the padded SFT layout, exact counts), the `eval_bayes_floor`
metric (logged values equal the floor computed directly from the saved model) and their configuration errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from helpers import toy_backbone_folder

from dsl_llada.core.backbones import load_backbone
from dsl_llada.config import ConfigError
from dsl_llada.core.model import DSLModel
from dsl_llada.toy import EOS, EOT, render_prompt
from dsl_llada.toy.bayes_floor import MASK_RATES, dsl_excess, mdm_curve
from dsl_llada.toy.floor_report import held_out
from dsl_llada.toy.training import TOY_WORLD, register, toy_world_blocks, toy_world_corpus
from dsl_llada.toy.words import ALL_TOPICS
from dsl_llada.train import world_source
from dsl_llada.train.data import DataConfig, make_dataloader
from dsl_llada.train.toy_config import MAX_TOY_TOPICS, ToyWorldData
from dsl_llada.train.train_config import TrainConfig, load_train_config
from dsl_llada.train.trainer import train

ROOT = Path(__file__).resolve().parents[1]
PREFIX = "eval/bayes_floor"
WORLD = {"seed": 0, "n_topics": 2, "max_sentences": 2, "gen_length": 21, "n_train": 16}
BLOCK = 52  # the longest possible prompt of this world (8 chat tokens + 'summarize :' + 20 words = 30) + 21 + 1 spare

pytestmark = pytest.mark.usefixtures("one_thread", "toy_world_registered")  # one_thread: tests/conftest.py


@pytest.fixture
def toy_world_registered(monkeypatch):
    """The toy world as this process's training world (what `dsl-llada train` registers), unregistered after."""
    monkeypatch.setattr(world_source, "_registered", None)
    register()


def tiny_run(out: Path, **overrides) -> TrainConfig:
    """A 4-update run of a 1-layer LLaDA on the small world, the floor measured at updates 2 and 4."""
    base = dict(objective="dsl", init_from="scratch", output_dir=str(out), progress=False,
                scratch_model={"d_model": 32, "n_layers": 1, "n_heads": 2, "max_sequence_length": 64},
                dsl={"converter": {"noise_dim": 16}},
                data={"toy_world": WORLD, "format": "sft", "block_size": BLOCK, "shuffle_buffer": 0, "repeat": True},
                eval_bayes_floor={"n_heldout": 3, "every": 2}, lr=3e-3, warmup_steps=0, max_steps=4,
                per_device_batch_size=4, grad_accum=1, save_every=0, log_every=2, eval_every=0, seed=3)
    base.update(overrides)
    return TrainConfig(**base)


def records(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def floor_records(out: Path) -> dict[int, dict]:
    return {r["step"]: r for r in records(out) if f"{PREFIX}/floor" in r}


# -- the plug-in ------------------------------------------------------------------------------------------------------
def test_training_reaches_the_toy_world_only_through_the_registered_world(tmp_path, monkeypatch):
    assert world_source.registered_world() is TOY_WORLD
    settings = ToyWorldData(**WORLD)
    assert TOY_WORLD.corpus(settings) is toy_world_corpus(settings)  # built once per settings
    assert torch.equal(TOY_WORLD.corpus(settings).blocks(BLOCK)[0], toy_world_blocks(settings, BLOCK)[0])
    monkeypatch.setattr(world_source, "_registered", None)
    with pytest.raises(ConfigError, match=r"^data.toy_world needs the toy world's training source, which this "
                                          r"process has not registered; run `dsl-llada train`"):
        make_dataloader(DataConfig(toy_world=settings, format="sft", block_size=BLOCK), str.split, batch_size=1,
                        eos_id=0)
    with pytest.raises(ConfigError, match=r"has not registered"):
        train(tiny_run(tmp_path / "run"))
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


def test_the_settings_bound_on_topics_is_the_lexicon_size():
    assert MAX_TOY_TOPICS == len(ALL_TOPICS) == 8
    ToyWorldData(**{**WORLD, "n_topics": MAX_TOY_TOPICS})


# -- the data source --------------------------------------------------------------------------------------------------
def test_toy_world_blocks_are_prompt_response_eot_then_padding():
    settings = ToyWorldData(**WORLD)
    corpus = toy_world_corpus(settings)
    tok = corpus.tokenizer
    eot, eos = tok.convert_tokens_to_ids(EOT), tok.convert_tokens_to_ids(EOS)
    loader = make_dataloader(DataConfig(toy_world=settings, format="sft", block_size=BLOCK, shuffle_buffer=0), tok,
                             batch_size=1, eos_id=corpus.special.eos)
    rows = [(b["input_ids"][0].tolist(), int(b["prompt_length"][0])) for b in loader]
    assert len(rows) == WORLD["n_train"] == len(corpus.examples)
    for k, ((row, plen), ex) in enumerate(zip(rows, corpus.examples)):
        assert ex.task == ("open" if k % 2 == 0 else "summarize")  # the tasks alternate
        prompt = tok.encode(render_prompt(ex.prompt), add_special_tokens=False)
        response = tok.encode(ex.response, add_special_tokens=False)
        assert len(row) == BLOCK and plen == len(prompt)
        assert row[:plen] == prompt
        assert row[plen: plen + len(response)] == response
        assert row[plen + len(response)] == eot and row.count(eot) == prompt.count(eot) + 1
        assert row[plen + len(response) + 1:] == [eos] * (BLOCK - plen - len(response) - 1)
        assert BLOCK - plen >= WORLD["gen_length"]  # the response part holds gen_length tokens at least
    summarize = sum(ex.task == "summarize" for ex in corpus.examples)
    assert summarize == WORLD["n_train"] // 2


def test_toy_world_source_refuses_a_block_too_small_and_other_sources():
    settings = ToyWorldData(**WORLD)
    with pytest.raises(ConfigError, match=r"data.block_size=30 is too small .* use data.block_size >= (\d+)") as e:
        toy_world_blocks(settings, 30)
    need = int(str(e.value).rsplit(">= ", 1)[1])
    assert toy_world_blocks(settings, need)[0].shape == (WORLD["n_train"], need)
    with pytest.raises(ConfigError, match=r"format='text' is not valid with toy_world: .* set format='sft'"):
        DataConfig(toy_world=WORLD)
    with pytest.raises(ConfigError, match=r"either toy_world or source"):
        DataConfig(toy_world=WORLD, format="sft", files=["a.jsonl"])


@pytest.mark.parametrize("field, value, message", [
    ("n_train", 7, r"n_train=7 is not valid: it must be even"),
    ("n_train", 10**9, r"n_train=1000000000 is not valid: it must be an integer from 2 to 200000"),
    ("n_topics", 9, r"n_topics=9 is not valid: it must be an integer from 1 to 8"),
    ("max_sentences", 1, r"max_sentences=1 is not valid: it must be an integer from 2 to 10"),
    ("gen_length", 20, r"gen_length=20 is not valid: it must be an integer from 21 to 1024"),
    ("seed", -1, r"seed=-1 is not valid"),
])
def test_toy_world_settings_are_validated(field, value, message):
    with pytest.raises(ConfigError, match=message):
        ToyWorldData(**{**WORLD, field: value})


# -- the metric -------------------------------------------------------------------------------------------------------
def test_dsl_run_logs_model_loss_floor_and_excess_equal_to_a_direct_measurement(tmp_path):
    cfg = tiny_run(tmp_path / "run")
    result = train(cfg)
    logged = floor_records(tmp_path / "run")
    assert sorted(logged) == [2, 4] and sorted(result.evals) == [2, 4]
    for rec in logged.values():
        model_ce, floor, excess = (rec[f"{PREFIX}/{k}"] for k in ("model_ce", "floor", "excess"))
        assert excess == model_ce - floor and floor > 0 and excess > -1e-6
    corpus = toy_world_corpus(cfg.data.toy_world)
    ids, plen = held_out(corpus.world, corpus.tokenizer, 3, WORLD["gen_length"])
    assert ids.shape[0] == 6
    model = DSLModel.from_pretrained(tmp_path / "run" / "final")  # the model as of update 4
    direct = dsl_excess(model, corpus.world, corpus.special, ids, plen, snr=cfg.objective_options.snr, seed=cfg.seed)
    assert logged[4][f"{PREFIX}/floor"] == pytest.approx(direct.oracle_ce, rel=1e-9)
    assert logged[4][f"{PREFIX}/model_ce"] == pytest.approx(direct.model_ce, rel=1e-6)
    other = dsl_excess(model, corpus.world, corpus.special, ids, plen, snr=cfg.objective_options.snr, seed=cfg.seed + 1)
    assert abs(other.oracle_ce - direct.oracle_ce) > 1e-4  # another seed draws other noise: the run used its own seed


def test_mdm_run_logs_the_mask_rate_curve_and_its_mean(tmp_path):
    cfg = tiny_run(tmp_path / "mdm", objective="mdm", max_steps=2)
    train(cfg)
    rec = floor_records(tmp_path / "mdm")[2]
    corpus = toy_world_corpus(cfg.data.toy_world)
    ids, plen = held_out(corpus.world, corpus.tokenizer, 3, WORLD["gen_length"])
    backbone = load_backbone(tmp_path / "mdm" / "final", special=corpus.special)
    points = mdm_curve(backbone, corpus.world, corpus.special, ids, plen, MASK_RATES, seed=cfg.seed)
    assert len(points) == len(MASK_RATES) == 6
    for p in points:
        assert rec[f"{PREFIX}/rate={p.level:g}/floor"] == pytest.approx(p.oracle_ce, rel=1e-9)
        assert rec[f"{PREFIX}/rate={p.level:g}/model_ce"] == pytest.approx(p.model_ce, rel=1e-6)
    assert rec[f"{PREFIX}/floor"] == pytest.approx(sum(p.oracle_ce for p in points) / 6, rel=1e-9)
    assert rec[f"{PREFIX}/excess"] == pytest.approx(sum(p.excess for p in points) / 6, rel=1e-6)
    assert rec[f"{PREFIX}/rate=0.1/floor"] < rec[f"{PREFIX}/rate=1/floor"]  # less is known at a higher mask rate


def test_scratch_model_takes_the_world_ids_and_checkpoints_hold_the_world_tokenizer(tmp_path):
    cfg = tiny_run(tmp_path / "ids", max_steps=1, eval_bayes_floor=None)
    train(cfg)
    corpus = toy_world_corpus(cfg.data.toy_world)
    model = DSLModel.from_pretrained(tmp_path / "ids" / "final")
    assert model.vocab_size == corpus.world.vocab_size
    assert model.backbone.special.mask == corpus.special.mask and model.backbone.special.eos == corpus.special.eos
    from transformers import AutoTokenizer

    saved = AutoTokenizer.from_pretrained(tmp_path / "ids" / "checkpoint-1")
    assert saved.get_vocab() == corpus.tokenizer.get_vocab()


# -- configuration errors ---------------------------------------------------------------------------------------------
def test_bayes_floor_without_the_toy_world_is_one_clear_error(tmp_path, capsys, monkeypatch):
    with pytest.raises(ConfigError, match=r"eval_bayes_floor needs the toy-world data source \(data.toy_world"):
        TrainConfig(init_from="scratch", scratch_model={"d_model": 8}, eval_bayes_floor={"n_heldout": 4})
    from dsl_llada.cli.main import main

    monkeypatch.chdir(ROOT)
    out = tmp_path / "run"
    assert main(["train", "--config", "configs/toy.yaml", f"output_dir={out}", "eval_bayes_floor={n_heldout: 4}"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "eval_bayes_floor needs the toy-world data source" in err[0], err
    assert not out.exists()


@pytest.mark.parametrize("overrides, message", [
    ({"eval_bayes_floor": {"n_heldout": 0}}, r"eval_bayes_floor.n_heldout=0 is not valid: .* from 1 to 10000"),
    ({"eval_bayes_floor": {"n_heldout": 10_001}}, r"n_heldout=10001 is not valid: .* from 1 to 10000"),
    ({"eval_bayes_floor": {"every": 0}}, r"eval_bayes_floor.every=0 is not valid: .* from 1 to 100000"),
    ({"eval_bayes_floor": {"n_held": 3}}, r"unknown BayesFloorConfig field\(s\) \['n_held'\]"),
    ({"eval_bayes_floor": 5}, r"eval_bayes_floor=5 must be a mapping"),
    ({"tokenizer": "bytes"}, r"tokenizer='bytes' is not valid with data.toy_world"),
])
def test_bayes_floor_and_toy_world_settings_errors(tmp_path, overrides, message):
    with pytest.raises(ConfigError, match=message):
        tiny_run(tmp_path / "x", **overrides)


def test_a_model_of_another_vocabulary_or_ids_is_refused_before_training(tmp_path):
    with pytest.raises(ConfigError, match=r"scratch_model.mask_token_id=3 does not match the toy world"):
        train(tiny_run(tmp_path / "a", scratch_model={"d_model": 32, "n_layers": 1, "n_heads": 2, "mask_token_id": 3}))
    folder = toy_backbone_folder(tmp_path / "bb")  # a model of a 2-topic world: fits this world's vocabulary
    cfg = tiny_run(tmp_path / "b", init_from=str(folder), max_steps=1, eval_bayes_floor=None)
    assert train(cfg).final_step == 1
    three = tiny_run(tmp_path / "c", init_from=str(folder), data={**cfg.data.to_dict(), "toy_world": {**WORLD, "n_topics": 3}})
    with pytest.raises(ConfigError, match=r"does not fit the toy world of data.toy_world: vocabulary size (\d+) "
                                          r"\(the world's: (\d+)\)"):
        train(three)
    assert not (tmp_path / "c" / "metrics.jsonl").exists()


def test_the_toy_world_preset_loads_and_its_block_holds_every_conversation():
    cfg = load_train_config(ROOT / "configs" / "toy-world.yaml")
    tw = cfg.data.toy_world
    assert tw is not None and cfg.eval_bayes_floor is not None and cfg.objective == "dsl"
    longest_prompt = 8 + 2 + 10 * tw.max_sentences  # chat markup + 'summarize :' + the longest document
    assert cfg.data.block_size == longest_prompt + tw.gen_length == 72
    ids, plen = toy_world_blocks(tw, cfg.data.block_size)
    assert ids.shape == (tw.n_train, 72) and int(plen.max()) <= longest_prompt
    assert load_train_config(ROOT / "configs" / "toy-world.yaml", ["objective=mdm"]).objective == "mdm"
    assert torch.equal(ids[:, 0], torch.full((tw.n_train,), toy_world_corpus(tw).special.bos))
