"""Property-based tests (Hypothesis) of the reliability contract (docs/reliability.md) on hostile input, where users
supply it: the request bodies of both HTTP endpoints, the prompts-file reader, `key=value` overrides and a model's
config.json. The property: a 4xx JSON error (HTTP) or exit code 2 with one `error:` line (CLI) — never a traceback,
a hang or a 5xx — and nothing written on refusal.

CI runs the "ci" profile (tests/conftest.py: 25 examples per property); the longer search is
`python -m pytest tests/test_properties.py --hypothesis-profile=long` (1000 per property)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from unittest import mock

import pytest
from fastapi.testclient import TestClient
from faults_helpers import error_lines, make_backbone_dir
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from serve_helpers import save_tiny_toy_dsl

import dsl_llada.core.loading as loading
from dsl_llada.cli.main import main
from dsl_llada.core.loading import check_prompt_texts, load_model, load_tokenizer, read_prompts

pytestmark = pytest.mark.usefixtures("one_thread")
FIXTURES = [HealthCheck.function_scoped_fixture]  # tmp_path is shared by the examples; each cleans up after itself

# -- hostile values -------------------------------------------------------------------------------------------------
ANY_CHAR = st.one_of(st.characters(), st.characters(categories=["Cs", "Cc"]))  # lone surrogates, controls too
TEXT = st.one_of(st.text(ANY_CHAR, max_size=40), st.sampled_from(["", " ", "x\ud800y", "\udced", "\x00", "<|mdm_mask|>",
                                                                  "\u202e", "a" * 3000]))
NUMBERS = st.one_of(st.integers(), st.integers(-3, 70), st.floats(allow_nan=True, allow_infinity=True),
                    st.sampled_from([0, -1, 2**63, 2**64, 10**400, 1e308, -0.0]))
SCALARS = st.one_of(st.none(), st.booleans(), NUMBERS, TEXT)
JSON_VALUES = st.recursive(SCALARS, lambda kids: st.one_of(st.lists(kids, max_size=4),
                                                          st.dictionaries(TEXT, kids, max_size=4)), max_leaves=8)


def maybe(good: st.SearchStrategy) -> st.SearchStrategy:
    """A value that is often acceptable, otherwise anything JSON can hold."""
    return st.one_of(good, JSON_VALUES)


# -- HTTP request bodies ----------------------------------------------------------------------------------------------
SAMPLING = {
    "model": maybe(st.just("tiny")), "max_tokens": maybe(st.integers(1, 6)), "n": maybe(st.integers(1, 2)),
    "seed": maybe(st.integers(0, 2**63 - 1)), "stop": maybe(st.lists(TEXT, max_size=5)),
    "temperature": maybe(st.floats(0, 2)), "top_p": maybe(st.just(1)), "stream": maybe(st.booleans()),
    "sampler": maybe(st.sampled_from(["sde", "block-sde", "remask", "remdm"])), "nfe": maybe(st.integers(1, 8)),
    "steps": maybe(st.integers(1, 8)), "gen_length": maybe(st.integers(1, 6)), "block_length": maybe(st.integers(0, 6)),
    "eta": maybe(st.floats(0, 1)), "kv_cache": JSON_VALUES, "schedule": maybe(st.sampled_from(["paper", "uniform"])),
    "gamma_max": NUMBERS, "cfg_scale": NUMBERS, "stream_options": JSON_VALUES, "user": JSON_VALUES,
}
MESSAGE = st.fixed_dictionaries({"role": maybe(st.sampled_from(["system", "user", "assistant"])),
                                 "content": st.one_of(TEXT, JSON_VALUES,
                                                      st.lists(st.fixed_dictionaries({"type": maybe(st.just("text")),
                                                                                      "text": TEXT}), max_size=3))},
                                optional={"name": JSON_VALUES, "extra": JSON_VALUES})
CHAT = st.fixed_dictionaries({"messages": maybe(st.lists(MESSAGE, min_size=1, max_size=3))},
                             optional={**SAMPLING, "logprobs": maybe(st.booleans()), "top_logprobs": maybe(st.integers(0, 3)),
                                       "max_completion_tokens": maybe(st.integers(1, 6))})
COMPLETION = st.fixed_dictionaries({"prompt": maybe(st.one_of(TEXT, st.lists(TEXT, max_size=3),
                                                              st.lists(st.integers(-5, 200), max_size=8)))},
                                   optional={**SAMPLING, "chat_template": maybe(st.booleans()),
                                             "logprobs": maybe(st.integers(0, 5)), "echo": maybe(st.booleans())})
UNKNOWN = st.dictionaries(TEXT, JSON_VALUES, max_size=3)


def body_bytes(body: object, how: str) -> bytes:
    if how == "ascii":  # lone surrogates become \ud800 escapes: valid JSON text
        return json.dumps(body, allow_nan=True).encode()
    return json.dumps(body, allow_nan=True, ensure_ascii=False).encode("utf-8", "surrogatepass")  # invalid UTF-8


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    from dsl_llada.serve.app import create_app
    from dsl_llada.serve.limits import Limits

    path = save_tiny_toy_dsl(tmp_path_factory.mktemp("prop") / "tiny")
    model, tok = load_model(path), load_tokenizer(path)
    # small step and token limits: an accepted hostile request costs milliseconds
    limits = Limits.for_model(64, max_nfe=8, max_steps=8, max_tokens=8, max_prompt_tokens=60, max_body_bytes=1 << 16,
                              request_timeout_s=30.0)
    with TestClient(create_app(model, tok, model_name="tiny", limits=limits)) as c:
        yield c


def check_http(r) -> None:
    assert r.status_code == 200 or 400 <= r.status_code < 500, (r.status_code, r.text[:500])
    if r.status_code != 200:
        err = r.json()["error"]
        assert isinstance(err["message"], str) and err["message"] and "\n" not in err["message"], err
        assert "Traceback" not in r.text


@example(body={"messages": [{"role": "system", "content": "\ud800"}]}, extra={}, how="ascii")  # found: was a 500
@given(body=st.one_of(CHAT, JSON_VALUES), extra=UNKNOWN, how=st.sampled_from(["ascii", "utf8"]))
def test_chat_bodies_get_200_or_a_4xx_json_error(client, body, extra, how):
    if isinstance(body, dict):
        body = {**extra, **body}
    check_http(client.post("/v1/chat/completions", content=body_bytes(body, how),
                           headers={"content-type": "application/json"}))


@example(body={"prompt": "\ud800"}, extra={}, how="ascii")  # found: was a 500
@given(body=st.one_of(COMPLETION, JSON_VALUES), extra=UNKNOWN, how=st.sampled_from(["ascii", "utf8"]))
def test_completion_bodies_get_200_or_a_4xx_json_error(client, body, extra, how):
    if isinstance(body, dict):
        body = {**extra, **body}
    check_http(client.post("/v1/completions", content=body_bytes(body, how),
                           headers={"content-type": "application/json"}))


@example(raw=b"\x80", path="/v1/completions")  # found: a 400 without the error object
@given(raw=st.binary(max_size=300), path=st.sampled_from(["/v1/completions", "/v1/chat/completions"]))
def test_raw_bytes_bodies_get_a_4xx_json_error(client, raw, path):
    r = client.post(path, content=raw, headers={"content-type": "application/json"})
    check_http(r)


# -- the prompts-file reader ------------------------------------------------------------------------------------------
LINE = st.one_of(st.text(ANY_CHAR, max_size=30), JSON_VALUES.map(lambda v: json.dumps(v, allow_nan=True)),
                 st.fixed_dictionaries({"prompt": JSON_VALUES}).map(json.dumps),
                 st.fixed_dictionaries({"prompt": TEXT}).map(json.dumps))
ENCODINGS = st.sampled_from(["utf-8", "utf-16", "latin-1", "utf-8-sig", "utf-32"])
NEWLINES = st.sampled_from(["\n", "\r\n", "\r", ""])


@st.composite
def prompt_files(draw) -> bytes:
    """A prompts file's bytes: lines of text or JSON in some encoding, random bytes, or one over-long line."""
    kind = draw(st.sampled_from(["lines", "lines", "bytes", "long"]))
    if kind == "bytes":
        return draw(st.binary(max_size=400))
    if kind == "long":
        return b"x" * draw(st.integers(250, 300)) + draw(st.sampled_from([b"", b"\n"]))
    lines, nl, enc = draw(st.lists(LINE, max_size=6)), draw(NEWLINES), draw(ENCODINGS)
    return nl.join(lines).encode(enc, "surrogatepass" if enc.startswith("utf") else "replace")


@settings(suppress_health_check=FIXTURES)
@given(data=prompt_files(), suffix=st.sampled_from([".jsonl", ".json", ".txt"]))
def test_the_prompts_reader_returns_text_or_one_line_naming_the_file(tmp_path, data, suffix):
    path = tmp_path / f"prompts{suffix}"
    path.write_bytes(data)
    # a 256-byte line limit, so over-long lines are part of the search at no cost
    with mock.patch.object(loading, "MAX_PROMPT_LINE_BYTES", 256):
        try:
            prompts = read_prompts(path)
            check_prompt_texts(prompts)
        except ValueError as e:
            msg = str(e)
            assert "\n" not in msg and msg, msg
            assert str(path) in msg or msg.startswith(("prompt ", "prompts ")), msg
            return
    assert all(isinstance(p, str) and p.strip() for p in prompts)
    assert all(p.encode("utf-8") for p in prompts)  # every accepted prompt is text


@pytest.fixture(scope="module")
def tiny_dsl(tmp_path_factory):
    root = tmp_path_factory.mktemp("cli")
    assert main(["convert", str(make_backbone_dir(root / "backbone")), str(root / "dsl"), "--noise-dim", "8"]) == 0
    return root / "dsl"


def cli(capsys, argv: list[str]) -> tuple[int, list[str]]:
    capsys.readouterr()
    rc = main(argv)
    return rc, error_lines(capsys.readouterr().err)


@settings(suppress_health_check=FIXTURES)
@given(data=prompt_files(), suffix=st.sampled_from([".jsonl", ".json", ".txt"]))
def test_generate_on_a_hostile_prompts_file_exits_0_or_2_and_writes_nothing_on_refusal(tiny_dsl, tmp_path, capsys,
                                                                                       data, suffix):
    work = tmp_path / "w"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir()
    prompts = work / f"p{suffix}"
    prompts.write_bytes(data)
    rc, errors = cli(capsys, ["generate", "--model", str(tiny_dsl), "--prompts-file", str(prompts), "--output",
                              str(work / "o.jsonl"), "--sampler", "remask", "--steps", "1", "--gen-length", "2", "-q"])
    assert rc in (0, 2), errors
    if rc == 2:
        assert len(errors) == 1 and errors[0].startswith("error: "), errors
        assert sorted(p.name for p in work.iterdir()) == [prompts.name]


# -- key=value overrides ----------------------------------------------------------------------------------------------
TOY = Path(__file__).resolve().parents[1] / "configs" / "toy.yaml"
KEYS = st.one_of(st.sampled_from(["lr", "max_steps", "seed", "data.block_size", "data.files", "tokenizer", "init_from",
                                  "per_device_batch_size", "keep_last", "snr.mean", "objective", "betas", "eps",
                                  "warmup_steps", "model.converter.noise_dim", "data", "model", "resume"]),
                 st.text(ANY_CHAR, max_size=12))
VALUES = st.one_of(st.text(ANY_CHAR, max_size=20), JSON_VALUES.map(lambda v: json.dumps(v, allow_nan=True)),
                   st.sampled_from(["1e-4", "nan", "inf", "-1", "[1,", "{a: 1}", "yes", "null", "0x10", "1e400"]))


@settings(suppress_health_check=FIXTURES)
@example(overrides=["data.files=0"])  # found: a traceback
@given(overrides=st.lists(st.one_of(st.tuples(KEYS, VALUES).map("=".join), st.text(ANY_CHAR, max_size=10))
                          .filter(lambda o: not o.startswith("-")), min_size=1, max_size=3))  # '-x' is an option
def test_train_overrides_exit_0_or_2_with_one_line_and_write_nothing(tmp_path, capsys, overrides):
    out = tmp_path / "run"
    rc, errors = cli(capsys, ["train", "--config", str(TOY), f"output_dir={out}", *overrides, "--print-config"])
    assert rc in (0, 2), errors
    if rc == 2:
        assert len(errors) == 1 and errors[0].startswith("error: "), errors
    assert not out.exists()


# -- a model's config.json --------------------------------------------------------------------------------------------
FIELDS = ["d_model", "n_heads", "n_kv_heads", "n_layers", "mlp_hidden_size", "mlp_ratio", "vocab_size", "embedding_size",
          "max_sequence_length", "rope_theta", "rms_norm_eps", "mask_token_id", "eos_token_id", "bos_token_id",
          "pad_token_id", "eot_token_id", "activation_type", "block_type", "layer_norm_type", "model_type", "rope",
          "weight_tying", "include_bias", "alibi", "scale_logits", "architectures"]


@settings(suppress_health_check=FIXTURES)
@example(changes={"d_model": None}, drop=[])  # found: a traceback
@example(changes={"model_type": []}, drop=[])  # found: a traceback
@given(changes=st.dictionaries(st.one_of(st.sampled_from(FIELDS), TEXT), JSON_VALUES, min_size=1, max_size=3),
       drop=st.lists(st.sampled_from(FIELDS), max_size=2))
def test_a_hostile_model_config_exits_0_or_2_with_one_line(tiny_dsl, tmp_path, capsys, changes, drop):
    model = tmp_path / "m"
    shutil.rmtree(model, ignore_errors=True)
    shutil.copytree(tiny_dsl, model)
    cfg = json.loads((model / "config.json").read_text())
    for k in drop:
        cfg.pop(k, None)
    cfg.update(changes)
    (model / "config.json").write_text(json.dumps(cfg, allow_nan=True))
    rc, errors = cli(capsys, ["generate", "--model", str(model), "--prompt", "the ocean", "--sampler", "remask",
                              "--steps", "1", "--gen-length", "2", "-q"])
    assert rc in (0, 2), errors
    if rc == 2:
        assert len(errors) == 1 and errors[0].startswith("error: "), errors
