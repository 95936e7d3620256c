"""The benchmarks' one harness: the LLaDA-shaped benchmark model and prompts, timing (`clock`, `interleave`: every
variant once per round in rotating order, median and spread), the environment record every result carries
(`parse_args`, `run_environment`), the scripts' subcommands (`run_subcommands`), JSON results (`write_json`) and the
docs/benchmarks/ sections (`write_section`)."""

from __future__ import annotations

import argparse
import platform
import re
import shlex
import sys
import statistics
import time
from pathlib import Path
from types import ModuleType
from typing import Callable

import torch

from dsl_llada.core.backbones.llada import LLaDABackbone, tiny_llada_config
from dsl_llada.config import ConverterConfig, DSLConfig
from dsl_llada.core.model import DSLModel
from dsl_llada.sampling.common import PromptBatch

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "benchmarks.md"
"""The one-page summary; the sections are on the pages of `PAGES`."""
PAGES = ROOT / "docs" / "benchmarks"

PRESETS = {
    # LLaDA-shaped (SwiGLU, RMSNorm, RoPE, untied head, MHA), small enough for a 2-core CPU.
    "small": dict(d_model=512, n_layers=8, n_heads=8, mlp_hidden_size=1376, vocab_size=4096),
    # LLaDA-8B-Instruct's shape (config.json), random weights; GPU only.
    "8b": dict(d_model=4096, n_layers=32, n_heads=32, mlp_hidden_size=12288, vocab_size=126464),
}


def llada_shaped(vocab: int = 32768, d_model: int = 256, n_layers: int = 4, n_heads: int = 4, noise_dim: int = 100,
                 context_embedding: str = "wte", seed: int = 0, device: str = "cpu",
                 dtype: torch.dtype = torch.float32) -> DSLModel:
    """A randomly initialised LLaDA-architecture DSL model (SwiGLU, RMSNorm, RoPE, untied head), seeded.

    Weights N(0, 0.02) except the output head, drawn wider (std 0.5) so the logits are peaked like a trained
    model's rather than flat (flat logits make top-M, argmax and confidences degenerate)."""
    cfg = tiny_llada_config(vocab, d_model=d_model, n_layers=n_layers, n_heads=n_heads, max_sequence_length=4096)
    bb = LLaDABackbone(cfg)
    g = torch.Generator().manual_seed(seed)
    bb.init_weights(g, std=0.02)
    with torch.no_grad():
        bb.model.transformer.ff_out.weight.normal_(0.0, 0.5, generator=g)
    bb = bb.to(device=device, dtype=dtype).eval()
    conv = ConverterConfig(noise_dim=noise_dim)
    return DSLModel.convert(bb, DSLConfig(converter=conv, context_embedding=context_embedding)).eval()


def random_prompts(model: DSLModel, batch: int, length: int, seed: int = 1, device: str = "cpu") -> PromptBatch:
    g = torch.Generator().manual_seed(seed)
    V = model.vocab_size
    rows = [torch.randint(0, V - 3, (length,), generator=g).tolist() for _ in range(batch)]
    return PromptBatch.from_lists(rows, pad_id=model.special.pad_id, device=device)


def sde_call_inputs(model: DSLModel, prompt: int = 128, response: int = 128, nfe: int = 16):
    """The per-call benchmarks' inputs (`bench_percall.py roofline` and `parts`): prompts, the unit noise embedding E, the SDE
    config, its inference beta, the SNR grid of its schedule, and ids = prompt + seeded response tokens (1, P + L)."""
    from dsl_llada.config import SDEConfig
    from dsl_llada.sampling.sde import inference_beta
    from dsl_llada.snr import snr_schedule

    pb = random_prompts(model, 1, prompt)
    cfg = SDEConfig(nfe=nfe, gen_length=response)
    tail = torch.randint(0, model.vocab_size - 3, (1, response), generator=torch.Generator().manual_seed(3))
    return (pb, model.unit_noise(), cfg, inference_beta(model, cfg), snr_schedule(cfg.schedule, cfg.steps).tolist(),
            torch.cat([pb.ids, tail], 1))


def sync(device: str) -> None:
    if str(device).startswith("cuda"):
        torch.cuda.synchronize()


TIMER: Callable[[], float] = time.perf_counter
"""What `clock` reads: wall time, or the process's CPU time after `use_cpu_clock()`."""


def use_cpu_clock(threads: int) -> None:
    """Time with the process's CPU time instead of wall time (`--clock cpu`): on a shared machine a 1-thread
    process's CPU time leaves out the time it waited for a core (not the cache and memory it shares). Only at
    1 thread: with more, CPU time adds the threads' times up (and their waiting spins)."""
    global TIMER
    if threads != 1:
        raise SystemExit(f"--clock cpu needs --threads 1 (got {threads}): CPU time sums the threads' times")
    TIMER = time.process_time


def clock(fn: Callable[[], object], device: str = "cpu") -> float:
    sync(device)
    t = TIMER()
    fn()
    sync(device)
    return TIMER() - t


def med_spread(xs: list[float]) -> tuple[float, float, float]:
    """(median, min, max)."""
    return statistics.median(xs), min(xs), max(xs)


def median_time(fn: Callable[[], object], reps: int, device: str = "cpu") -> float:
    """Median wall time of `reps` calls after one untimed warm-up call (device synchronised around each)."""
    fn()
    return statistics.median(clock(fn, device) for _ in range(reps))


def interleave(variants: dict[str, Callable[[], object]], rounds: int, device: str = "cpu",
               warmup: bool = True) -> dict[str, list[float]]:
    """Wall times of each variant over `rounds` rounds: every variant once per round, the order rotated by one each
    round (none always runs first on a warm or a cold cache), after one untimed call of each when `warmup`."""
    names = list(variants)
    if warmup:
        for name in names:
            variants[name]()
    times: dict[str, list[float]] = {name: [] for name in names}
    for r in range(rounds):
        for name in names[r % len(names):] + names[: r % len(names)]:
            times[name].append(clock(variants[name], device))
    return times


def spread(xs: list[float]) -> dict[str, float]:
    """{median, min, max} of a list of measurements (times or per-round ratios)."""
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs)}


def round_ratios(times: dict[str, list[float]], num: str, den: str) -> dict[str, float]:
    """`spread` of the per-round ratios times[num] / times[den] (ratios taken within a round, where the machine's
    state is shared)."""
    return spread([a / b for a, b in zip(times[num], times[den], strict=True)])


def write_json(path: str | Path | None, result: dict) -> None:
    """Write a result as JSON with this run's environment record and command line (nothing when `path` is None);
    written to a temporary file first, so a run that stops leaves no half-written result."""
    if path is None:
        return
    import json
    import sys

    full = {**result, "environment": run_environment(), "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]])}
    write_text(path, json.dumps(full, indent=1) + "\n")


def write_text(path: str | Path, text: str) -> None:
    """Write `text` to `path` whole (a temporary file renamed over it), creating its folder."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(out)


def command_line() -> str:
    """This run's command as a user retypes it: `python benchmarks/SCRIPT ARGS...`."""
    return shlex.join(["python", f"benchmarks/{Path(sys.argv[0]).name}", *sys.argv[1:]])


def matmul_peak_fp32(reps: int) -> float:
    """Best fp32 GFLOP/s of torch.mm over a few large square shapes (this process's attainable matmul rate)."""
    best = 0.0
    for n in (512, 1024, 2048):
        a, b = torch.randn(n, n), torch.randn(n, n)
        best = max(best, 2 * n ** 3 / min(clock(lambda: torch.mm(a, b)) for _ in range(reps)) / 1e9)
    return best


def block_flops_per_token(d_model: int, mlp_hidden: int, seq_len: int, n_kv_heads_dim: int | None = None) -> float:
    """FLOPs (multiply-adds x 2) of one LLaDA block for one token of a `seq_len`-token sequence: the q/k/v/out
    projections, the SwiGLU MLP (gate, up, down) and attention (scores and the weighted sum of values over all
    `seq_len` keys). `n_kv_heads_dim` = n_kv_heads x head_dim for grouped-query attention (default d_model: MHA)."""
    kv = d_model if n_kv_heads_dim is None else n_kv_heads_dim
    return 2.0 * (2 * d_model * d_model + 2 * d_model * kv + 3 * d_model * mlp_hidden + 2 * seq_len * d_model)


def block_flops(T: int, H: int, F_: int, layers: int, n_heads: int, n_kv: int) -> float:
    """FLOPs of `layers` LLaDA blocks over T tokens (block_flops_per_token, grouped-query aware)."""
    return layers * T * block_flops_per_token(H, F_, T, n_kv * (H // n_heads))


def sde_call_work(model: DSLModel, prompt: int, response: int, top_m: int) -> dict[str, float]:
    """FLOPs of the work one SDE denoiser call needs at batch 1 on the benchmark model: the converter's slot logits
    and dense value product over V+1 slots, the blocks over prompt + response, the head on the response rows and
    the top-M weighted sum of noise rows."""
    cfg = model.backbone.cfg
    T, L, V, H, d = prompt + response, response, model.vocab_size, cfg.d_model, model.noise_dim
    return {"slot": 2 * L * d * (V + 1), "values": 2 * L * (V + 1) * H,
            "blocks": block_flops(T, H, cfg.ffn_hidden, cfg.n_layers, cfg.n_heads, cfg.n_kv_heads),
            "head": 2 * L * H * V, "posterior": 2 * L * top_m * d}


def blocks_and_head_times(model: DSLModel, ids: torch.Tensor, z: torch.Tensor, beta: float, E: torch.Tensor,
                          prompt: int, reps: int) -> tuple[float, float, torch.Tensor]:
    """Median times of the backbone blocks alone over `ids` (response states from `z`) and of the final norm + head
    (as the backbone runs it) on `response` random hidden rows, and those normed rows."""
    import torch.nn.functional as F

    bb = model.backbone
    T = ids.shape[1]
    h_in = model.embed_inputs(ids, z, torch.arange(T)[None] >= prompt, beta=beta, E=E)
    t_blocks = median_time(lambda: bb(h_in, positions=slice(T, T)), reps)  # no rows: the blocks only
    hidden = torch.randn(1, T - prompt, bb.cfg.d_model)
    ln_f, head_w = bb.model.transformer.ln_f, bb.model.transformer.ff_out.weight
    try:  # the head as the backbone runs it (a tree from before `head_linear` existed: one F.linear)
        from dsl_llada.core.backbones.base import head_linear
    except ImportError:
        head_linear = F.linear
    t_head = median_time(lambda: head_linear(ln_f(hidden), head_w), reps)
    return t_blocks, t_head, ln_f(hidden)


def call_flops(*, d_model: int, n_layers: int, mlp_hidden: int, vocab: int, prompt: int, response: int,
               noise_dim: int, batch: int, top_m: int = 0, head_rows: int | None = None) -> dict[str, float]:
    """FLOPs of one SDE denoiser call on `batch` sequences of prompt + response tokens: the blocks over every
    position, the output head on `head_rows` rows per sequence (default `response`: the denoiser asks the backbone
    for the window's logits only), the converter's fp32 slot logits z K^T (K: V+1 rows of `noise_dim`) and its
    value product pi W^T (W: V+1 columns of d_model), and the top-M posterior mean (M weighted rows of E)."""
    T = prompt + response
    rows = response if head_rows is None else head_rows
    out = {"blocks": batch * T * n_layers * block_flops_per_token(d_model, mlp_hidden, T),
           "head": 2.0 * batch * rows * d_model * vocab,
           "converter_slots": 2.0 * batch * response * noise_dim * (vocab + 1),
           "converter_values": 2.0 * batch * response * (vocab + 1) * d_model,
           "top_m_posterior": 2.0 * batch * response * top_m * noise_dim}
    out["total"] = sum(out.values())
    return out


def add_threads_arg(ap, default: int | None = None) -> None:
    """`--threads N` (torch intra-op threads; default: the CPUs this process may use, or `default`)."""
    ap.add_argument("--threads", type=int, default=default,
                    help="torch intra-op threads (default: " + ("the CPUs this process may use" if default is None
                                                                else str(default)) + ")")


def bench_environment(threads: int | None = None, *, device: str | None = None, dtype=None, seeds=None) -> dict:
    """Set the intra-op threads (`--threads`; None = the CPUs this process may use) and return the environment
    record every benchmark result carries (call `finish_record` on it when the timings are done)."""
    from dsl_llada.runtime.environment import environment_record, set_threads

    set_threads(threads)
    return environment_record(device=device, dtype=dtype, seeds=seeds)


_RUN_ENV: dict | None = None


def parse_args(ap, *, threads_default: int | None = None, device: str | None = None, argv: list[str] | None = None):
    """`ap.parse_args(argv)` with `--threads N` added (when the script, or each of its subcommands, has none), the
    threads set, and this run's environment record captured for `run_environment()` / the note `write_section`
    appends."""
    global _RUN_ENV
    subparsers = [x for x in ap._actions if isinstance(x, argparse._SubParsersAction)]
    for p in [sp for x in subparsers for sp in x.choices.values()] if subparsers else [ap]:
        if "--threads" not in p._option_string_actions:
            add_threads_arg(p, threads_default)
    a = ap.parse_args(argv)
    _RUN_ENV = bench_environment(a.threads, device=getattr(a, "device", None) or device,
                                 dtype=getattr(a, "dtype", None))
    return a


def subcommand_parser(doc: str, subcommands: dict[str, ModuleType]) -> argparse.ArgumentParser:
    """The parser of a script with one subcommand per measurement: each module of `subcommands` gives its help (its
    docstring), its options (`add_args(parser)`; `--threads N` is added where it has none, default the CPUs this
    process may use) and its `run(args)`."""
    raw = argparse.RawDescriptionHelpFormatter
    ap = argparse.ArgumentParser(description=doc, formatter_class=raw)
    sub = ap.add_subparsers(dest="command", required=True, metavar="SUBCOMMAND")
    for name, mod in subcommands.items():
        doc_ = mod.__doc__ or name
        p = sub.add_parser(name, help=" ".join(doc_.split("\n\n")[0].split()), description=doc_, formatter_class=raw)
        mod.add_args(p)
        if "--threads" not in p._option_string_actions:
            add_threads_arg(p)
        p.set_defaults(run=mod.run, parser=p)
    return ap


def run_subcommands(doc: str, subcommands: dict[str, ModuleType], argv: list[str] | None = None) -> int:
    """Parse the command line (`parse_args`: threads set, environment record captured) and run the subcommand it
    names; its exit status (None = 0)."""
    a = parse_args(subcommand_parser(doc, subcommands), argv=argv)
    return a.run(a) or 0


def status_kib(field: str) -> int:
    """A field of /proc/self/status in KiB (Linux: VmRSS, VmHWM, ...)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def reset_peak_rss() -> bool:
    """Reset this process's peak RSS (Linux: VmHWM via /proc/self/clear_refs), so a later reading is the peak of
    what ran since; False where that is not possible."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def peak_rss_mib() -> float:
    """VmHWM from /proc/self/status (honours `reset_peak_rss`), else getrusage's lifetime peak."""
    import resource

    try:
        return status_kib("VmHWM") / 1024
    except (OSError, RuntimeError):
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def demo_checkpoints(demo, train, demo_dir: str | Path) -> tuple:
    """(base, dsl): a `dsl-llada demo` folder's pretrained model (shipped with the package, or cached) and its
    DSL-adapted model from the cache, in eval mode. Nothing is trained here: a stage the cache lacks is one error
    naming the folder and the command that makes it (exit 2)."""
    cached = demo._cached

    def cached_only(name: str, key: dict):
        path, hit = cached(name, key)
        if not hit:
            print(f"error: no cached {name} stage under {demo.cache} (looked for {path.name}); run "
                  f"`dsl-llada demo {'--quick ' if demo.cfg.quick else ''}--out {demo_dir}` first", file=sys.stderr)
            raise SystemExit(2)
        return path, hit

    demo._cached = cached_only  # this instance only
    try:
        base = demo.pretrained(train).eval()
        return base, demo.adapted(base, train, "dsl").eval()
    finally:
        del demo._cached


def run_environment() -> dict:
    """This run's environment record with the end load average (captured now if `parse_args` was not used)."""
    from dsl_llada.runtime.environment import environment_record, finish_record

    return finish_record(_RUN_ENV if _RUN_ENV is not None else environment_record())


def environment_note() -> str:
    """The line every written benchmark section ends with: the environment record of the run that made it."""
    from dsl_llada.runtime.environment import environment_footer

    return environment_footer(run_environment()) + " (machine shared with other jobs unless stated)"


def machine_line() -> str:
    return (f"{platform.machine()}, {torch.get_num_threads()} threads, torch {torch.__version__}"
            + (f", {torch.cuda.get_device_name()}" if torch.cuda.is_available() else ""))


def section_page(title: str, default: str = "cpu-sampling.md") -> Path:
    """The page of docs/benchmarks/ that holds the `### title` section, else `default` there."""
    for page in sorted(PAGES.glob("*.md")):
        if re.search(rf"^### {re.escape(title)}$", page.read_text(), re.M):
            return page
    return PAGES / default


_BLOCK = re.compile(r"<!-- docs-table: (\S+) -->\n(\|[^\n]*)\n")


def keep_table_blocks(old: str, new: str) -> str:
    """`new` with the `<!-- docs-table: NAME -->` markers of `old` around the table of the same header, so a table
    that `scripts/docs_tables.py --write-pages` renders from the results stays registered when its section is
    rewritten."""
    for name, header in _BLOCK.findall(old):
        lines = new.split("\n")
        if f"<!-- docs-table: {name} -->" in new or header not in lines:
            continue
        i = lines.index(header)
        j = i
        while j < len(lines) and lines[j].startswith("|"):
            j += 1
        lines[j:j] = ["<!-- /docs-table -->"]
        lines[i:i] = [f"<!-- docs-table: {name} -->"]
        new = "\n".join(lines)
    return new


def write_section(title: str, body: str, page: str = "cpu-sampling.md") -> None:
    """Replace the `### title` section on its page of docs/benchmarks/ (a new one is appended to `page`),
    atomically."""
    path = section_page(title, page)
    text = path.read_text() if path.exists() else f"# {path.stem}\n\nRatios measured in one run; see each section's command.\n"
    if "Environment: " not in body:
        body = body.strip() + "\n\n" + environment_note()
    section = f"### {title}\n\n{body.strip()}\n"
    pattern = re.compile(rf"^### {re.escape(title)}\n.*?(?=^##+ |\Z)", re.S | re.M)
    old = pattern.search(text)
    if old is not None:
        section = keep_table_blocks(old.group(0), section)
    text = pattern.sub(lambda _: section + "\n", text, count=1) if old is not None else \
        text.rstrip() + "\n\n" + section
    tmp = path.with_suffix(".md.tmp")
    tmp.write_text(text.rstrip() + "\n")
    tmp.replace(path)
