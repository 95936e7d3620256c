"""`dsl-llada demo`: the paper's whole pipeline on the embedded toy world, on a CPU, in minutes.

Stages (each cached under OUT/cache and reused when its config is unchanged):
  1. world + tokenizer + SFT-format corpus;
  2. pretrain a tiny LLaDA-architecture masked DLM with the MDM objective (the stand-in for LLaDA-Instruct);
  3. DSL continue-pretraining from it (and, with --controls, MDM-CPT and XDLM with the same steps);
  4. sample held-out prompts with DSL-SDE and the discrete baselines at several NFE, score exactly;
  5. write report.md, nfe_curve.png, results.jsonl, config.json.
`--sweep` runs stages 1-3 (cached) and then the paper's SDE sensitivity sweep instead (toy/sweep.py, OUT/sweep/).
"""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from ..backbones import load_backbone, save_backbone
from ..backbones.llada import LLaDABackbone, tiny_llada_config
from ..backbones.base import SpecialTokens
from ..config import ConfigBase, ConverterConfig, DSLConfig
from ..environment import environment_footer, environment_record, finish_record
from ..loading import DTYPES
from ..eval.report import markdown_table, pivot, plot_nfe_curves
from ..model import DSLModel
from ..utils import atomic_write_text
from .evaluate import CONTROL_METHODS, PAPER_METHODS, aggregate, error_correction, sample_records, score_record
from .cache_frontier import FrontierConfig, run_frontier, write_frontier
from .frontier_report import recommendation_lines
from .sweep import SweepConfig, reference_rows, run_sweep, write_sweep
from .tasks import make_split
from .tokenizer import build_tokenizer, special_ids
from .verdicts import verdict_lines, verdicts
from .world import ToyWorld, ToyWorldConfig
from .demo_train import TrainStage, run_stage

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class DemoConfig(ConfigBase):
    """Everything that defines a demo run; saved as config.json next to the report."""

    seed: int = 0
    """Seed of the world's corpora, model init and sampling."""
    quick: bool = False
    """The ~2-minute version: fewer steps, prompts and NFE values."""
    controls: bool = False
    """Also train and evaluate the MDM-CPT and XDLM controls."""
    d_model: int = 128
    n_layers: int = 4
    n_heads: int = 4
    noise_dim: int = 64
    """Noise-embedding dimension d (paper 100 for V = 126k; 64 suffices for the 313-token world)."""
    n_train: int = 6000
    """SFT-format training conversations (half open-ended, half summarisation)."""
    world: dict = field(default_factory=lambda: {"n_topics": 4, "max_sentences": 3, "gen_length": 32})
    """ToyWorldConfig overrides (a 4-topic world with responses of at most 3 sentences, padded to 32 tokens,
    is what a 2-core CPU learns in a few minutes)."""
    pretrain: TrainStage = field(default_factory=lambda: TrainStage(objective="mdm", steps=3000, lr=1e-3, warmup=100,
                                                                    stratified_t=True))
    cpt: TrainStage = field(default_factory=lambda: TrainStage(objective="dsl", steps=1000, lr=5e-4, warmup=50))
    n_eval_open: int = 48
    n_eval_summarize: int = 24
    nfes: tuple = (4, 8, 16, 32, 64)
    batch_size: int = 48
    dtype: str = "float32"
    """Backbone dtype of the evaluation stages (sampling, error correction): 'float32' or 'bfloat16' (the paper's
    recipe, `DSLModel.to_compute_dtype`); training is always fp32 and the cached checkpoints are fp32."""
    sample_seeds: int = 1
    """`--seeds K`: sample every prompt with K seeds (seed k = 0 is the historical one); the tables pool them, the
    intervals resample prompts, and the per-seed perplexities give the spread across seeds."""

    _nested = {"pretrain": TrainStage, "cpt": TrainStage}

    @classmethod
    def preset(cls, *, quick: bool, controls: bool = False, seed: int = 0, sample_seeds: int = 1,
               dtype: str = "float32") -> "DemoConfig":
        if not 1 <= sample_seeds <= MAX_SAMPLE_SEEDS:
            raise ValueError(f"--seeds must be an integer from 1 to {MAX_SAMPLE_SEEDS}, got {sample_seeds!r}")
        if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= MAX_DEMO_SEED:
            raise ValueError(f"--seed {seed!r} is out of range: it must be an integer from 0 to {MAX_DEMO_SEED} (the "
                             f"demo's generators take 32-bit seeds)")
        if not quick:
            return cls(seed=seed, controls=controls, sample_seeds=sample_seeds, dtype=dtype)
        return cls(seed=seed, quick=True, controls=controls, sample_seeds=sample_seeds, dtype=dtype, n_train=2000,
                   n_eval_open=16, n_eval_summarize=8,
                   nfes=(4, 16, 64), pretrain=TrainStage(objective="mdm", steps=400, lr=2e-3, warmup=40, stratified_t=True),
                   cpt=TrainStage(objective="dsl", steps=120, lr=1e-3, warmup=10))


MAX_SAMPLE_SEEDS = 16
MAX_DEMO_SEED = 2**31 - 1
"""Largest `--seed` of the demo: its generators take 32-bit seeds, and the stages add small offsets to it."""
CHECKSUMS = "checksums.json"


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def write_checksums(folder: Path) -> None:
    """`folder/checksums.json`: sha256 of every other file in the folder."""
    sums = {p.name: _sha256(p) for p in sorted(folder.iterdir()) if p.is_file() and p.name != CHECKSUMS}
    atomic_write_text(folder / CHECKSUMS, json.dumps(sums, indent=1, sort_keys=True) + "\n")


def verify_checksums(folder: Path) -> str | None:
    """None when every file listed in `folder/checksums.json` is present with its sha256; else what is wrong."""
    try:
        sums = json.loads((folder / CHECKSUMS).read_text())
    except FileNotFoundError:
        return f"no {CHECKSUMS}: the stage was interrupted or written by an older version"
    except (OSError, ValueError) as e:
        return f"{CHECKSUMS} is unreadable: {e}"
    if not isinstance(sums, dict) or not sums:
        return f"{CHECKSUMS} lists no files"
    for name, digest in sorted(sums.items()):
        p = folder / name
        if not p.is_file():
            return f"{name} is missing"
        if _sha256(p) != digest:
            return f"{name} does not match its checksum"
    return None


def _fingerprint(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:12]


def cast_for_inference(model: torch.nn.Module, dtype: torch.dtype) -> torch.nn.Module:
    """A trained model in the paper's precision recipe for `dtype` (DSL models keep E, the logit bias and beta in
    fp32; a bare backbone is cast whole)."""
    return model.to_compute_dtype(dtype) if isinstance(model, DSLModel) else model.to(dtype)


def _special(tok) -> SpecialTokens:
    s = special_ids(tok)
    return SpecialTokens(mask=s["mask"], eos=s["eos"], eot=s["eot"], pad=s["pad"], bos=s["bos"])


class Demo:
    def __init__(self, config: DemoConfig, out: Path, *, progress: bool = True, echo=print):
        self.cfg, self.out, self.progress, self.echo = config, Path(out), progress, echo
        self.cache = self.out / "cache"
        self.world = ToyWorld(ToyWorldConfig(**{"seed": config.seed, **config.world}))
        self.tok = build_tokenizer(self.world)
        self.special = _special(self.tok)
        self.gen_length = self.world.config.gen_length
        self.timings: dict[str, float] = {}
        self.environment = environment_record(device="cpu", dtype=torch.float32, seeds={"demo": config.seed})
        """Where this run was made (written into every config.json, summarised in the report's footer)."""

    # -- data --------------------------------------------------------------------------------------
    def corpora(self, n_open: int | None = None, n_summarize: int | None = None):
        half = self.cfg.n_train // 2
        train = make_split(self.world, half, "open", "train") + make_split(self.world, half, "summarize", "train")
        seen = {e.prompt for e in train}
        ev_open = make_split(self.world, self.cfg.n_eval_open if n_open is None else n_open, "open", "test")
        ev_sum = make_split(self.world, self.cfg.n_eval_summarize if n_summarize is None else n_summarize,
                            "summarize", "test", exclude=seen)
        return train, ev_open + ev_sum

    # -- models ------------------------------------------------------------------------------------
    def _fresh_backbone(self) -> LLaDABackbone:
        c = self.cfg
        lc = tiny_llada_config(self.world.vocab_size, d_model=c.d_model, n_layers=c.n_layers, n_heads=c.n_heads,
                               max_sequence_length=128, mask_token_id=self.special.mask, eos_token_id=self.special.eos,
                               eot_token_id=self.special.eot, bos_token_id=self.special.bos)
        torch.manual_seed(c.seed)
        bb = LLaDABackbone(lc, self.special)
        bb.init_weights(torch.Generator().manual_seed(c.seed), std=0.02)
        return bb

    def _cached(self, name: str, key: dict) -> tuple[Path, bool]:
        """The cache folder of a stage and whether it holds a verified copy; a damaged one (a file changed,
        truncated or missing since `_seal`) is removed with a one-line warning, so the stage is rebuilt."""
        path = self.cache / f"{name}-{_fingerprint(key)}"
        if not path.exists():
            return path, False
        problem = verify_checksums(path)
        if problem is None:
            return path, True
        if not (path / CHECKSUMS).exists() and (path / "loss_curve.json").is_file() and (path / "config.json").is_file():
            # complete (loss_curve.json was its last file) but written before checksums existed: seal it as found
            self.echo(f"note: cached stage {path.name} predates checksums; using it and recording them now")
            write_checksums(path)
            return path, True
        self.echo(f"warning: cached stage {path} is damaged ({problem}); rebuilding it")
        shutil.rmtree(path)
        return path, False

    @staticmethod
    def _seal(path: Path) -> None:
        """Record a checksum of every file of a finished cache folder (written last: it also marks completeness)."""
        write_checksums(path)

    def pretrained(self, train) -> LLaDABackbone:
        key = {"stage": "pretrain", "cfg": self.cfg.pretrain.to_dict(), "arch": [self.cfg.d_model, self.cfg.n_layers,
               self.cfg.n_heads], "n_train": self.cfg.n_train, "seed": self.cfg.seed, "world": self.world.config.to_dict()}
        path, hit = self._cached("pretrained-mdm", key)
        if hit:
            self.echo(f"[1/4] pretrained masked DLM: cached ({path.name})")
            return load_backbone(path, special=self.special)
        self.echo(f"[1/4] pretraining a tiny LLaDA-architecture masked DLM ({self.cfg.pretrain.steps} MDM steps)")
        bb = self._fresh_backbone()
        t = time.perf_counter()
        curve = run_stage(bb, self.tok, train, self.cfg.pretrain, seed=self.cfg.seed, block_size=self._block(train),
                          gen_length=self.gen_length, progress=self.progress, desc="pretrain (MDM)")
        self.timings["pretrain_s"] = time.perf_counter() - t
        save_backbone(bb, path)
        self.tok.save_pretrained(str(path))  # so `dsl-llada generate --model <cache dir>` works
        atomic_write_text(path / "loss_curve.json", json.dumps(curve))
        self._seal(path)
        return bb

    def adapted(self, base: LLaDABackbone, train, objective: str) -> torch.nn.Module:
        stage = self.cfg.cpt.replace(objective=objective)
        key = {"stage": objective, "base": self.cfg.pretrain.to_dict(), "cfg": stage.to_dict(),
               "noise_dim": self.cfg.noise_dim, "seed": self.cfg.seed, "n_train": self.cfg.n_train,
               "world": self.world.config.to_dict(),
               "arch": [self.cfg.d_model, self.cfg.n_layers, self.cfg.n_heads]}
        path, hit = self._cached(f"cpt-{objective}", key)
        label = {"dsl": "DSL continue-pretraining", "mdm": "MDM-CPT control", "xdlm": "XDLM control"}[objective]
        if hit:
            self.echo(f"      {label}: cached ({path.name})")
            return DSLModel.from_pretrained(path) if objective == "dsl" else load_backbone(path, special=self.special)
        self.echo(f"      {label} ({stage.steps} steps)")
        model = self._copy_backbone(base)
        if objective == "dsl":
            model = DSLModel.convert(model, DSLConfig(converter=ConverterConfig(noise_dim=self.cfg.noise_dim, beta_init=1.0,
                                                                                noise_seed=self.cfg.seed)))
        t = time.perf_counter()
        curve = run_stage(model, self.tok, train, stage, seed=self.cfg.seed + 1, block_size=self._block(train), gen_length=self.gen_length,
                          progress=self.progress, desc=label)
        self.timings[f"{objective}_s"] = time.perf_counter() - t
        if objective == "dsl":
            model.save_pretrained(path)
        else:
            save_backbone(model, path)
        self.tok.save_pretrained(str(path))
        atomic_write_text(path / "loss_curve.json", json.dumps(curve))
        self._seal(path)
        return model

    def _copy_backbone(self, base: LLaDABackbone) -> LLaDABackbone:
        bb = LLaDABackbone(base.cfg, base.special)
        bb.load_state_dict(base.state_dict())
        return bb

    def _block(self, train) -> int:
        """Block size of the SFT tensors: the longest chat-templated prompt + gen_length (computed once per run)."""
        if getattr(self, "_block_size", None) is None:
            self._block_size = self._longest_prompt(train) + self.gen_length
        return self._block_size

    def _longest_prompt(self, train) -> int:
        return max(len(self.tok.encode(self.tok.apply_chat_template([{"role": "user", "content": e.prompt}],
                                                                        add_generation_prompt=True, tokenize=False),
                                          add_special_tokens=False)) for e in train)

    # -- run ---------------------------------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        t0 = time.perf_counter()
        train, evals = self.corpora()
        base = self.pretrained(train).eval()
        self.echo("[2/4] continue-pretraining from the pretrained model")
        models: dict[str, torch.nn.Module] = {"base": base, "dsl": self.adapted(base, train, "dsl").eval()}
        methods = list(PAPER_METHODS)
        if self.cfg.controls:
            for obj in ("mdm", "xdlm"):
                models[obj] = self.adapted(base, train, obj).eval()
            methods += list(CONTROL_METHODS)
        if self.cfg.dtype != "float32":
            models = {k: cast_for_inference(m, DTYPES[self.cfg.dtype]) for k, m in models.items()}
        self.echo(f"[3/4] sampling {len(evals)} held-out prompts x {len(methods)} methods x NFE {list(self.cfg.nfes)}")
        t = time.perf_counter()
        records = [r for k in range(self.cfg.sample_seeds)
                   for r in sample_records(models, self.world, self.tok, evals, methods, self.cfg.nfes,
                                           gen_length=self.gen_length, batch_size=self.cfg.batch_size,
                                           seed=self.cfg.seed, sample_seed=k)]
        self.timings["sampling_s"] = time.perf_counter() - t
        rows = aggregate(records)
        truth = [score_record(self.world, ex, ex.response, method="World (true samples)", nfe=0, seed=None, index=i,
                              forward_passes=0) for i, ex in enumerate(evals)]
        self.truth_rows = aggregate(truth)
        fixclean = error_correction(models, self.tok, evals[: self.cfg.n_eval_open], n_words=len(self.world.words),
                                    seed=42)
        self.echo("[4/4] writing the report")
        self.timings["total_s"] = time.perf_counter() - t0
        self.write(records, rows, fixclean, models)
        return {"rows": rows, "fixclean": fixclean, "timings": self.timings}

    def sweep(self, sweep: SweepConfig) -> list[dict[str, Any]]:
        """The paper's SDE sensitivity sweep on this demo's DSL checkpoint (cached stages reused); OUT/sweep/."""
        train, evals = self.corpora(sweep.n_open, sweep.n_summarize)
        base = self.pretrained(train).eval()
        self.echo("[2/3] DSL model")
        dsl = self.adapted(base, train, "dsl").eval()
        self.echo("[3/3] SDE sensitivity sweep")
        out = self.out / "sweep"
        rows = run_sweep(dsl, self.world, self.tok, evals, out, sweep, gen_length=self.gen_length,
                         progress=self.progress, echo=self.echo)
        write_sweep(rows, reference_rows(self.world, evals), sweep, out)
        atomic_write_text(out / "config.json", json.dumps({"demo": self.cfg.to_dict(), "sweep": sweep.to_dict(),
                                                           "world": self.world.config.to_dict(),
                                                           "environment": finish_record(self.environment)},
                                                          indent=2) + "\n")
        return rows

    def cache_frontier(self, fc: FrontierConfig) -> list[dict[str, Any]]:
        """Approximate KV caching's quality/speed frontier on this demo's checkpoints (cached stages reused);
        OUT/cache_frontier/."""
        train, evals = self.corpora(fc.n_open, fc.n_summarize)
        base = self.pretrained(train).eval()
        self.echo("[2/3] DSL model")
        dsl = self.adapted(base, train, "dsl").eval()
        self.echo("[3/3] cache frontier")
        out = self.out / "cache_frontier"
        rows = run_frontier({"base": base, "dsl": dsl}, self.world, self.tok, evals, out, fc,
                            gen_length=self.gen_length, progress=self.progress, echo=self.echo)
        write_frontier(rows, fc, reference_rows(self.world, evals), out)
        atomic_write_text(out / "config.json", json.dumps({"demo": self.cfg.to_dict(), "frontier": fc.to_dict(),
                                                           "world": self.world.config.to_dict(),
                                                           "environment": finish_record(self.environment)},
                                                          indent=2) + "\n")
        return rows

    def write(self, records, rows, fixclean, models) -> None:
        out = self.out
        out.mkdir(parents=True, exist_ok=True)
        atomic_write_text(out / "results.jsonl", "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records))
        self.environment = finish_record(self.environment)
        atomic_write_text(out / "config.json", json.dumps({"demo": self.cfg.to_dict(), "world": self.world.config.to_dict(),
                                                           "timings_s": self.timings, "environment": self.environment},
                                                          indent=2) + "\n")
        open_rows = [r for r in rows if r["task"] == "open"]
        plot_nfe_curves(open_rows, out / "nfe_curve.png", title="Toy world, open-ended generation")
        atomic_write_text(out / "report.md", render_report(self, rows, fixclean, models))


def _seed_spread(rows) -> list[str]:
    nfes = sorted({r["nfe"] for r in rows})
    cell = {(r["method"], r["nfe"]): r.get("ppl_seeds") for r in rows}
    out = []
    for m in dict.fromkeys(r["method"] for r in rows):
        vals = [cell.get((m, n)) for n in nfes]
        out.append(f"| {m} | " + " | ".join(f"{min(v):.2f} - {max(v):.2f}" if v else "–" for v in vals) + " |")
    return out


def render_report(demo: Demo, rows, fixclean, models) -> str:
    cfg = demo.cfg
    open_rows = [r for r in rows if r["task"] == "open"]
    sum_rows = [r for r in rows if r["task"] == "summarize"]
    dsl = models["dsl"]
    parts = [
        "# DSL-LLaDA toy-world demo", "",
        f"World: {len(demo.world.topics)} topics, vocabulary {demo.world.vocab_size} tokens, responses padded to "
        f"{demo.gen_length} tokens. Model: LLaDA architecture, d_model {cfg.d_model}, {cfg.n_layers} layers. "
        f"Pretrained {cfg.pretrain.steps} MDM steps; DSL-adapted {cfg.cpt.steps} steps (noise dim {cfg.noise_dim}, "
        f"trained beta {dsl.trained_beta:.3f}). Held-out prompts: {cfg.n_eval_open} open-ended, "
        f"{cfg.n_eval_summarize} summarisation. Perplexity is exact under the world's true distribution "
        f"(epsilon-smoothed, see docs/toy-world.md)." + (f" Sampled with the backbone in {cfg.dtype} (converter softmax, "
                                                         f"posterior mean and SDE state fp32)." if cfg.dtype != "float32" else ""), "",
        "SDE rows: **DSL-SDE** is the paper's defaults (eta by NFE, beta_inf = 2 x trained beta, top-M 512, sensitive "
        "schedule) run with the authors' sampler, noise also in the Heun predictor, so a step adds (eta/gamma_{s+1}) dW; "
        "**DSL-SDE (Alg. 2 as printed)** puts the noise only in the final update, 1/2 (eta/gamma_s + eta/gamma_{s+1}) dW "
        "(350 x more on the first step 0.01 -> 7); **DSL-SDE (eta=0)** is the deterministic sampler. "
        "See docs/samplers.md.", "",
        "## Reference: the world's own samples for the same prompts", "",
        markdown_table(demo.truth_rows, [("task", "task", ""), ("ppl", "PPL", ".2f"), ("rep", "Rep %", ".1f"),
                                         ("d2", "D2 %", ".1f"), ("len", "Len", ".1f")]), "",
        "Each value is followed by its 95 % bootstrap interval (prompts resampled, fixed seed; "
        f"{cfg.sample_seeds} sampling seed(s) per prompt). A claim below counts as reproduced only when the "
        "intervals separate.", "",
        "## Verdicts: the paper's claims at this scale", "", *verdict_lines(verdicts(rows)), "",
        "## Open-ended generation: exact perplexity (lower is better)", "", pivot(open_rows, "ppl"), "",
        *(["## Open-ended perplexity: spread across sampling seeds (min - max of the per-seed values)", "",
           "| method | " + " | ".join(f"NFE {n}" for n in sorted({r['nfe'] for r in open_rows})) + " |",
           "|---|" + "|".join("---" for _ in sorted({r['nfe'] for r in open_rows})) + "|",
           *_seed_spread(open_rows), ""] if cfg.sample_seeds > 1 else []),
        "## Open-ended: Rep % (adjacent identical words; lower is better)", "", pivot(open_rows, "rep", spec=".1f"), "",
        "## Open-ended: length (words)", "", pivot(open_rows, "len", spec=".1f"), "",
        "## Open-ended: Distinct-2 % (corpus-level: no per-prompt interval)", "", pivot(open_rows, "d2", spec=".1f"), "",
        "## Open-ended: outputs inside the world's support %", "", pivot(open_rows, "in_support", spec=".0f"), "",
        "## Open-ended: failure tags (% of samples)", "",
        markdown_table(open_rows, [("method", "method", ""), ("nfe", "NFE", ""), ("premature_eos%", "premature EOS", ".0f"),
                                   ("repetition%", "4-gram repetition", ".0f"), ("degen_ending%", "degenerate ending", ".0f"),
                                   ("empty%", "empty", ".0f"), ("forward_passes", "forward passes", "")]), "",
    ]
    if sum_rows:
        parts += ["## Summarisation: ROUGE-1 / ROUGE-2 / ROUGE-L F1 and exact perplexity", "",
                  markdown_table(sum_rows, [("method", "method", ""), ("nfe", "NFE", ""), ("rouge1", "R-1", ".1f"),
                                            ("rouge2", "R-2", ".1f"), ("rougeL", "R-L", ".1f"), ("ppl", "PPL", ".2f"),
                                            ("len", "Len", ".1f")]), ""]
    parts += ["## Random-token error correction (single forward; Fix/Clean %)", "",
              markdown_table(fixclean, [("model", "model", ""), ("rate", "corrupted", ".0%"), ("fix", "Fix", ".1f"),
                                        ("clean", "Clean", ".1f")]), "",
              "## Timings (s)", "", "| stage | seconds |", "|---|---|"]
    parts += [f"| {k} | {v:.1f} |" for k, v in demo.timings.items()]
    parts += ["", "![NFE curves](nfe_curve.png)", "", "---", "", environment_footer(demo.environment), ""]
    return "\n".join(parts)


def run_demo_cli(args) -> int:
    """Entry point of `dsl-llada demo` (prints; the library parts log)."""
    from ..outputs import prepare_output_dir

    from ..loading import auto_dtype

    dtype = str(auto_dtype("cpu")).removeprefix("torch.") if args.dtype == "auto" else args.dtype
    cfg = DemoConfig.preset(quick=args.quick, controls=args.controls, seed=args.seed, sample_seeds=args.seeds,
                            dtype=dtype)
    prepare_output_dir(args.out, kind="demo", reuse=True, what="--out folder")  # before minutes of training
    sweep = SweepConfig.preset(quick=args.quick, n_open=args.sweep_prompts, seed=args.seed) if args.sweep else None
    demo = Demo(cfg, Path(args.out), progress=not args.quiet)
    if args.cache_frontier:
        t0 = time.perf_counter()
        rows = demo.cache_frontier(FrontierConfig.preset(quick=args.quick, seed=args.seed))
        for line in recommendation_lines(rows):
            print(line)
        print(f"cache frontier: {Path(args.out) / 'cache_frontier' / 'frontier.md'}  (plot: frontier.png, timed runs: "
              f"runs.jsonl, outputs: samples.jsonl); {time.perf_counter() - t0:.0f} s")
        return 0
    if sweep is not None:
        t0 = time.perf_counter()
        demo.sweep(sweep)
        print(f"sweep table: {Path(args.out) / 'sweep' / 'sweep.md'}  (plot: sweep.png, rows with configs: "
              f"sweep.jsonl, outputs: samples.jsonl); {time.perf_counter() - t0:.0f} s")
        return 0
    result = demo.run()
    open_rows = [r for r in result["rows"] if r["task"] == "open"]
    print()
    print(pivot(open_rows, "ppl"))
    print()
    print("\n".join(verdict_lines(verdicts(result["rows"]))))
    print()
    print(f"report: {Path(args.out) / 'report.md'}  (plot: nfe_curve.png, samples: results.jsonl)")
    print(f"total time: {result['timings']['total_s']:.0f} s")
    return 0
