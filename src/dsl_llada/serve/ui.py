"""Gradio web UI: one prompt, one or two samplers side by side (e.g. DSL-SDE vs LLaDA remasking), a live heatmap of
the denoising (token and confidence per position at each step/SNR), the final texts, forward passes and seconds.

`build_ui` makes the Blocks; `mount_ui` puts them on an existing FastAPI app (e.g. the server's, at /ui);
`build_app` makes a stand-alone app (`dsl-llada ui`); `toy_model` is the default model of `dsl-llada ui`.
"""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path
from typing import Any

from ..config import RemaskConfig, SDEConfig
from ..core.loading import encode_prompt
from ..core.model import DSLModel
from ..sampling.registry import REGISTRY, get_spec
from .batcher import same_torch_threads
from ..core.backbones.base import context_limit
from .schemas import RequestError, SamplingFields, build_sampling
from .trace import Trace, render_grid, render_step, run_traced

log = logging.getLogger(__name__)

SAMPLER_LABELS = {name: spec.label for name, spec in REGISTRY.items()}
EXAMPLE_PROMPT = "write about the forest ."
REFRESH_S = 0.1
"""Least time between two live updates of the page."""


def toy_model(out: str | Path, *, progress: bool = True):
    """The embedded toy world's DSL model and tokenizer: stages 1-2 of `dsl-llada demo --quick` with `out` as its
    output folder, so its cache (`out/cache`) is reused when present and filled (a few CPU minutes) when not."""
    from ..toy.demo import Demo, DemoConfig

    demo = Demo(DemoConfig.preset(quick=True), Path(out), progress=progress, echo=log.info)
    train, _ = demo.corpora()
    base = demo.pretrained(train)
    return demo.adapted(base, train, "dsl").eval(), demo.tok


def settings_to_config(model, sampler: str, nfe_or_steps, gen_length, block_length, eta, temperature):
    """The UI's knobs as a request, validated exactly as the server validates one (defaults = the paper's)."""
    has_converter = isinstance(model, DSLModel)
    fields: dict = {"sampler": sampler, "gen_length": int(gen_length) if gen_length else None}
    if nfe_or_steps:
        fields[get_spec(sampler).steps_field] = int(nfe_or_steps)
    if block_length:
        fields["block_length"] = int(block_length)
    eta = "" if eta is None else str(eta).strip().lower()
    is_sde = get_spec(sampler).config_class is SDEConfig
    if eta not in ("", "auto") and is_sde:
        try:
            fields["eta"] = float(eta)
        except ValueError:
            raise RequestError(f"eta={eta!r} is not a number; give a value >= 0 or 'auto'", "eta") from None
    if temperature and not is_sde:
        fields["temperature"] = float(temperature)
    return build_sampling(SamplingFields(**fields), default_sampler="sde" if has_converter else "remask",
                          has_converter=has_converter)


def environment_footer(model) -> str:
    """One line of the environment record (the same record every artifact carries) for the page footer."""
    from ..runtime.environment import environment_record

    p = next(model.parameters())
    env = environment_record(device=p.device, dtype=p.dtype)
    git = env.get("git") or {}
    commit = (git.get("commit") or "unknown")[:12] + (" (dirty)" if git.get("dirty") else "")
    libs = env.get("libraries", {})
    return (f"dsl-llada {env.get('dsl_llada')} · git {commit} · torch {libs.get('torch')} · {env.get('device')} "
            f"{env.get('dtype')} · {env.get('cpu_model') or env.get('machine')} · threads "
            f"{(env.get('threads') or {}).get('intra_op')} · Python {env.get('python')}")


def _stats(trace: Trace | None, running: bool) -> str:
    if trace is None:
        return ""
    if running:
        last = trace.steps[-1] if trace.steps else None
        return f"running… step {last.step}/{last.total_steps} ({last.label})" if last else "running…"
    return (f"done · {trace.forward_passes} forward passes · NFE {trace.nfe} · {trace.seconds:.2f} s · "
            f"{len(trace.steps)} steps")


def _panel(gr: Any, tag: str, default: str, samplers: list[str], default_nfe: dict[str, int]) -> tuple[list[Any], list[Any]]:
    """One sampler's knobs (sampler, NFE/steps, block length, eta, temperature) and its outputs (final text, stats)."""
    d_sde, d_rm = SDEConfig(), RemaskConfig()
    with gr.Column():
        sampler = gr.Dropdown([(SAMPLER_LABELS[s], s) for s in samplers], value=default, label=f"sampler {tag}",
                              elem_id=f"sampler-{tag}")
        with gr.Row():
            nfe = gr.Number(value=default_nfe[default], precision=0, label="NFE (SDE) / steps (discrete)",
                            elem_id=f"nfe-{tag}")
            block = gr.Number(value=0, precision=0, label="block length (0 = none)", elem_id=f"block-{tag}")
        with gr.Row():
            eta = gr.Textbox(value="auto" if d_sde.eta is None else str(d_sde.eta),
                             label="eta (SDE; 'auto' = by NFE, as the paper)", elem_id=f"eta-{tag}")
            temp = gr.Number(value=d_rm.temperature, label="temperature (discrete)", elem_id=f"temp-{tag}")
        sampler.change(lambda s: default_nfe[s], sampler, nfe)
        stats = gr.Markdown("", elem_id=f"stats-{tag}")
        final = gr.Textbox(label=f"final text {tag}", interactive=False, lines=3, elem_id=f"final-{tag}")
    return [sampler, nfe, block, eta, temp], [final, stats]


def _step_view(gr: Any, tag: str) -> tuple[Any, Any, Any]:
    """A slider over every step of the last run, and that step's tokens in full."""
    state = gr.State(None)
    slider = gr.Slider(minimum=1, maximum=2, value=1, step=1, label=f"step (sampler {tag})",
                       elem_id=f"step-{tag}", interactive=True)
    view = gr.HTML(render_step(None, 1), elem_id=f"stepview-{tag}")
    slider.change(render_step, [state, slider], view)
    return state, slider, view


def build_ui(model, tokenizer, *, title: str = "dsl-llada"):
    """The Gradio Blocks of the viewer around a loaded model and tokenizer."""
    import gradio as gr

    has_converter = isinstance(model, DSLModel)
    samplers = [name for name, spec in REGISTRY.items() if has_converter or not spec.needs_dsl]
    default_a, default_b = ("sde", "remask") if has_converter else ("remask", "remdm")
    limit = context_limit(model)
    default_len = SDEConfig().gen_length if limit is None else min(SDEConfig().gen_length, max(8, limit // 4))
    default_nfe = {name: getattr(spec.config_class(), spec.steps_field) for name, spec in REGISTRY.items()}
    live = _live_factory(model, tokenizer)

    with gr.Blocks(title=title, analytics_enabled=False) as blocks:
        gr.Markdown(f"## {title}\nWatch the denoising: each row is a step (SNR γ for the SDE, time t for remasking), "
                    "each cell a response position, coloured by the model's probability of the shown token "
                    "(red = low, green = high; grey = still masked).")
        with gr.Row():
            prompt = gr.Textbox(value=EXAMPLE_PROMPT, label="prompt", lines=2, scale=4, elem_id="prompt")
            with gr.Column(scale=1):
                seed = gr.Number(value=0, precision=0, label="seed", elem_id="seed")
                gen_length = gr.Number(value=default_len, precision=0, label="response length", elem_id="gen-length")
                chat = gr.Checkbox(value=bool(getattr(tokenizer, "chat_template", None)), label="chat template",
                                   elem_id="chat")
                compare = gr.Checkbox(value=True, label="compare two samplers", elem_id="compare")
        run = gr.Button("Run", variant="primary", elem_id="run")
        status = gr.Markdown("", elem_id="status")
        with gr.Row():
            knobs_a, outs_a = _panel(gr, "a", default_a, samplers, default_nfe)
            knobs_b, outs_b = _panel(gr, "b", default_b, samplers, default_nfe)
        # the heatmaps get the full width: one column per response position
        gr.Markdown("**denoising, sampler a**")
        grid_a = gr.HTML(render_grid(None), elem_id="grid-a")
        state_a, slider_a, view_a = _step_view(gr, "a")
        gr.Markdown("**denoising, sampler b**")
        grid_b = gr.HTML(render_grid(None), elem_id="grid-b")
        state_b, slider_b, view_b = _step_view(gr, "b")
        gr.Markdown(environment_footer(model), elem_id="env-footer")

        go = _runner(gr, model, tokenizer, limit, live)
        run.click(go, [prompt, seed, gen_length, chat, compare, *knobs_a, *knobs_b],
                  [status, grid_a, *outs_a, state_a, slider_a, view_a, grid_b, *outs_b, state_b, slider_b, view_b])
    return blocks


def _check_request(model, tokenizer, limit: int | None, prompt_text, length, use_chat, two, knobs):
    """(prompt ids, [(sampler, config)]) of the page's inputs, or a RequestError/ValueError with the reason."""
    ids = encode_prompt(tokenizer, prompt_text or "", chat_template=bool(use_chat))
    cfgs = [settings_to_config(model, knobs[0], knobs[1], length, knobs[2], knobs[3], knobs[4])]
    if two:
        cfgs.append(settings_to_config(model, knobs[5], knobs[6], length, knobs[7], knobs[8], knobs[9]))
    if not ids:
        raise ValueError("the prompt encodes to no tokens")
    if limit is not None and len(ids) + cfgs[0][1].gen_length > limit:
        raise ValueError(f"prompt ({len(ids)} tokens) + response length exceeds the model's context of {limit}")
    return ids, cfgs


def _runner(gr, model, tokenizer, limit: int | None, live):
    """The Run button's handler: validate the inputs, then run each sampler and stream its trace into the page."""

    def go(prompt_text, seed_v, length, use_chat, two, *knobs):
        # every run starts by clearing the last run's error; an error is shown in the status line (and the
        # panels keep what they showed), so a later successful run leaves no stale error behind
        blank = [render_grid(None), "", "", None, gr.update(maximum=2, value=1), render_step(None, 1)]
        shown: list[list] = [list(blank), list(blank)]
        if not two:
            shown[1][2] = "(off)"
        try:
            ids, cfgs = _check_request(model, tokenizer, limit, prompt_text, length, use_chat, two, knobs)
        except (RequestError, ValueError) as e:
            yield [f"**error:** {e}", *[gr.update() for _ in range(12)]]
            return
        yield ["", *shown[0], *shown[1]]
        for k, (name, cfg) in enumerate(cfgs):
            try:
                for trace, running in live(ids, name, cfg, int(seed_v or 0)):
                    n = len(trace.steps)
                    shown[k] = [render_grid(trace), trace.text if not running else "", _stats(trace, running),
                                None if running else trace,
                                gr.update() if running else gr.update(maximum=max(2, n), value=max(1, n)),
                                gr.update() if running else render_step(trace, n)]
                    yield ["", *shown[0], *shown[1]]
            except Exception as e:  # noqa: BLE001 - a failing sampler run is shown in the page
                yield [f"**error:** {type(e).__name__}: {e}", *shown[0], *shown[1]]
                return

    return go


def _live_factory(model, tokenizer):
    init_thread = same_torch_threads()  # captured in the thread that builds the UI

    def live(ids, name, cfg, seed):
        """Run one sampler in a thread; yield (trace, running) at most every REFRESH_S, then the finished trace."""
        changed = threading.Event()
        result: dict = {}

        def on_step(trace: Trace) -> None:
            result["live"] = trace
            changed.set()

        def work():
            init_thread()
            try:
                result["trace"] = run_traced(model, tokenizer, ids, name, cfg, seed, on_step=on_step,
                                             context_checked=True)  # by the settings check
            except Exception as e:  # noqa: BLE001 - shown in the page
                result["error"] = e
            changed.set()

        worker = threading.Thread(target=work, daemon=True, name="dsl-llada-ui-sampler")
        worker.start()
        while worker.is_alive():
            if changed.wait(REFRESH_S) and "live" in result and worker.is_alive():
                changed.clear()
                yield result["live"], True
                time.sleep(REFRESH_S)
        worker.join()
        if "error" in result:
            raise result["error"]
        yield result["trace"], False
    return live


def mount_ui(app, model, tokenizer, *, path: str = "/ui", title: str = "dsl-llada"):
    """Mount the viewer on an existing FastAPI app (e.g. the OpenAI-compatible server) under `path`."""
    import gradio as gr

    return gr.mount_gradio_app(app, build_ui(model, tokenizer, title=title), path=path, ssr_mode=False,
                               footer_links=[])


def build_app(model, tokenizer, *, title: str = "dsl-llada"):
    """A stand-alone FastAPI app serving the viewer at / (what `dsl-llada ui` runs)."""
    from fastapi import FastAPI

    return mount_ui(FastAPI(title=title), model, tokenizer, path="", title=title)
