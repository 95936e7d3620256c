"""The remasking samplers' reused logits buffer: reused while nobody keeps a step's logits,
never overwriting logits a step callback kept (copy-on-keep), and the same values and tokens as fresh tensors."""

from __future__ import annotations

import importlib

import pytest
import torch

import dsl_llada.sampling.remask as remask_mod
from dsl_llada.core.backbones.llada import LLaDABackbone, tiny_llada_config
from dsl_llada.config import RemaskConfig
from dsl_llada.sampling.common import PromptBatch
from dsl_llada.sampling.positions import LogitsBuffer, block_logits
from dsl_llada.sampling.remask import sample_remask

PROMPTS = [[1, 2, 3], [4, 5, 6, 7, 8, 9, 10], [11, 12, 13, 14, 15]]
CONFIGS = {
    "greedy": RemaskConfig(steps=8, gen_length=16, block_length=8),
    "gumbel-cfg": RemaskConfig(steps=8, gen_length=16, temperature=1.0, cfg_scale=1.5),
    "remdm": RemaskConfig(steps=8, gen_length=16, temperature=1.0, remdm=True, remdm_alpha_loop=0.5),
}

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module", params=[torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def model(request) -> LLaDABackbone:
    m = LLaDABackbone(tiny_llada_config(vocab_size=64, d_model=32, n_layers=2))
    m.init_weights(torch.Generator().manual_seed(0), std=0.3)
    return m.to(request.param).eval()


def prompts(model) -> PromptBatch:
    return PromptBatch.from_lists(PROMPTS, model.special.pad_id)


def gens(seed: int) -> list[torch.Generator]:
    return [torch.Generator().manual_seed(seed + i) for i in range(len(PROMPTS))]


class Buffers(LogitsBuffer):
    """LogitsBuffer that records its instances (to count allocations)."""

    made: list[LogitsBuffer] = []

    def __init__(self) -> None:
        super().__init__()
        Buffers.made.append(self)


@pytest.fixture
def spy(monkeypatch):
    Buffers.made = []
    monkeypatch.setattr(remask_mod, "LogitsBuffer", Buffers)
    return Buffers.made


def test_buffer_reuses_its_storage_until_a_view_is_kept():
    buf = LogitsBuffer()
    a = buf.view(2, 3, 5, torch.device("cpu"))
    ptr = a.data_ptr()
    del a
    b = buf.view(1, 3, 5, torch.device("cpu"))  # fewer rows (a batch that lost rows): same storage
    assert b.data_ptr() == ptr and b.shape == (1, 3, 5) and buf.allocations == 1
    b.fill_(7.0)
    c = buf.view(2, 3, 5, torch.device("cpu"))  # `b` still alive: a fresh buffer, b keeps its values
    assert c.data_ptr() != ptr and buf.allocations == 2
    c.fill_(-1.0)
    assert bool((b == 7.0).all())
    del b, c
    d = buf.view(4, 3, 5, torch.device("cpu"))  # more elements than the buffer holds: grows
    assert d.shape == (4, 3, 5) and buf.allocations == 3


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_a_run_allocates_each_buffer_once_and_gives_the_fresh_tensor_tokens(model, spy, name):
    cfg = CONFIGS[name]
    seen = []
    out = sample_remask(model, prompts(model), cfg, generator=gens(5), callback=lambda i: seen.append(i.step))
    assert seen == list(range(cfg.steps))
    used = [b.allocations for b in spy]
    # bf16 logits are converted into the buffer every step; fp32 ones only at the steps where some block columns
    # are fully committed (remasking; ReMDM reads every column, so the head's own fp32 output is handed through):
    # wherever a buffer is used, it is allocated once and then reused
    uses = next(model.parameters()).dtype == torch.bfloat16 or not cfg.remdm
    assert used == [int(uses), int(uses and cfg.cfg_scale > 0)]
    # without the buffers (block_logits' fresh-tensor path): the same tokens
    real = remask_mod.block_logits

    def no_buffer(*a, **k):
        k["buffer"] = None
        return real(*a, **k)

    remask_mod.block_logits = no_buffer
    try:
        ref = sample_remask(model, prompts(model), cfg, generator=gens(5))
    finally:
        remask_mod.block_logits = real
    assert torch.equal(out.ids, ref.ids)
    if cfg.temperature > 0:  # a different seed changes the tokens: the comparison is not vacuous
        assert not torch.equal(sample_remask(model, prompts(model), cfg, generator=gens(6)).ids, out.ids)
    # without a callback the sampler must drop its own reference to a step's logits too (else every step allocates)
    spy.clear()
    assert torch.equal(sample_remask(model, prompts(model), cfg, generator=gens(5)).ids, out.ids)
    assert [b.allocations for b in spy] == used


@pytest.mark.parametrize("keep", ["tensor", "view", "numpy", "info"])
@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_a_callback_keeping_logits_across_steps_sees_them_unchanged(model, spy, name, keep):
    """Copy-on-keep: logits kept by a callback (as the tensor, a view, a numpy array or the whole StepInfo) keep
    the values they had during their step, and the tokens are those of a run whose callback keeps nothing."""
    cfg = CONFIGS[name]
    kept, snapshots = [], []

    def callback(info):
        snapshots.append(info.logits.clone())
        if keep == "tensor":
            kept.append(info.logits)
        elif keep == "view":
            kept.append(info.logits[:, 1:])
        elif keep == "numpy":
            kept.append(info.logits.numpy())  # shares the memory: the discrete samplers' logits are fp32
        else:
            kept.append(info)

    out = sample_remask(model, prompts(model), cfg, generator=gens(5), callback=callback)
    for k, snap in zip(kept, snapshots):
        now = {"tensor": lambda: k, "view": lambda: k, "numpy": lambda: torch.from_numpy(k),
               "info": lambda: k.logits}[keep]()
        assert torch.equal(now, snap[:, 1:] if keep == "view" else snap)
    assert len({s.nan_to_num(neginf=0.0).sum().item() for s in snapshots}) > 1  # the steps' logits differ: a shared buffer would show
    assert torch.equal(out.ids, sample_remask(model, prompts(model), cfg, generator=gens(5)).ids)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_block_logits_with_a_buffer_equals_fresh_and_zeroes_committed_columns(dtype):
    V, mask = 11, 10
    x = torch.tensor([[1, mask, 3, mask, mask, 2], [1, 4, mask, 5, mask, 2]])
    table = torch.randn(2, 6, V, generator=torch.Generator().manual_seed(0)).to(dtype)

    def forward(ids, attention_mask, positions):
        return table[:, positions]

    buf = LogitsBuffer()
    stale = buf.view(2, 5, V, torch.device("cpu"))
    stale.fill_(123.0)  # garbage from an earlier step must not leak into the committed columns
    del stale
    got = block_logits(forward, x, None, 1, 6, mask, masked_only=True, buffer=buf)
    ref = block_logits(forward, x, None, 1, 6, mask, masked_only=True)
    assert buf.allocations == 1 and got.dtype == ref.dtype == torch.float32
    assert torch.equal(got, ref)
    assert bool((got[:, 4] == 0).all()) and torch.equal(got[:, 0], table[:, 1].float())  # column 4: no mask
    del got
    full = block_logits(forward, x, None, 1, 6, mask, masked_only=False, buffer=buf)
    assert torch.equal(full, table[:, 1:6].float()) and buf.allocations == 1
    # bf16: converted into the buffer; fp32: the head's own output is the result (nothing to copy)
    ptr = full.data_ptr()
    del full
    assert (buf.view(1, 1, 1, torch.device("cpu")).data_ptr() == ptr) == (dtype == torch.bfloat16)
    assert buf.allocations == 1


@pytest.mark.parametrize("shape,chunk_rows", [((2, 5, 64), 3), ((2, 5, 64), 64), ((1, 7, 33), 2)])
def test_row_argmax_logsumexp_equals_the_whole_tensor_calls_bit_for_bit(monkeypatch, shape, chunk_rows):
    """The greedy remasking step's argmax and float64 logsumexp in one sweep over row chunks: the same values as the
    whole-tensor calls, bit for bit, with banned (-inf) ids, ties and a NaN row (argmax of a NaN row: the NaN)."""
    rs = importlib.import_module("dsl_llada.sampling.remask_step")  # the module (the package exports the function)
    monkeypatch.setattr(rs, "LSE_CHUNK_BYTES", chunk_rows * shape[-1] * 8)  # float64 rows
    x = torch.randn(shape, generator=torch.Generator().manual_seed(shape[-1])) * 5
    x[..., 2] = float("-inf")
    x[0, 0, 5] = x[0, 0, 9] = 100.0  # a tie: the first index wins in both
    x[0, 1, 4] = float("nan")
    idx, lse = rs.row_argmax_logsumexp(x)
    want_idx, want_lse = x.argmax(dim=-1), torch.logsumexp(x.double(), dim=-1)
    assert torch.equal(idx, want_idx) and int(idx[0, 0]) == 5 and int(idx[0, 1]) == 4
    assert torch.equal(lse.isnan(), want_lse.isnan()) and bool(lse[0, 1].isnan())
    assert torch.equal(torch.nan_to_num(lse), torch.nan_to_num(want_lse))
    # only at the selected rows (the step's masked positions): the same values there, +inf at the others
    rows = torch.zeros(shape[:-1], dtype=torch.bool)
    rows[0, 0] = rows[-1, -1] = True
    idx_r, lse_r = rs.row_argmax_logsumexp(x, rows)
    assert torch.equal(idx_r, want_idx) and lse_r.dtype == torch.float64
    assert torch.equal(lse_r[rows], want_lse[rows]) and bool((lse_r[~rows] == float("inf")).all())
    assert torch.equal(rs.row_logsumexp(x, rows), lse_r)
