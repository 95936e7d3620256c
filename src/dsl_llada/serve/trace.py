"""Denoising traces for the web UI: per step and position, the current token and the model's confidence in it.

`run_traced` calls the library sampler with a step callback (the samplers' observer protocol, `StepInfo`: the
step's tokens, committed positions and logits; nothing in the computation changes, so the tokens are the sampler's
own). `render_grid` turns a trace into an HTML heatmap (rows = steps, columns = response positions).
"""

from __future__ import annotations

import html
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from ..config import RemaskConfig, SDEConfig
from ..sampling import PromptBatch, StepInfo
from ..core.backbones.base import model_device
from ..generate.generation import run_sampler
from .runner import seeded_generator


@dataclass
class TraceStep:
    step: int
    total_steps: int
    label: str
    """'SNR 3.2' (SDE) or 't 0.50' (discrete)."""
    tokens: list[str]
    confidence: list[float]
    """Probability the step's logits give the shown token (the conditional pass, for discrete samplers)."""
    masked: list[bool]


@dataclass
class Trace:
    sampler: str
    steps: list[TraceStep] = field(default_factory=list)
    text: str = ""
    forward_passes: int = 0
    nfe: int = 0
    seconds: float = 0.0
    done: bool = False


def _token_strings(tokenizer, ids: list[int]) -> list[str]:
    return [t if isinstance(t, str) else str(t) for t in tokenizer.convert_ids_to_tokens(ids)]


def run_traced(model, tokenizer, prompt_ids: list[int], name: str, config: SDEConfig | RemaskConfig, seed: int,
               on_step: Callable[[Trace], None] | None = None, context_checked: bool = False) -> Trace:
    """Sample one prompt with generator seed `seed` (the server's and `generate`'s seeding), recording every step
    through the samplers' step callback (`StepInfo`: tokens, committed positions, the step's logits).
    `context_checked`: the caller checked prompt + response against the context already (the UI does)."""
    special = model.special
    trace = Trace(sampler=name)
    L = config.gen_length
    conf = [0.0] * L  # a position the step did not compute logits for keeps its last confidence

    def callback(info: StepInfo) -> None:
        ids = info.tokens[0].to("cpu")
        if info.logits is not None and info.window is not None:
            lo, hi = info.window
            probs = torch.softmax(info.logits[0].float(), dim=-1).cpu()
            shown = probs.gather(-1, ids[lo:hi].clamp(min=0).unsqueeze(-1)).squeeze(-1).tolist()
            # SDE: every position of the window moves each step; discrete: a position's confidence is the one of
            # the step that committed it (committed columns may have no logits later)
            fresh = [True] * (hi - lo) if info.newly_committed is None or info.gamma is not None else \
                (info.newly_committed[0, lo:hi] | (ids[lo:hi] == special.mask)).tolist()
            for j, (p, f) in enumerate(zip(shown, fresh)):
                if f:
                    conf[lo + j] = p
        if info.decode and info.step != info.total_steps - 1:
            return  # a Block SDE block's decode: its confidences are kept, the next block's steps show it
        label = "final" if info.decode else (f"SNR {info.gamma:.3g}" if info.gamma is not None
                                               else f"t {info.extra.get('t', 0.0):.2f}")
        step = len(trace.steps) if info.decode else info.step + 1
        trace.steps.append(TraceStep(step=step, total_steps=step if info.decode else info.total_steps, label=label,
                                     tokens=_token_strings(tokenizer, ids.tolist()), confidence=list(conf),
                                     masked=(ids == special.mask).tolist()))
        if on_step is not None:
            on_step(trace)

    batch = PromptBatch.from_lists([prompt_ids], pad_id=special.pad_id, device=model_device(model),
                                   context_checked=context_checked)
    t0 = time.perf_counter()
    with torch.no_grad():
        out = run_sampler(model, batch, config, generator=[seeded_generator(seed)], callback=callback)
    trace.seconds = time.perf_counter() - t0
    trace.text = tokenizer.decode(out.responses()[0], skip_special_tokens=True)
    trace.forward_passes, trace.nfe, trace.done = out.forward_passes, out.nfe, True
    return trace


def _cell_style(conf: float, masked: bool) -> str:
    if masked:
        return "background:#d9d9d9;color:#777"
    hue = int(120 * max(0.0, min(1.0, conf)))  # red (0) -> green (1)
    return f"background:hsl({hue},70%,80%)"


GRID_STYLE = ("<style>.dsl-grid{overflow:auto;max-height:520px}"
              ".dsl-grid table{border-collapse:collapse!important;font:10px monospace!important;width:auto!important;"
              "margin:0!important}.dsl-grid td,.dsl-grid th{border:1px solid #fff!important;padding:0 2px!important;"
              "white-space:nowrap;color:#000;line-height:1.3!important;min-width:0!important;text-align:left}"
              ".dsl-grid th small{font-weight:normal;color:#555}</style>")


def _cell(tok: str, conf: float, masked: bool, max_chars: int | None) -> str:
    shown = "·" if masked else (tok if max_chars is None else tok[:max_chars])
    tip = "position masked" if masked else f"{tok!r} p={conf:.3f}"  # the full token, never truncated
    return f"<td style='{_cell_style(conf, masked)}' title='{html.escape(tip, quote=True)}'>{html.escape(shown)}</td>"


def render_grid(trace: Trace | None, *, max_rows: int = 256, max_chars: int = 8) -> str:
    """HTML heatmap of a trace: one row per step (newest last), one cell per position (token, colour = confidence;
    hover: the full token and its probability). Up to `max_rows` rows (the newest); the step slider of the UI
    shows any step of any length of trajectory."""
    if trace is None or not trace.steps:
        return "<div class='dsl-grid-empty'>no steps yet</div>"
    steps = trace.steps[-max_rows:]
    n = len(steps[-1].tokens)
    head = "".join(f"<th>{i}</th>" for i in range(n))
    rows = []
    for st in steps:
        cells = "".join(_cell(tok, c, m, max_chars) for tok, c, m in zip(st.tokens, st.confidence, st.masked))
        rows.append(f"<tr><th>{st.step}/{st.total_steps} <small>{html.escape(st.label)}</small></th>{cells}</tr>")
    more = (f"<div class='dsl-grid-more'>the {len(trace.steps) - len(steps)} earlier steps: use the step slider</div>"
            if len(steps) < len(trace.steps) else "")
    return f"{GRID_STYLE}{more}<div class='dsl-grid'><table><tr><th>step</th>{head}</tr>{''.join(rows)}</table></div>"


def render_step(trace: Trace | None, index: int) -> str:
    """One step of a trace (1-based `index` into its rows, clamped), every token shown in full."""
    if trace is None or not trace.steps:
        return "<div class='dsl-step-empty'>run first</div>"
    st = trace.steps[max(1, min(int(index or 1), len(trace.steps))) - 1]
    cells = "".join(_cell(tok, c, m, None) for tok, c, m in zip(st.tokens, st.confidence, st.masked))
    return (f"{GRID_STYLE}<div class='dsl-grid dsl-step'><table><tr><th>{st.step}/{st.total_steps} "
            f"<small>{html.escape(st.label)}</small></th>{cells}</tr></table></div>")
