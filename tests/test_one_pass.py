"""Opening a model reads each file of its folder once, resolves device and dtype once, and a sampler config's SNR grid
is built once: through `open_model` directly, through the call `serve` opens its model with (`open_serve_app`) and
through `generate`'s run (`run_generate`)."""

from __future__ import annotations

import builtins
import collections
import contextlib
import io
import os
import traceback
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from serve_helpers import save_tiny_toy_dsl

import dsl_llada.config as config_mod
import dsl_llada.core.checkpoint as checkpoint_mod
import dsl_llada.core.loading as loading
from dsl_llada.config import SDEConfig
from dsl_llada.core.checkpoint import CheckpointFolder
from dsl_llada.core.loading import open_model
from dsl_llada.core.model import DSLModel
from dsl_llada.core.model_source import ModelSource
from dsl_llada.generate.generate_command import GenerateSettings, run_generate
from dsl_llada.sampling import PromptBatch, sample_block_sde, sample_sde
from dsl_llada.sampling.engine import Engine
from dsl_llada.serve.server import ServeSettings, open_serve_app
from helpers import perturb_converter, tiny_dsl

MODEL_FILES = ("config.json", "dsl_config.json", "model.safetensors")
"""The files only this project's loader reads (the tokenizer files are also read by transformers' own loader)."""


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    return save_tiny_toy_dsl(tmp_path_factory.mktemp("onepass") / "model")


class Reads:
    """Opens of the files of one folder, by file name: all of them, and those made by this project's code (no
    transformers or tokenizers frame on the stack)."""

    def __init__(self, folder: Path):
        self.folder = folder.resolve()
        self.total: collections.Counter[str] = collections.Counter()
        self.ours: collections.Counter[str] = collections.Counter()

    def note(self, file: object) -> None:
        if not isinstance(file, (str, os.PathLike)):
            return
        path = Path(os.fspath(file)).resolve()
        if path.parent != self.folder:
            return
        self.total[path.name] += 1
        if not any(f"{os.sep}{lib}{os.sep}" in frame.filename for frame in traceback.extract_stack()
                   for lib in ("transformers", "tokenizers")):
            self.ours[path.name] += 1


@contextlib.contextmanager
def counting_reads(folder: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Reads]:
    """Count every open of `folder`'s files: Python's `open` (which `Path.read_text` / `read_bytes` use too) and
    safetensors' `safe_open` as the checkpoint module calls it."""
    reads = Reads(folder)
    real_open, real_safe_open = builtins.open, checkpoint_mod.safe_open

    def counted_open(file, *args, **kwargs):
        reads.note(file)
        return real_open(file, *args, **kwargs)

    def counted_safe_open(file, *args, **kwargs):
        reads.note(file)
        return real_safe_open(file, *args, **kwargs)

    with monkeypatch.context() as m:
        m.setattr(builtins, "open", counted_open)
        m.setattr(io, "open", counted_open)
        m.setattr(checkpoint_mod, "safe_open", counted_safe_open)
        yield reads


@contextlib.contextmanager
def counting(monkeypatch: pytest.MonkeyPatch, targets) -> Iterator[collections.Counter[str]]:
    """Count the calls of each (module, function name, label) of `targets`, by label."""
    calls: collections.Counter[str] = collections.Counter()
    with monkeypatch.context() as m:
        for module, name, label in targets:
            real = getattr(module, name)

            def counted(*args, _real=real, _label=label, **kwargs):
                calls[_label] += 1
                return _real(*args, **kwargs)

            m.setattr(module, name, counted)
        yield calls


def counting_calls(monkeypatch: pytest.MonkeyPatch, module, *names: str):
    return counting(monkeypatch, [(module, name, name) for name in names])


def source(folder: Path) -> ModelSource:
    return ModelSource(path=str(folder), device="cpu", dtype="float32")


def open_directly(folder: Path) -> None:
    handle = open_model(source(folder))
    assert isinstance(handle.model, DSLModel) and handle.tokenizer is not None and handle.context == 64


def open_for_serve(folder: Path) -> None:
    served = open_serve_app(ServeSettings(source=source(folder)))
    assert served.app.state.service.context == 64 and served.app.state.service.engine.context == 64


def run_generate_once(folder: Path) -> None:
    seen: list[dict] = []
    settings = GenerateSettings(source=source(folder), config=SDEConfig(nfe=2, gen_length=4, top_m=8),
                                prompts=("a b",), progress=False)
    assert run_generate(settings, echo=seen.append) == 0
    assert [r["index"] for r in seen] == [0] and "response" in seen[0]


OPENINGS = {"open_model": open_directly, "serve": open_for_serve, "generate": run_generate_once}


@pytest.mark.parametrize("opening", sorted(OPENINGS))
def test_opening_a_model_reads_each_of_its_files_once(folder, monkeypatch, opening):
    with counting_reads(folder, monkeypatch) as reads:
        OPENINGS[opening](folder)
    assert {name: reads.total[name] for name in MODEL_FILES} == dict.fromkeys(MODEL_FILES, 1)
    assert reads.ours and max(reads.ours.values()) == 1, dict(reads.ours)
    assert {"tokenizer.json", "tokenizer_config.json"} <= set(reads.ours)  # checked by us (once), then by transformers


@pytest.mark.parametrize("opening", sorted(OPENINGS))
def test_opening_a_model_resolves_device_and_dtype_once(folder, monkeypatch, opening):
    with counting_calls(monkeypatch, loading, "check_device", "resolve_dtype", "parse_dtype") as calls:
        OPENINGS[opening](folder)
    assert dict(calls) == {"check_device": 1, "resolve_dtype": 1}


def test_a_folder_opened_once_serves_every_loader(folder, monkeypatch):
    """`load_model` with an opened `CheckpointFolder`: nothing is read again, and the weights are those of a fresh
    load by path."""
    with counting_reads(folder, monkeypatch) as reads, CheckpointFolder(folder) as ckpt:
        assert "noise_embed.weight" in ckpt.files and ckpt.config()["model_type"] == "llada"
        assert loading.is_dsl_checkpoint(ckpt)
        model = loading.load_model(ckpt)
        again = loading.load_model(ckpt, backbone_only=True)
    # tokenizer_config.json: its added tokens, for the special ids config.json may leave out
    assert dict(reads.total) == {"model.safetensors": 1, "config.json": 1, "dsl_config.json": 1,
                                 "tokenizer_config.json": 1}
    fresh = loading.load_model(folder)
    assert isinstance(model, DSLModel) and not isinstance(again, DSLModel)
    for (k, v), (k2, v2) in zip(model.state_dict().items(), fresh.state_dict().items(), strict=True):
        assert k == k2 and torch.equal(v, v2)


@pytest.fixture(scope="module")
def model():
    return perturb_converter(tiny_dsl(seed=0, beta_init=1.3))


def test_the_snr_grid_is_built_once_per_config_across_a_sample_sde_call(model, monkeypatch):
    prompts = PromptBatch.from_lists([[1, 2, 3], [4, 5]], model.special.pad_id)
    with counting_calls(monkeypatch, config_mod, "snr_schedule") as calls:
        config = SDEConfig(nfe=6, gen_length=4, top_m=8)
        assert calls["snr_schedule"] == 1  # made with the config (its checks read it)
        sample_sde(model, prompts, config, generator=torch.Generator().manual_seed(0))
        sample_sde(model, prompts, config, generator=torch.Generator().manual_seed(1))
        blocks = SDEConfig(nfe=6, gen_length=4, top_m=8, block_length=2)
        sample_block_sde(model, prompts, blocks, generator=torch.Generator().manual_seed(0))
        engine = Engine(model, max_rows=2)
        engine.submit(torch.tensor([1, 2, 3]), config, generator=torch.Generator().manual_seed(0))
        results = []
        while len(engine):
            results += engine.step()
        assert len(results) == 1 and results[0].error is None
    assert calls["snr_schedule"] == 2  # one per config, however many runs read it
    assert config.snr_grid == tuple(config_mod.snr_schedule("sensitive", 3).tolist())


def test_each_config_has_its_own_grid():
    short, long = SDEConfig(nfe=4), SDEConfig(nfe=8, schedule="uniform")
    assert len(short.snr_grid) == 3 and len(long.snr_grid) == 5
    assert short.replace(nfe=8, schedule="uniform").snr_grid == long.snr_grid
    assert short.snr_grid != long.snr_grid[:3]


# -- the context check: once per request ---------------------------------------------------------------------------

def counting_context_checks(monkeypatch: pytest.MonkeyPatch):
    """Counts the samplers' and the engine's own context checks (`check_context_fits`, wherever it is called from)
    and the entry check of `generate` (`check_prompt_lengths`)."""
    import dsl_llada.generate.generate_command as generate_command
    import dsl_llada.sampling.common as common
    import dsl_llada.sampling.engine as engine_mod

    return counting(monkeypatch, [(common, "check_context_fits", "sampler"),
                                  (engine_mod, "check_context_fits", "engine"),
                                  (generate_command, "check_prompt_lengths", "entry")])


@pytest.mark.parametrize("batching", ["continuous", "fixed"])
def test_generate_checks_each_prompts_context_once(folder, monkeypatch, batching):
    settings = GenerateSettings(source=source(folder), config=SDEConfig(nfe=2, gen_length=4, top_m=8),
                                prompts=("a b", "c"), progress=False, batching=batching, batch_size=2)
    with counting_context_checks(monkeypatch) as calls:
        assert run_generate(settings, echo=None) == 0
    assert dict(calls) == {"entry": 1}  # all prompts at once, before sampling; neither engine nor sampler again


def test_the_server_checks_a_requests_context_once(folder, monkeypatch):
    from fastapi.testclient import TestClient

    from dsl_llada.serve.app import create_app

    handle = open_model(source(folder))
    app = create_app(handle.model, handle.tokenizer, model_name="tiny", context=handle.context)
    chat = {"model": "tiny", "messages": [{"role": "user", "content": "a b"}], "max_tokens": 4, "nfe": 2, "seed": 0}
    with counting_context_checks(monkeypatch) as calls, TestClient(app) as c:
        assert c.post("/v1/chat/completions", json=chat).status_code == 200  # on the engine
        fixed = {**chat, "sampler": "block-sde", "block_length": 2, "kv_cache": "dual", "cache_refresh": 2}
        assert c.post("/v1/chat/completions", json=fixed).status_code == 200  # a fixed-batch call
        too_long = {**chat, "max_tokens": 64}
        r = c.post("/v1/chat/completions", json=too_long)
    assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"
    assert dict(calls) == {}  # the service's own check at the request's entry is the only one


def test_a_library_call_still_checks_its_context(model, monkeypatch):
    """Without a caller's check, the sampler and the engine check the context themselves; a batch marked checked
    is not checked again."""
    config = SDEConfig(nfe=2, gen_length=4, top_m=8)
    with counting_context_checks(monkeypatch) as calls:
        sample_sde(model, PromptBatch.from_lists([[1, 2, 3]], model.special.pad_id), config,
                   generator=torch.Generator().manual_seed(0))
        assert dict(calls) == {"sampler": 1}
        sample_sde(model, PromptBatch.from_lists([[1, 2, 3]], model.special.pad_id, context_checked=True), config,
                   generator=torch.Generator().manual_seed(0))
        assert dict(calls) == {"sampler": 1}
        engine = Engine(model, max_rows=1, context=8)
        with pytest.raises(ValueError, match=r"prompt length 5 \+ gen_length 4 = 9 tokens exceeds the model's "
                                             r"context of 8; .* at most 3"):
            engine.submit([1, 2, 3, 4, 5], config)
        engine.submit([1, 2, 3, 4], config, context_checked=True)
        assert dict(calls) == {"sampler": 1, "engine": 1}


def test_the_ui_trace_checks_the_context_only_when_its_caller_has_not(folder, monkeypatch):
    from dsl_llada.serve.trace import run_traced

    handle = open_model(source(folder))
    model, tok = handle.model, handle.tokenizer
    config = SDEConfig(nfe=2, gen_length=4, top_m=8)
    with counting_context_checks(monkeypatch) as calls:
        run_traced(model, tok, [1, 2, 3], "sde", config, 0, context_checked=True)
        assert dict(calls) == {}
        run_traced(model, tok, [1, 2, 3], "sde", config, 0)
        assert dict(calls) == {"sampler": 1}
