"""The web UI in a real browser: headless Chromium (Debian package) driven by Playwright types a prompt, runs
DSL-SDE and LLaDA remasking side by side, and the final texts must equal the library's for the same seed and
settings; the live grid must have one row per step. Also the trace recorder without a browser."""

from __future__ import annotations

import shutil

import pytest
import torch
from serve_helpers import library_ids, library_text, save_tiny_toy_dsl, uvicorn_server

from dsl_llada.config import RemaskConfig, SDEConfig
from dsl_llada.core.loading import encode_prompt, load_model, load_tokenizer

# one intra-op thread (conftest): a busy 2-core CPU makes spinning OpenMP threads ~100x slower on tiny models
pytestmark = pytest.mark.usefixtures("one_thread")

PROMPT = "describe the forest ."


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = save_tiny_toy_dsl(tmp_path_factory.mktemp("ui") / "model")
    return load_model(path), load_tokenizer(path)


@pytest.mark.parametrize("sampler,config", [("sde", SDEConfig(nfe=6, gen_length=10)),
                                            ("block-sde", SDEConfig(nfe=2, gen_length=10, block_length=5)),
                                            ("remask", RemaskConfig(steps=5, gen_length=10))])
def test_trace_matches_library_and_records_every_step(tiny, sampler, config):
    from dsl_llada.serve.trace import render_grid, run_traced

    model, tok = tiny
    ids = encode_prompt(tok, PROMPT)
    seen: list[int] = []
    trace = run_traced(model, tok, ids, sampler, config, seed=7, on_step=lambda t: seen.append(len(t.steps)))
    assert trace.text == library_text(model, tok, PROMPT, sampler, config, 7)
    total = config.steps if sampler == "remask" else (config.gen_length // (config.block_length or config.gen_length)) * config.steps
    rows = total + (sampler != "remask")  # the SDE's final decoding pass is shown as one more row
    assert len(trace.steps) == rows and seen == list(range(1, rows + 1))
    assert trace.forward_passes == (config.steps if sampler == "remask" else total * 2 + total // config.steps)
    for st in trace.steps:
        assert len(st.tokens) == len(st.confidence) == len(st.masked) == config.gen_length
        assert all(0.0 <= c <= 1.0 for c in st.confidence)
    if sampler == "remask":  # masks only ever resolve, and all are resolved at the end
        n_masked = [sum(st.masked) for st in trace.steps]
        assert n_masked == sorted(n_masked, reverse=True) and n_masked[-1] == 0
        assert trace.steps[0].label.startswith("t ")
    else:
        assert trace.steps[-2].label.startswith("SNR ") and trace.steps[-1].label == "final"
        assert not any(trace.steps[-1].masked)
    # the last row shows the final tokens (before EOS truncation)
    final = library_ids(model, tok, PROMPT, sampler, config, 7)
    assert tok.convert_tokens_to_ids(trace.steps[-1].tokens[: len(final)]) == final
    grid = render_grid(trace)
    assert grid.count("<tr>") == 1 + min(rows, 64) and grid.count("<td") == config.gen_length * min(rows, 64)


def test_trace_seed_changes_sde_output(tiny):
    from dsl_llada.serve.trace import run_traced

    model, tok = tiny
    ids = encode_prompt(tok, PROMPT)
    cfg = SDEConfig(nfe=4, gen_length=10, eta=1.0)
    a, b = (run_traced(model, tok, ids, "sde", cfg, seed=s) for s in (1, 2))
    assert [st.tokens for st in a.steps] != [st.tokens for st in b.steps]


def _chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.mark.skipif(_chromium() is None, reason="no system Chromium (apt-get install -y chromium); .ci/run installs it")
def test_ui_in_headless_chromium(tiny, tmp_path):
    playwright = pytest.importorskip("playwright.sync_api", reason="playwright is not installed (pip install playwright)")
    from dsl_llada.serve.app import create_app
    from dsl_llada.serve.ui import mount_ui

    model, tok = tiny
    torch.manual_seed(0)
    app = mount_ui(create_app(model, tok, model_name="tiny"), model, tok, path="/ui")
    seed, length, nfe, steps = 5, 12, 8, 6
    want_a = library_text(model, tok, PROMPT, "sde", SDEConfig(nfe=nfe, gen_length=length), seed)
    want_b = library_text(model, tok, PROMPT, "remask", RemaskConfig(steps=steps, gen_length=length), seed)
    with uvicorn_server(app) as (base, _), playwright.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=_chromium(), args=["--no-sandbox"], headless=True)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.goto(f"{base}/ui/", wait_until="load", timeout=120_000)
            page.locator("#run").wait_for(timeout=120_000)  # (not "networkidle": the heartbeat stream stays open)
            page.locator("#prompt textarea").fill(PROMPT)
            for elem, value in (("seed", seed), ("gen-length", length), ("nfe-a", nfe), ("nfe-b", steps)):
                box = page.locator(f"#{elem} input")
                box.fill(str(value))
                box.blur()
            page.locator("#run").click()
            page.locator("#stats-b", has_text="done").wait_for(timeout=60_000)
            shot = tmp_path / "ui.png"
            page.screenshot(path=str(shot), full_page=True)
            got_a = page.locator("#final-a textarea").input_value()
            got_b = page.locator("#final-b textarea").input_value()
            assert (got_a, got_b) == (want_a, want_b)
            assert page.locator("#grid-a tr").count() == 1 + nfe // 2 + 1  # header, one row per Heun step, final
            assert page.locator("#grid-b tr").count() == 1 + steps
            assert "forward passes" in page.locator("#stats-a").inner_text()
            assert shot.stat().st_size > 10_000
            # the step slider reaches every step of the trajectory; a cell's hover text is the full token
            rows_a = 1 + nfe // 2  # the Heun steps, then the final decode
            assert "final" in page.locator("#stepview-a").inner_text()  # the last row, after the run
            for step, label in ((1, f"1/{nfe // 2}"), (2, f"2/{nfe // 2}"), (rows_a, "final"), (1, f"1/{nfe // 2}")):
                box = page.locator("#step-a input[type=number]")
                box.fill(str(step))
                box.press("Enter")
                page.locator("#stepview-a th", has_text=label).wait_for(timeout=30_000)
                assert page.locator("#stepview-a td").count() == length
            tips = page.locator("#stepview-a td").evaluate_all("cells => cells.map(c => c.title)")
            assert all("p=" in t for t in tips)  # the SDE's first step: every position shows a token
            assert "dsl-llada" in page.locator("#env-footer").inner_text()
            assert page.locator("#status").inner_text().strip() == ""
            # an invalid setting shows an error in the status line; the next valid run clears it
            box = page.locator("#nfe-a input")
            box.fill("7")
            box.blur()
            page.locator("#run").click()
            page.locator("#status", has_text="error").wait_for(timeout=30_000)
            box.fill(str(nfe))
            box.blur()
            page.locator("#run").click()
            playwright.expect(page.locator("#status")).not_to_contain_text("error", timeout=30_000)
            page.locator("#stats-b", has_text="done").wait_for(timeout=60_000)
            assert page.locator("#status").inner_text().strip() == ""
            assert page.locator("#final-a textarea").input_value() == want_a
        finally:
            browser.close()


def test_ui_settings_are_validated_like_requests(tiny):
    from dsl_llada.serve.schemas import RequestError
    from dsl_llada.serve.ui import settings_to_config

    model, _ = tiny
    assert settings_to_config(model, "sde", 8, 12, 0, "auto", 0) == ("sde", SDEConfig(nfe=8, gen_length=12))
    assert settings_to_config(model, "sde", 8, 12, 0, " 0.25 ", 0)[1].eta == 0.25
    assert settings_to_config(model, "block-sde", 4, 12, 6, "", 0)[1] == SDEConfig(nfe=4, gen_length=12, block_length=6)
    assert settings_to_config(model, "remask", 6, 12, 0, "auto", 0.5) == (
        "remask", RemaskConfig(steps=6, gen_length=12, temperature=0.5))
    for args, param in (((model, "sde", 8, 12, 0, "abc", 0), "eta"), ((model, "sde", 7, 12, 0, "auto", 0), "nfe"),
                        ((model, "remask", 5, 12, 4, "auto", 0), "steps")):
        with pytest.raises(RequestError) as e:
            settings_to_config(*args)
        assert e.value.param == param
