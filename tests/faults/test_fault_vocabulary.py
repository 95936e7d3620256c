"""A tokenizer with more tokens than the model's vocabulary (here: one added token, whose id equals the model's
vocab_size) would encode a prompt to an id the model does not have. Every entry point opens models through
`loading.open_model`, which refuses it at load with one line naming both sizes (exit 2), before any sampling or
any output is written."""

from __future__ import annotations

import shutil

import pytest
from faults_helpers import error_lines, make_backbone_dir, make_dsl_dir
from transformers import PreTrainedTokenizerFast

from dsl_llada.cli.main import main
from dsl_llada.core.loading import open_model
from dsl_llada.core.model_source import ModelSource

ADDED = "zqxjv"


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """(backbone folder, DSL folder, vocabulary size), each with a tokenizer one token larger than the model."""
    root = tmp_path_factory.mktemp("vocab")
    dsl = make_dsl_dir(root)
    backbone = root / "backbone-big-tok"
    shutil.copytree(root / "backbone", backbone)
    vocab = len(PreTrainedTokenizerFast.from_pretrained(str(backbone)))
    for folder in (backbone, dsl):
        tok = PreTrainedTokenizerFast.from_pretrained(str(folder))
        tok.add_tokens([ADDED])
        assert tok.convert_tokens_to_ids(ADDED) == vocab  # the id right past the model's last row
        tok.save_pretrained(str(folder))
    return backbone, dsl, vocab


def says_both_sizes(line: str, vocab: int) -> bool:
    return f"has {vocab + 1} tokens" in line and f"has a vocabulary of {vocab}" in line


@pytest.mark.parametrize("which", [0, 1], ids=["backbone", "dsl"])
def test_generate_refuses_a_tokenizer_larger_than_the_model(folders, tmp_path, capsys, which):
    out = tmp_path / "out.jsonl"
    rc = main(["generate", "--model", str(folders[which]), "--prompt", f"the ocean {ADDED}", "--sampler", "remask",
               "--steps", "2", "--gen-length", "4", "-q", "--device", "cpu", "--output", str(out)])
    err = capsys.readouterr()
    assert rc == 2 and err.out == ""
    (line,) = error_lines(err.err)
    assert line.startswith("error: the tokenizer in ") and says_both_sizes(line, folders[2]), line
    assert "use the model's own tokenizer" in line
    assert not out.exists() and not (tmp_path / "out.jsonl.config.json").exists()  # nothing written


def test_serve_refuses_it_before_serving(folders, capsys, monkeypatch):
    from dsl_llada.serve import server

    monkeypatch.setattr(server, "run_uvicorn", lambda *a, **k: pytest.fail("serve started serving"))
    assert main(["serve", "--model", str(folders[1]), "--device", "cpu", "--port", "0"]) == 2
    (line,) = error_lines(capsys.readouterr().err)
    assert says_both_sizes(line, folders[2]), line


def test_the_library_refuses_it_and_a_separate_matching_tokenizer_is_accepted(folders, tmp_path):
    with pytest.raises(ValueError) as e:
        open_model(ModelSource(path=str(folders[0]), device="cpu", dtype="float32"))
    assert says_both_sizes(str(e.value), folders[2])
    good = make_backbone_dir(tmp_path / "good")  # the model's own tokenizer, given with --tokenizer
    handle = open_model(ModelSource(path=str(folders[0]), tokenizer=str(good), device="cpu", dtype="float32"))
    assert len(handle.tokenizer) == handle.model.vocab_size == folders[2]
