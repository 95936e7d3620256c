"""logprobs / top_logprobs from the sampler's final distribution (both endpoints, streams, the official client), and
the streamed denoising protocol (committed vs provisional positions, step, SNR / time)."""

from __future__ import annotations

import json
import math

import pytest
import torch
from fastapi.testclient import TestClient
from serve_helpers import save_tiny_toy_dsl, uvicorn_server

from dsl_llada.config import SDEConfig
from dsl_llada.core.loading import encode_prompt, load_model, load_tokenizer
from dsl_llada.sampling import PromptBatch, sample_sde
from dsl_llada.serve.app import create_app

pytestmark = pytest.mark.usefixtures("one_thread")

PROMPT = "write about the ocean ."


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = save_tiny_toy_dsl(tmp_path_factory.mktemp("lp") / "tiny")
    return load_model(path), load_tokenizer(path)


def chat(**extra) -> dict:
    return {"model": "tiny", "messages": [{"role": "user", "content": PROMPT}], "max_tokens": 10, "seed": 3, **extra}


def events(lines) -> list:
    return [json.loads(x[6:]) if x[6:] != "[DONE]" else "[DONE]" for x in lines if x.startswith("data: ")]


@pytest.mark.parametrize("fields", [{"nfe": 6}, {"sampler": "remask", "steps": 5},
                                    {"sampler": "remask", "steps": 10, "temperature": 1.0},
                                    {"sampler": "block-sde", "block_length": 5, "nfe": 2}])
def test_chat_logprobs_are_the_final_distribution_and_change_no_token(tiny, fields):
    model, tok = tiny
    with TestClient(create_app(model, tok, model_name="tiny")) as c:
        plain = c.post("/v1/chat/completions", json=chat(**fields)).json()
        r = c.post("/v1/chat/completions", json=chat(logprobs=True, top_logprobs=3, **fields)).json()
    assert r["choices"][0]["message"] == plain["choices"][0]["message"] and plain["choices"][0]["logprobs"] is None
    content = r["choices"][0]["logprobs"]["content"]
    assert len(content) == r["usage"]["completion_tokens"] > 0
    special = set(tok.all_special_tokens)  # logprobs list every token; the text skips special ones
    assert "".join(e["token"] for e in content if e["token"] not in special).replace(" ", "") == \
        r["choices"][0]["message"]["content"].replace(" ", "")
    for e in content:
        tops = [t["logprob"] for t in e["top_logprobs"]]
        assert len(tops) == 3 and tops == sorted(tops, reverse=True) and all(v <= 0 for v in tops)
        assert e["logprob"] <= 0 and e["bytes"] == list(e["token"].encode())
        if fields.get("temperature", 0) == 0:  # greedy: the committed token is the distribution's argmax
            assert e["logprob"] == tops[0] and e["top_logprobs"][0]["token"] == e["token"]
        else:
            assert e["logprob"] <= tops[0]


def test_sde_logprobs_equal_the_decode_pass_posterior(tiny):
    model, tok = tiny
    with TestClient(create_app(model, tok, model_name="tiny")) as c:
        r = c.post("/v1/chat/completions", json=chat(nfe=4, logprobs=True)).json()
    seen = []
    ids = encode_prompt(tok, PROMPT, chat_template=True)
    out = sample_sde(model, PromptBatch.from_lists([ids], pad_id=model.special.pad_id), SDEConfig(nfe=4, gen_length=10),
                     generator=torch.Generator().manual_seed(3), callback=lambda i: seen.append(i) if i.decode else None)
    logits = seen[0].logits[0].double()
    logits[:, model.special.mask] = -math.inf
    want = torch.log_softmax(logits, -1).gather(-1, out.ids[0].unsqueeze(-1)).squeeze(-1)
    got = [e["logprob"] for e in r["choices"][0]["logprobs"]["content"]]
    assert got == pytest.approx(want[: len(got)].tolist(), abs=1e-9)


def test_completion_logprobs_and_stream(tiny):
    model, tok = tiny
    body = {"model": "tiny", "prompt": PROMPT, "max_tokens": 8, "seed": 1, "sampler": "remask", "steps": 4,
            "logprobs": 2}
    with TestClient(create_app(model, tok, model_name="tiny")) as c:
        r = c.post("/v1/completions", json=body).json()
        with c.stream("POST", "/v1/completions", json={**body, "stream": True}) as s:
            ev = events(s.iter_lines())
    lp = r["choices"][0]["logprobs"]
    n = r["usage"]["completion_tokens"]
    assert len(lp["tokens"]) == len(lp["token_logprobs"]) == len(lp["top_logprobs"]) == len(lp["text_offset"]) == n
    assert all(len(t) == 2 and max(t.values()) == v for t, v in zip(lp["top_logprobs"], lp["token_logprobs"]))
    assert lp["text_offset"] == [sum(len(t) for t in lp["tokens"][:i]) for i in range(n)]
    streamed = [e["choices"][0]["logprobs"] for e in ev if isinstance(e, dict) and e["choices"]
                and e["choices"][0].get("logprobs")]
    assert streamed == [lp]


def test_stream_protocol_marks_committed_and_provisional_positions(tiny):
    model, tok = tiny
    with TestClient(create_app(model, tok, model_name="tiny")) as c:
        with c.stream("POST", "/v1/chat/completions", json=chat(sampler="remask", steps=5, stream=True)) as s:
            remask = [e["dsl_llada"]["denoising"] for e in events(s.iter_lines()) if isinstance(e, dict) and "dsl_llada" in e]
        with c.stream("POST", "/v1/chat/completions", json=chat(nfe=6, stream=True)) as s:
            sde = [e["dsl_llada"]["denoising"] for e in events(s.iter_lines()) if isinstance(e, dict) and "dsl_llada" in e]
    mask = model.special.mask
    assert [e["step"] for e in remask] == [1, 2, 3, 4, 5] \
        and [e["time"] for e in remask] == pytest.approx([0.8, 0.6, 0.4, 0.2, 0.0])
    for e in remask:  # committed = holds a token; provisional = still [MASK]; commitments never go back
        assert e["committed"] == [int(t != mask) for t in e["token_ids"]]
    assert all(a <= b for prev, cur in zip(remask, remask[1:]) for a, b in zip(prev["committed"], cur["committed"]))
    assert sum(remask[-1]["committed"]) == 10
    assert [e["step"] for e in sde] == [1, 2, 3] and all(e["committed"] == [0] * 10 and "snr" in e for e in sde)


def test_openai_client_reads_logprobs(tiny):
    openai = pytest.importorskip("openai", reason="pip install openai")
    model, tok = tiny
    with uvicorn_server(create_app(model, tok, model_name="tiny")) as (base, _):
        client = openai.OpenAI(base_url=f"{base}/v1", api_key="none", max_retries=0, timeout=60)
        full = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": PROMPT}],
                                              max_tokens=10, seed=3, logprobs=True, top_logprobs=2,
                                              extra_body={"nfe": 6})
        chunks = list(client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": PROMPT}],
                                                     max_tokens=10, seed=3, logprobs=True, stream=True,
                                                     extra_body={"nfe": 6}))
    content = full.choices[0].logprobs.content
    assert len(content) == full.usage.completion_tokens and len(content[0].top_logprobs) == 2
    streamed = [t.logprob for ch in chunks if ch.choices and ch.choices[0].logprobs for t in ch.choices[0].logprobs.content]
    assert streamed == [t.logprob for t in content]


def test_logprobs_follow_the_stop_cut(tiny):
    model, tok = tiny
    body = {"model": "tiny", "prompt": PROMPT, "max_tokens": 12, "seed": 2, "sampler": "remask", "steps": 12,
            "logprobs": 0}
    with TestClient(create_app(model, tok, model_name="tiny")) as c:
        r = c.post("/v1/completions", json=body)
        assert r.status_code == 200, r.text
        full = r.json()["choices"][0]
        words = full["text"].split()
        assert len(words) >= 4
        stop = " " + words[len(words) // 2]
        r = c.post("/v1/completions", json={**body, "stop": stop})
        assert r.status_code == 200, r.text
        cut = r.json()["choices"][0]
    assert cut["text"] == full["text"][: full["text"].find(stop)] and cut["finish_reason"] == "stop"
    n = len(cut["logprobs"]["tokens"])
    assert 0 < n < len(full["logprobs"]["tokens"])
    assert cut["logprobs"]["token_logprobs"] == full["logprobs"]["token_logprobs"][:n]


def test_recorder_maps_rows_that_remain_after_a_drop():
    """After row 1 left the batch, the step's tensors hold rows (0, 2): their logprobs land on rows 0 and 2."""
    from dsl_llada.sampling import StepInfo
    from dsl_llada.serve.logprobs import LogprobRecorder

    rec = LogprobRecorder(3, 2, 1, mask_id=3)
    logits = torch.tensor([[[0.0, 1.0, 2.0, 9.0], [2.0, 0.0, 0.0, 9.0]],
                           [[1.0, 1.0, 1.0, 9.0], [0.0, 3.0, 0.0, 9.0]]])
    tokens = torch.tensor([[2, 0], [0, 1]])
    everything = torch.ones(2, 2, dtype=torch.bool)
    rec(StepInfo(0, 1, tokens, committed=everything, newly_committed=everything, logits=logits, window=(0, 2),
                 rows=(0, 2)))
    lp = torch.log_softmax(logits[..., :3].double(), dim=-1)  # [MASK] (id 3) is excluded
    row0, row2 = rec.row(0, 2, 1), rec.row(2, 2, 1)
    assert [t.logprob for t in row0] == pytest.approx([lp[0, 0, 2].item(), lp[0, 1, 0].item()])
    assert [t.logprob for t in row2] == pytest.approx([lp[1, 0, 0].item(), lp[1, 1, 1].item()])
    assert row0[0].top[0][0] == 2 and row2[1].top[0][0] == 1
    assert math.isnan(rec.row(1, 2, 0)[0].logprob)  # the dropped row got nothing
