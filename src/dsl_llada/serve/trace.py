"""Denoising traces for the web UI: per step and position, the current token and the model's confidence in it.

`run_traced` calls the library sampler with a step callback and a read-only forward hook on the backbone (the
hook keeps the logits of the step's forward passes; nothing in the computation changes, so the tokens are the
sampler's own). `render_grid` turns a trace into an HTML heatmap (rows = steps, columns = response positions).
"""

from __future__ import annotations

import html
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from ..backbones.base import position_index
from ..config import RemaskConfig, SDEConfig
from ..model import DSLModel
from ..sampling import PromptBatch, StepInfo
from .runner import run_sampler, seeded_generator


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
               on_step: Callable[[Trace], None] | None = None) -> Trace:
    """Sample one prompt with generator seed `seed` (the server's and `generate`'s seeding), recording every step."""
    backbone = model.backbone if isinstance(model, DSLModel) else model
    special = model.special
    trace = Trace(sampler=name)
    outs: list[tuple[torch.Tensor, torch.Tensor]] = []
    L = config.gen_length
    sde = isinstance(config, SDEConfig)
    last_conf = [0.0] * L  # a position the step did not compute logits for keeps its last confidence

    def hook(_module, args, kwargs, output):
        # samplers ask for the logits of the positions they read only (`positions=`): map the rows back
        total = args[0].shape[1]
        idx = position_index(kwargs.get("positions"), total) - (total - L)
        keep = idx >= 0
        outs.append((idx[keep].cpu(), output.detach()[:, keep.to(output.device)]))

    def record(ids: torch.Tensor, step: int, total: int, label: str) -> None:
        got = (outs[-1] if sde else outs[0]) if outs else None  # SDE: the corrector's pass; discrete: conditional
        outs.clear()
        ids = ids.to("cpu")
        masked = (ids == special.mask).tolist()
        if got is not None:
            pos, logits = got
            probs = torch.softmax(logits[0].float(), dim=-1).cpu()
            for j, p in zip(pos.tolist(), probs.gather(-1, ids[pos].unsqueeze(-1)).squeeze(-1).tolist()):
                last_conf[j] = p
        conf = list(last_conf)
        trace.steps.append(TraceStep(step=step, total_steps=total, label=label,
                                     tokens=_token_strings(tokenizer, ids.tolist()), confidence=conf, masked=masked))
        if on_step is not None:
            on_step(trace)

    def callback(info: StepInfo) -> None:
        label = f"SNR {info.gamma:.3g}" if info.gamma is not None else f"t {info.extra.get('t', 0.0):.2f}"
        record(info.tokens[0], info.step + 1, info.total_steps, label)

    batch = PromptBatch.from_lists([prompt_ids], pad_id=special.pad_id, device=next(model.parameters()).device)
    handle = backbone.register_forward_hook(hook, with_kwargs=True)
    t0 = time.perf_counter()
    try:
        with torch.no_grad():
            out = run_sampler(model, name, config, batch, [seeded_generator(seed)], callback)
    finally:
        handle.remove()
    trace.seconds = time.perf_counter() - t0
    if outs:  # the SDE samplers decode the final state with one more forward pass: show it as the last row
        record(out.ids[0], len(trace.steps), len(trace.steps), "final")
    trace.text = tokenizer.decode(out.responses()[0], skip_special_tokens=True)
    trace.forward_passes, trace.nfe, trace.done = out.forward_passes, out.nfe, True
    return trace


def _cell_style(conf: float, masked: bool) -> str:
    if masked:
        return "background:#d9d9d9;color:#777"
    hue = int(120 * max(0.0, min(1.0, conf)))  # red (0) -> green (1)
    return f"background:hsl({hue},70%,80%)"


def render_grid(trace: Trace | None, *, max_rows: int = 64, max_chars: int = 8) -> str:
    """HTML heatmap of a trace: one row per step (newest last), one cell per position (token, colour = confidence)."""
    if trace is None or not trace.steps:
        return "<div class='dsl-grid-empty'>no steps yet</div>"
    steps = trace.steps[-max_rows:]
    n = len(steps[-1].tokens)
    head = "".join(f"<th>{i}</th>" for i in range(n))
    rows = []
    for st in steps:
        cells = []
        for tok, c, m in zip(st.tokens, st.confidence, st.masked):
            shown = "·" if m else tok[:max_chars]
            tip = "masked" if m else f"{tok} p={c:.2f}"
            cells.append(f"<td style='{_cell_style(c, m)}' title='{html.escape(tip, quote=True)}'>{html.escape(shown)}</td>")
        rows.append(f"<tr><th>{st.step}/{st.total_steps} <small>{html.escape(st.label)}</small></th>{''.join(cells)}</tr>")
    style = ("<style>.dsl-grid{overflow:auto;max-height:520px}"
             ".dsl-grid table{border-collapse:collapse!important;font:10px monospace!important;width:auto!important;"
             "margin:0!important}.dsl-grid td,.dsl-grid th{border:1px solid #fff!important;padding:0 2px!important;"
             "white-space:nowrap;color:#000;line-height:1.3!important;min-width:0!important;text-align:left}"
             ".dsl-grid th small{font-weight:normal;color:#555}</style>")
    return (f"{style}<div class='dsl-grid'><table><tr><th>step</th>{head}</tr>{''.join(rows)}</table></div>")
