"""The paper's precision recipe: `--dtype auto` picks bf16 only where bf16 is native (GPU, AMX / AVX512-BF16 CPUs),
and in bf16 the converter softmax, the posterior mean and the SDE state stay fp32."""

from __future__ import annotations

import json

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import dsl_llada.core.loading as loading
from dsl_llada.cli.main import build_parser, main
from dsl_llada.config import SDEConfig
from dsl_llada.core.converter import posterior_mean
from dsl_llada.core.model import DSLModel, cast_for_inference
from dsl_llada.cli.flags import model_source_from_args
from dsl_llada.sampling import PromptBatch, sample_sde
from dsl_llada.sampling.denoiser import Denoiser
from helpers import perturb_converter, tiny_dsl, toy_backbone_folder


@pytest.mark.parametrize("native, expected", [(True, torch.bfloat16), (False, torch.float32)])
def test_auto_dtype_follows_the_cpu_flags(monkeypatch, native, expected):
    monkeypatch.setattr(loading, "has_native_bf16", lambda: native)
    assert loading.auto_dtype("cpu") is expected
    assert loading.resolve_dtype(None, "cpu") is expected
    assert loading.resolve_dtype("auto", "cpu") is expected
    assert loading.auto_dtype("cuda") is torch.bfloat16  # a GPU always computes bf16 natively
    assert loading.auto_dtype("cuda:1") is torch.bfloat16
    # an explicit choice is never overridden by the hardware
    assert loading.resolve_dtype("float32", "cuda") is torch.float32
    assert loading.resolve_dtype("bf16", "cpu") is torch.bfloat16


def test_resolve_dtype_names_the_bad_value_and_the_choices():
    with pytest.raises(ValueError, match=r"dtype='fp8' is not valid; expected one of \['auto', 'bf16'"):
        loading.resolve_dtype("fp8", "cpu")
    with pytest.raises(ValueError, match="dtype='auto' is not valid"):  # parse_dtype itself stays explicit-only
        loading.parse_dtype("auto")


def test_dtype_defaults_of_the_commands():
    sub = build_parser()._subparsers._group_actions[0].choices
    for argv in (["generate", "--model", "m"], ["serve", "--model", "m"], ["lm-eval", "--model", "m", "--tasks", "t"]):
        assert model_source_from_args(build_parser().parse_args(argv)).dtype == "auto"  # ModelSource's default
    assert sub["demo"].get_default("dtype") == "float32"  # the documented toy tables are fp32
    assert "auto" in sub["generate"].format_help() and "native bf16" in sub["generate"].format_help()
    for name in ("float32", "bfloat16", "auto"):
        assert build_parser().parse_args(["demo", "--dtype", name]).dtype == name
    with pytest.raises(SystemExit):
        build_parser().parse_args(["demo", "--dtype", "float16"])


@pytest.fixture(scope="module")
def backbone_dir(tmp_path_factory):
    return toy_backbone_folder(tmp_path_factory.mktemp("precision") / "backbone")


@pytest.mark.parametrize("native, recorded", [(False, "float32"), (True, "bfloat16")])
def test_generate_loads_and_records_the_resolved_dtype(backbone_dir, tmp_path, monkeypatch, native, recorded):
    monkeypatch.setattr(loading, "has_native_bf16", lambda: native)
    loaded = []
    real_load = loading._load_checked  # the weights step open_model runs (the dtype it loads with)
    monkeypatch.setattr(loading, "_load_checked", lambda *a, **kw: loaded.append(kw["dtype"]) or real_load(*a, **kw))
    out = tmp_path / "out.jsonl"
    assert main(["generate", "--model", str(backbone_dir), "--prompt", "the whale", "--sampler", "remask",
                 "--steps", "2", "--gen-length", "4", "-q", "--output", str(out)]) == 0
    assert loaded == [getattr(torch, recorded)]
    assert json.loads((tmp_path / "out.jsonl.config.json").read_text())["dtype"] == recorded
    assert json.loads(out.read_text().splitlines()[0])["length"] <= 4


def test_generate_refuses_an_unknown_dtype(capsys):
    with pytest.raises(SystemExit) as e:
        main(["generate", "--model", "m", "--prompt", "x", "--dtype", "fp8"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "--dtype: invalid choice: 'fp8' (choose from " in err  # the quoting of the choices varies by Python
    assert all(name in err.split("choose from ")[1] for name in ("auto", "bfloat16", "float16", "float32"))


def test_to_compute_dtype_keeps_the_fp32_islands():
    model = tiny_dsl(seed=0).to_compute_dtype(torch.bfloat16)
    assert {p.dtype for p in model.backbone.parameters()} == {torch.bfloat16}
    assert model.converter.backbone_embedding.weight.dtype is torch.bfloat16
    assert model.noise_embed.weight.dtype is torch.float32
    assert model.converter.beta.dtype is torch.float32 and model.converter.logit_bias.dtype is torch.float32
    # the demo's cast: DSL models keep their islands, a bare backbone is cast whole
    bb = cast_for_inference(tiny_dsl(seed=0).backbone, torch.bfloat16)
    assert {p.dtype for p in bb.parameters()} == {torch.bfloat16}
    assert isinstance(cast_for_inference(tiny_dsl(seed=0), torch.bfloat16), DSLModel)


def test_posterior_mean_of_bf16_logits_is_fp32():
    logits = torch.randn(2, 3, 40, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    E = torch.nn.functional.normalize(torch.randn(40, 8, generator=torch.Generator().manual_seed(1)), dim=-1)
    for m in (0, 8):
        out = posterior_mean(logits, E, top_m=m)
        assert out.dtype is torch.float32 and out.shape == (2, 3, 8)
        ref = posterior_mean(logits.float(), E, top_m=m)  # same bf16 values read in fp32: the same result
        assert torch.allclose(out, ref, atol=1e-6)


def test_sde_in_bf16_keeps_state_softmax_and_posterior_in_fp32(monkeypatch):
    model = perturb_converter(tiny_dsl(seed=0, beta_init=1.3)).to_compute_dtype(torch.bfloat16)
    seen: dict[str, set] = {"y": set(), "e": set(), "logits": set(), "slots": set(), "softmax_in": set()}
    call = Denoiser.__call__

    def spy(self, y, gamma):
        e, logits = call(self, y, gamma)
        seen["y"].add(y.dtype)
        seen["e"].add(e.dtype)
        seen["logits"].add(logits.dtype)
        seen["slots"].update(b.dtype for b in self.workspace._buffers.values())
        return e, logits

    monkeypatch.setattr(Denoiser, "__call__", spy)
    real_softmax = torch.softmax

    def softmax_spy(x, *args, **kw):
        seen["softmax_in"].add(x.dtype)
        return real_softmax(x, *args, **kw)

    import dsl_llada.core.converter as conv

    monkeypatch.setattr(conv.torch, "softmax", softmax_spy)
    prompts = PromptBatch.from_lists([[1, 2, 3], [4, 5]], model.special.pad_id)
    out = sample_sde(model, prompts, SDEConfig(nfe=4, gen_length=6, top_m=8),
                     generator=torch.Generator().manual_seed(0))
    assert out.ids.shape == (2, 6)
    assert seen["y"] == {torch.float32}  # the SDE state
    assert seen["e"] == {torch.float32}  # the posterior mean
    assert seen["logits"] == {torch.bfloat16}  # the backbone really ran in bf16
    assert seen["slots"] == {torch.float32}  # the converter's (N, V+1) slot logits / softmax buffer
    assert seen["softmax_in"] == {torch.float32}  # every softmax (converter and posterior) reads fp32


class _Allocations(TorchDispatchMode):
    """Every tensor an aten op produces on a real device: (op, dtype, numel)."""

    def __init__(self):
        super().__init__()
        self.seen: list[tuple[str, torch.dtype, int]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in (out if isinstance(out, (tuple, list)) else (out,)):
            if isinstance(t, torch.Tensor) and t.device.type != "meta":
                self.seen.append((str(func), t.dtype, t.numel()))
        return out


def test_sharded_bf16_checkpoint_loads_without_an_fp32_copy(tmp_path):
    """A bf16 checkpoint in several shards loads in bf16 without any fp32 tensor of a weight matrix's size (no fp32
    copy of the weights, no fp32 converter allocated and initialised only to be replaced)."""
    model = tiny_dsl(vocab=512, seed=0, backbone_kw={"d_model": 64}).to_compute_dtype(torch.bfloat16)
    folder = tmp_path / "bf16"
    model.save_pretrained(folder, max_shard_bytes=40_000)
    assert len(list(folder.glob("*.safetensors"))) >= 3  # really sharded
    big = 512 * 64  # the embedding, head and converter value matrices
    with _Allocations() as mode:
        loaded = DSLModel.from_pretrained(folder, dtype=torch.bfloat16)
    fp32_big = [(op, n) for op, dt, n in mode.seen if dt == torch.float32 and n >= big]
    assert fp32_big == []
    assert loaded.converter.backbone_embedding.weight.dtype is torch.bfloat16
    assert loaded.noise_embed.weight.dtype is torch.float32 and loaded.converter.beta.dtype is torch.float32
    for k, v in model.full_state_dict().items():  # the same tensors came back
        assert torch.equal(loaded.full_state_dict()[k], v), k
    # the twin: loading the same checkpoint in fp32 does create fp32 weight matrices (the probe sees them)
    with _Allocations() as mode:
        DSLModel.from_pretrained(folder, dtype=torch.float32)
    assert any(dt == torch.float32 and n >= big for _, dt, n in mode.seen)


def test_converter_memory_stays_chunked_at_batch_8():
    """8 sequences x 128 response positions: the (rows, V+1) fp32 slot buffer holds token_chunk rows, never all 1024;
    the output equals the unchunked map."""
    model = tiny_dsl(vocab=300, seed=0, token_chunk=256)
    z = torch.randn(8, 128, 16, generator=torch.Generator().manual_seed(0)) * 4
    from dsl_llada.core.converter import aligned_slots
    from dsl_llada.core.numerics import Workspace

    ws = Workspace()
    with torch.no_grad():
        h = model.converter(z, model.unit_noise(), 2.0, workspace=ws)
        whole = tiny_dsl(vocab=300, seed=0, token_chunk=0).converter(z, model.unit_noise(), 2.0)
    assert [tuple(b.shape) for b in ws._buffers.values()] == [(256, aligned_slots(301, 256))]  # 304: aligned rows
    assert h.shape == (8, 128, model.backbone.hidden_size)
    assert torch.allclose(h, whole, atol=1e-6)


def test_posterior_mean_reuses_one_fp32_buffer_for_bf16_logits():
    from dsl_llada.core.numerics import Workspace

    E = torch.nn.functional.normalize(torch.randn(600, 8, generator=torch.Generator().manual_seed(1)), dim=-1)
    ws = Workspace()
    ptrs = set()
    for seed in (0, 1, 2):
        logits = (3 * torch.randn(2, 5, 600, generator=torch.Generator().manual_seed(seed))).to(torch.bfloat16)
        out = posterior_mean(logits, E, top_m=16, chunk=4, workspace=ws)
        assert torch.equal(out, posterior_mean(logits, E, top_m=16, chunk=4))  # the buffer changes no value
        ptrs.update(b.data_ptr() for name, b in ws._buffers.items() if name.startswith("posterior"))
    assert len(ptrs) == 1  # one (chunk, V) buffer (the last 2-row chunk uses its first rows), reused by every call
    posterior_mean(logits.float(), E, top_m=16, workspace=(ws32 := Workspace()))
    assert ws32._buffers == {}  # fp32 logits are read in place: no copy, no buffer
