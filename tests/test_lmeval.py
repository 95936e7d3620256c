"""lm-evaluation-harness adapter: a full offline `lm-eval` run on local task files (generation over GSM8K,
multiple choice, rolling perplexity) with a tiny LLaDA-architecture model and a BPE tokenizer trained here."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch
from eval_fixtures import find_data

lm_eval = pytest.importorskip("lm_eval")

from dsl_llada.core.backbones import LLaDABackbone, save_backbone, tiny_llada_config  # noqa: E402
from dsl_llada.core.backbones.base import SpecialTokens  # noqa: E402
from dsl_llada.cli.main import main  # noqa: E402
from dsl_llada.config import ConverterConfig, DSLConfig  # noqa: E402
from dsl_llada.core.model import DSLModel  # noqa: E402

DATA = find_data("gsm8k_100.jsonl")
GSM8K = DATA / "gsm8k_100.jsonl" if DATA is not None else Path("gsm8k_100.jsonl")
pytestmark = pytest.mark.skipif(DATA is None, reason="the evaluation data (gsm8k_100.jsonl) is not present")


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory):
    """A BPE tokenizer trained on GSM8K questions, a tiny random LLaDA over it, and a DSL conversion."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    texts = [json.loads(line)["question"] for line in GSM8K.read_text().splitlines()]
    specials = ["<|eot_id|>", "<|endoftext|>", "<|startoftext|>", "<|mdm_mask|>"]
    tk = Tokenizer(models.BPE(unk_token=None))
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    tk.train_from_iterator(texts, trainers.BpeTrainer(vocab_size=400, special_tokens=specials,
                                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, eos_token="<|endoftext|>", bos_token="<|startoftext|>",
                                  mask_token="<|mdm_mask|>", pad_token="<|endoftext|>")
    ids = {s: tk.token_to_id(s) for s in specials}
    V = tk.get_vocab_size()
    cfg = tiny_llada_config(V, mask_token_id=ids["<|mdm_mask|>"], eos_token_id=ids["<|endoftext|>"],
                            eot_token_id=ids["<|eot_id|>"], bos_token_id=ids["<|startoftext|>"], max_sequence_length=96)
    special = SpecialTokens(mask=ids["<|mdm_mask|>"], eos=ids["<|endoftext|>"], eot=ids["<|eot_id|>"],
                            pad=ids["<|endoftext|>"], bos=ids["<|startoftext|>"])
    bb = LLaDABackbone(cfg, special)
    bb.init_weights(torch.Generator().manual_seed(0), std=0.3)
    root = tmp_path_factory.mktemp("lmeval")
    save_backbone(bb, root / "backbone")
    tok.save_pretrained(str(root / "backbone"))
    dsl = DSLModel.convert(bb, DSLConfig(converter=ConverterConfig(noise_dim=16)))
    dsl.save_pretrained(root / "dsl")
    tok.save_pretrained(str(root / "dsl"))
    return root


def _example_script():
    """scripts/lmeval_tiny_example.py (the worked example of docs/evaluation.md), loaded as a module."""
    path = Path(__file__).resolve().parents[1] / "scripts" / "lmeval_tiny_example.py"
    spec = importlib.util.spec_from_file_location("lmeval_tiny_example", path)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    return script


def _tasks(root: Path) -> Path:
    tasks = root / "tasks"
    tasks.mkdir(exist_ok=True)
    (tasks / "gsm_local.yaml").write_text(_example_script().TASK.format(data=GSM8K))  # the worked example's task
    mc = root / "mc.jsonl"
    mc.write_text("".join(json.dumps({"q": f"How many apples are {i} plus {i}?", "choices": [str(2 * i), str(i), "7"],
                                      "label": 0}) + "\n" for i in range(1, 5)))
    (tasks / "mc_local.yaml").write_text(f"""task: mc_local
dataset_path: json
dataset_kwargs:
  data_files:
    test: {mc}
test_split: test
output_type: multiple_choice
doc_to_text: "{{{{q}}}} Answer:"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: "{{{{label}}}}"
metric_list:
  - metric: acc
""")
    roll = root / "roll.jsonl"
    roll.write_text("".join(json.dumps({"text": json.loads(x)["question"]}) + "\n"
                            for x in GSM8K.read_text().splitlines()[:2]))
    (tasks / "roll_local.yaml").write_text(f"""task: roll_local
dataset_path: json
dataset_kwargs:
  data_files:
    test: {roll}
test_split: test
output_type: loglikelihood_rolling
doc_to_text: ""
doc_to_target: "{{{{text}}}}"
metric_list:
  - metric: word_perplexity
  - metric: bits_per_byte
""")
    return tasks


def test_lm_eval_runs_generation_multiple_choice_and_rolling_offline(model_dirs, tmp_path, one_thread):
    tasks = _tasks(tmp_path)
    out = tmp_path / "results.json"
    rc = main(["lm-eval", "--model-dir", str(model_dirs / "dsl"), "--tasks", "gsm_local,mc_local,roll_local",
               "--include-path", str(tasks), "--limit", "3", "--sampler", "sde", "--sampler-arg", "nfe=4",
               "--sampler-arg", "gen_length=8", "--batch-size", "2", "--mc-samples", "4", "--device", "cpu",
               "--output", str(out)])
    assert rc == 0
    res = json.loads(out.read_text())["results"]
    assert 0.0 <= res["gsm_local"]["exact_match,none"] <= 1.0
    assert 0.0 <= res["mc_local"]["acc,none"] <= 1.0
    ppl = res["roll_local"]["word_perplexity,none"]
    assert ppl > 1.0 and ppl == ppl  # finite, > 1 for a random model


def test_adapter_requests_directly(model_dirs, one_thread):
    from lm_eval.api.instance import Instance

    from dsl_llada.eval.lmeval import DSLLadaLM
    from dsl_llada.eval.likelihood import LikelihoodRequest, mc_loglikelihood

    lm = DSLLadaLM.create_from_arg_string(f"model_dir={model_dirs / 'backbone'},sampler=remask,steps=4,gen_length=8,"
                                          "mc_samples=8,chat_template=false")
    reqs = [Instance("loglikelihood", {}, ("Kim raises", " $320"), 0),
            Instance("loglikelihood", {}, ("How many", " hours"), 1)]
    got = lm.loglikelihood(reqs)
    ctx, tgt = lm._encode("Kim raises"), lm._encode(" $320")
    want = mc_loglikelihood(lm.model, [LikelihoodRequest(tuple(ctx), tuple(tgt))], mc_samples=8, seed=42)[0]
    assert got[0][0] == pytest.approx(want, abs=1e-5) and isinstance(got[0][1], bool)
    gen = [Instance("generate_until", {}, ("Question: 2+2?", {"until": ["Question"], "max_gen_toks": 8}), i)
           for i in range(3)]
    texts = lm.generate_until(gen)
    assert len(texts) == 3 and all("Question" not in t for t in texts)
    assert texts[0] == texts[1] == texts[2] or len(set(texts)) > 1  # per-request seeds; equal prompts allowed
    one = DSLLadaLM.create_from_arg_string(f"model_dir={model_dirs / 'backbone'},sampler=remask,steps=4,gen_length=8,"
                                           "chat_template=false,batch_size=1")
    assert one.generate_until(gen) == texts  # batch-size invariance of generation
    with pytest.raises(ValueError, match="unknown field 'nfe' for sampler 'remask'"):
        DSLLadaLM.create_from_arg_string(f"model_dir={model_dirs / 'backbone'},sampler=remask,nfe=4")


def test_overlong_request_is_truncated_from_the_left_once(model_dirs, caplog, one_thread):
    from lm_eval.api.instance import Instance

    from dsl_llada.eval.lmeval import DSLLadaLM

    lm = DSLLadaLM.create_from_arg_string(f"model_dir={model_dirs / 'backbone'},sampler=remask,mc_samples=2")
    long_ctx = " ".join(["apples"] * 200)
    with caplog.at_level("WARNING"):
        out = lm.loglikelihood([Instance("loglikelihood", {}, (long_ctx, " pears"), i) for i in range(2)])
    assert len(out) == 2 and all(v[0] < 0 for v in out)
    assert sum("truncating from the left" in r.message for r in caplog.records) == 1


def test_lm_eval_cli_errors(model_dirs, tmp_path, capsys):
    assert main(["lm-eval", "--model-dir", str(tmp_path / "none"), "--tasks", "x"]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert main(["lm-eval", "--model-dir", str(model_dirs / "backbone"), "--tasks", "x",
                 "--include-path", str(tmp_path / "no-tasks")]) == 2
    assert "--include-path" in capsys.readouterr().err
    assert main(["lm-eval", "--model-dir", str(model_dirs / "backbone"), "--tasks", "x", "--sampler", "remask",
                 "--sampler-arg", "nfe"]) == 2
    assert "is not KEY=VALUE" in capsys.readouterr().err
