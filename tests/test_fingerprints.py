"""Cache and resume keys: content hashes of weights, tokenizer and sampling code (not a config or a path alone)."""

from __future__ import annotations

import json
import shutil

import pytest
from eval_fixtures import base_config, eval_models  # noqa: F401  (session fixture)

from dsl_llada.config import ConfigError
from dsl_llada.eval.eval_config import EvalConfig
from dsl_llada.eval.runner import prepare_run_dir, run_inputs
from dsl_llada.artifacts.fingerprints import (code_fingerprint, folder_fingerprints, tokenizer_fingerprint,
                                    tokenizer_object_fingerprint, weights_fingerprint)


def test_folder_hashes_follow_the_content_not_the_path(eval_models, tmp_path):  # noqa: F811
    copy = tmp_path / "copy"
    shutil.copytree(eval_models["dsl"], copy)
    assert folder_fingerprints(copy) == folder_fingerprints(eval_models["dsl"])  # same bytes elsewhere: same key
    assert weights_fingerprint(copy) != weights_fingerprint(eval_models["llada"])
    w = next(copy.glob("*.safetensors"))
    data = bytearray(w.read_bytes())
    data[-1] ^= 1  # one bit of one weight
    w.write_bytes(bytes(data))
    assert weights_fingerprint(copy) != weights_fingerprint(eval_models["dsl"])
    assert tokenizer_fingerprint(copy) == tokenizer_fingerprint(eval_models["dsl"])
    assert weights_fingerprint(tmp_path) is None and tokenizer_fingerprint(tmp_path) is None
    assert code_fingerprint().startswith("0.") and code_fingerprint() == code_fingerprint()


def test_tokenizer_object_hash_sees_the_vocabulary():
    from dsl_llada.toy.tokenizer import build_tokenizer
    from dsl_llada.toy.world import ToyWorld, ToyWorldConfig

    a = build_tokenizer(ToyWorld(ToyWorldConfig(seed=0, n_topics=4)))
    b = build_tokenizer(ToyWorld(ToyWorldConfig(seed=0, n_topics=4)))
    c = build_tokenizer(ToyWorld(ToyWorldConfig(seed=0, n_topics=3)))
    assert tokenizer_object_fingerprint(a) == tokenizer_object_fingerprint(b) != tokenizer_object_fingerprint(c)


def test_an_eval_run_is_not_resumed_onto_retrained_weights(eval_models, tmp_path):  # noqa: F811
    models = {k: tmp_path / k for k in ("dsl", "llada")}
    for k, p in models.items():
        shutil.copytree(eval_models[k], p)
    task = {"name": "generation", "datasets": [{"name": "p", "path": str(tmp_path / "p.jsonl"), "gen_length": 8}]}
    (tmp_path / "p.jsonl").write_text(json.dumps({"prompt": "hi"}) + "\n")
    cfg = EvalConfig.from_dict(base_config(models, [task]))
    run = tmp_path / "run"
    prepare_run_dir(run, cfg)
    marker = json.loads((run / "eval_run.json").read_text())
    assert marker["inputs"] == run_inputs(cfg) and marker["inputs"]["dsl"]["weights"]
    prepare_run_dir(run, cfg)  # same inputs: resumable
    w = next(models["dsl"].glob("*.safetensors"))
    data = bytearray(w.read_bytes())
    data[-1] ^= 1
    w.write_bytes(bytes(data))
    with pytest.raises(ConfigError, match=r"differing: inputs\.dsl"):
        prepare_run_dir(run, cfg)
    prepare_run_dir(run, cfg, new_run=True)  # the documented way out still works
