"""`dsl-llada demo`: the paper's whole pipeline on the embedded toy world, on a CPU, in minutes.

Stages (each cached under OUT/cache and reused when its config is unchanged):
  1. world + tokenizer + SFT-format corpus;
  2. pretrain a tiny LLaDA-architecture masked DLM with the MDM objective (the stand-in for LLaDA-Instruct);
  3. DSL continue-pretraining from it (and, with --controls, MDM-CPT and XDLM with the same steps);
  4. sample held-out prompts with DSL-SDE and the discrete baselines at several NFE, score exactly;
  5. write report.md, nfe_curve.png, excess_loss.png, bayes_floor.json, results.jsonl, config.json as one set
     (`run_files`: the report moved in last, so it never sits beside another run's results).
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

from ..core.backbones import save_backbone
from ..core.backbones.llada import LLaDABackbone, tiny_llada_config
from ..core.backbones.base import Backbone
from ..config import ConfigBase, ConverterConfig, DSLConfig, _check
from ..runtime.environment import environment_record, finish_record
from ..core.loading import DTYPES, open_model
from ..core.model_source import ModelSource
from ..eval.report import plot_nfe_curves
from ..core.model import DSLModel, cast_for_inference
from ..artifacts.atomic import atomic_write_text
from ..sampling.progress import progress as progress_bar
from .evaluate import CONTROL_METHODS, ORACLE_METHODS, PAPER_METHODS, Reuse, aggregate, error_correction, \
    sample_records, score_record
from .cache_frontier import FrontierConfig, run_frontier
from .frontier_report import write_frontier
from .sweep import SweepConfig, reference_rows, run_sweep, write_sweep
from .tasks import make_split
from .tokenizer import build_tokenizer, special_tokens
from .world import ToyWorld, ToyWorldConfig
from .bayes_floor import dsl_excess
from .demo_report import render_report
from .diagnose import tv_rows
from .demo_train import TrainStage, longest_prompt, run_stage, train_conversations
from .floor_report import floor_rows, held_out, plot_excess
from .oracle import oracle_models
from .run_files import COMPARISON_FILES, FRONTIER_FILES, SWEEP_FILES, new_run_id, staged_files
from .shipped import load_pretrained

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
    pretrain: TrainStage = field(default_factory=lambda: TrainStage(objective="mdm", steps=4500, lr=1e-3, warmup=100,
                                                                    stratified_t=True))
    pretrained: str = "auto"
    """'auto': start from the pretrained masked DLM shipped with the package when this configuration is the one it
    was trained for (`toy/shipped.py`), else pretrain; 'scratch': always pretrain (`--from-scratch`)."""
    cpt: TrainStage = field(default_factory=lambda: TrainStage(objective="dsl", steps=2000, lr=5e-4, warmup=50))
    """The continue-pretraining stage; for DSL `steps` is a cap (see `cpt_target_excess`)."""
    cpt_target_excess: float = 0.12
    """The DSL stage ends once its held-out excess loss over the exact Bayes floor (γ from the training mix,
    nats per position, `bayes_floor.dsl_excess`) is at most this, checked every `cpt_check_every` updates; 0 = run
    all `cpt.steps`. A measured point, not a step count, so that hosts whose kernels train different trajectories
    stop at the same quality."""
    cpt_check_every: int = 250
    oracle: bool = True
    """Also sample with the exact oracle denoisers and measure every checkpoint against the Bayes floor."""
    n_heldout: int = 64
    """Held-out conversations per task for the Bayes-floor measurements (the 'valid' split)."""
    n_eval_open: int = 48
    n_eval_summarize: int = 24
    nfes: tuple = (4, 8, 16, 32, 64)
    tv_documents: int = 4
    """Summarisation documents of the TV-distance table (`toy.diagnose.tv_rows`: each sampler's output distribution
    against the document's exact summary distribution, trained and oracle denoisers, at every NFE); 0 = no table.
    Runs with the oracle measurements."""
    tv_samples: int = 16
    """Samples per document and (sampler, denoiser, NFE) of the TV table."""
    batch_size: int = 48
    dtype: str = "float32"
    """Backbone dtype of the evaluation stages (sampling, error correction): 'float32' or 'bfloat16' (the paper's
    recipe, `DSLModel.to_compute_dtype`); training is always fp32 and the cached checkpoints are fp32."""
    sample_seeds: int = 1
    """`--seeds K`: sample every prompt with K seeds (seed k = 0 is the historical one); the tables pool them, the
    intervals resample prompts, and the per-seed perplexities give the spread across seeds."""

    _nested = {"pretrain": TrainStage, "cpt": TrainStage}

    def __post_init__(self) -> None:
        _check(self.pretrained in ("auto", "scratch"),
               f"pretrained={self.pretrained!r} is not valid; expected one of ['auto', 'scratch']")
        _check(isinstance(self.cpt_target_excess, (int, float)) and 0.0 <= self.cpt_target_excess < 10.0,
               f"cpt_target_excess={self.cpt_target_excess!r} must be a number in [0, 10) (nats per position; 0 = no target)")
        _check(isinstance(self.cpt_check_every, int) and 1 <= self.cpt_check_every <= 100_000,
               f"cpt_check_every={self.cpt_check_every!r} must be an integer from 1 to 100000")
        _check(isinstance(self.n_heldout, int) and 1 <= self.n_heldout <= 10_000,
               f"n_heldout={self.n_heldout!r} must be an integer from 1 to 10000")
        _check(isinstance(self.tv_documents, int) and 0 <= self.tv_documents <= self.n_eval_summarize,
               f"tv_documents={self.tv_documents!r} must be an integer from 0 to n_eval_summarize "
               f"({self.n_eval_summarize})")
        _check(isinstance(self.tv_samples, int) and 1 <= self.tv_samples <= 1024,
               f"tv_samples={self.tv_samples!r} must be an integer from 1 to 1024")

    @classmethod
    def preset(cls, *, quick: bool, controls: bool = False, seed: int = 0, sample_seeds: int = 1,
               dtype: str = "float32", from_scratch: bool = False) -> "DemoConfig":
        if not 1 <= sample_seeds <= MAX_SAMPLE_SEEDS:
            raise ValueError(f"--seeds must be an integer from 1 to {MAX_SAMPLE_SEEDS}, got {sample_seeds!r}")
        if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= MAX_DEMO_SEED:
            raise ValueError(f"--seed {seed!r} is out of range: it must be an integer from 0 to {MAX_DEMO_SEED} (the "
                             f"demo's generators take 32-bit seeds)")
        pretrained = "scratch" if from_scratch else "auto"
        if not quick:
            return cls(seed=seed, controls=controls, sample_seeds=sample_seeds, dtype=dtype, pretrained=pretrained)
        return cls(seed=seed, quick=True, controls=controls, sample_seeds=sample_seeds, dtype=dtype,
                   n_eval_open=16, n_eval_summarize=8, nfes=(4, 16, 64), n_heldout=16, cpt_target_excess=0.0,
                   tv_documents=2, tv_samples=8,
                   pretrained=pretrained,
                   cpt=TrainStage(objective="dsl", steps=150, lr=1e-3, warmup=10))


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


class Demo:
    def __init__(self, config: DemoConfig, out: Path, *, progress: bool = True, echo=print):
        self.cfg, self.out, self.progress, self.echo = config, Path(out), progress, echo
        self.cache = self.out / "cache"
        self.world = ToyWorld(ToyWorldConfig(**{"seed": config.seed, **config.world}))
        self.tok = build_tokenizer(self.world)
        self.special = special_tokens(self.tok)
        self.gen_length = self.world.config.gen_length
        self.timings: dict[str, float] = {}
        self.environment = environment_record(device="cpu", dtype=torch.float32, seeds={"demo": config.seed})
        """Where this run was made (written into every config.json, summarised in the report's footer)."""
        self.base_source = "scratch"
        """Where the pretrained masked DLM came from: 'package' (the shipped checkpoint) or 'scratch'."""
        self.stops: dict[str, dict[str, Any]] = {}
        """Per continue-pretraining stage that ran to a target: its checks of the excess loss and where it ended."""
        self._heldout: tuple[torch.Tensor, torch.Tensor] | None = None
        self.tv: list[dict[str, Any]] = []
        """The TV-distance rows of this run (`toy.diagnose.tv_rows`), when the oracle measurements ran."""
        self.run_id = new_run_id()
        """This run's id, in its config.json, bayes_floor.json and report.md (`run_files`)."""

    def heldout(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The held-out conversations of the Bayes-floor measurements (built once)."""
        if self._heldout is None:
            self._heldout = held_out(self.world, self.tok, self.cfg.n_heldout, self.gen_length)
        return self._heldout

    # -- data --------------------------------------------------------------------------------------
    def corpora(self, n_open: int | None = None, n_summarize: int | None = None):
        train = train_conversations(self.world, self.cfg.n_train)
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
        shipped = load_pretrained(key, self.special) if self.cfg.pretrained == "auto" else None
        if shipped is not None:
            self.base_source = "package"
            self.echo("[1/4] pretrained masked DLM: the one shipped with the package (docs/toy-world.md; "
                      "--from-scratch retrains it)")
            return shipped
        path, hit = self._cached("pretrained-mdm", key)
        if hit:
            self.echo(f"[1/4] pretrained masked DLM: cached ({path.name})")
            cached = self._open(path)
            assert isinstance(cached, LLaDABackbone)  # the stage saved one
            return cached
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

    def _open(self, path: Path) -> DSLModel | Backbone:
        """A cached stage's model (saved with the world's tokenizer), on the CPU in fp32 with the world's ids."""
        source = ModelSource(path=str(path), device="cpu", dtype="float32")
        return open_model(source, chat_template=False, special=self.special).model

    def adapted(self, base: LLaDABackbone, train, objective: str) -> DSLModel | Backbone:
        stage = self.cfg.cpt.replace(objective=objective)
        if objective != "dsl" and "dsl" in self.stops:
            # the paper's controls get as many extra updates as the DSL stage took to its target
            stage = stage.replace(steps=int(self.stops["dsl"]["steps"]))
        key = {"stage": objective, "base": self.cfg.pretrain.to_dict(), "cfg": stage.to_dict(),
               "noise_dim": self.cfg.noise_dim, "seed": self.cfg.seed, "n_train": self.cfg.n_train,
               "world": self.world.config.to_dict(),
               "arch": [self.cfg.d_model, self.cfg.n_layers, self.cfg.n_heads], "base_source": self.base_source}
        target = self.cfg.cpt_target_excess if objective == "dsl" else 0.0
        if target:
            key.update(target_excess=target, check_every=self.cfg.cpt_check_every, n_heldout=self.cfg.n_heldout)
        path, hit = self._cached(f"cpt-{objective}", key)
        label = {"dsl": "DSL continue-pretraining", "mdm": "MDM-CPT control", "xdlm": "XDLM control"}[objective]
        if hit:
            self.echo(f"      {label}: cached ({path.name})")
            if (path / "stop.json").is_file():
                self.stops[objective] = json.loads((path / "stop.json").read_text())
            return self._open(path)  # a DSL checkpoint for "dsl", a backbone for the controls
        self.echo(f"      {label} ({stage.steps} steps" + (f", ending once the held-out excess loss over the Bayes "
                                                          f"floor is <= {target:g} nats)" if target else ")"))
        copied = self._copy_backbone(base)
        model: DSLModel | Backbone = copied
        if objective == "dsl":
            model = DSLModel.convert(copied, DSLConfig(converter=ConverterConfig(noise_dim=self.cfg.noise_dim, beta_init=1.0,
                                                                                noise_seed=self.cfg.seed)))
        t = time.perf_counter()
        checks: list[dict[str, float]] = []

        def check(step: int, m: torch.nn.Module) -> bool:
            assert isinstance(m, DSLModel)  # only the DSL stage runs to a target
            ids, plen = self.heldout()
            p = dsl_excess(m, self.world, self.special, ids, plen, seed=self.cfg.seed)
            checks.append({"step": step, "excess": p.excess, "model_ce": p.model_ce, "oracle_ce": p.oracle_ce})
            self.echo(f"      update {step}: held-out excess loss {p.excess:.3f} nats over the Bayes floor "
                      f"{p.oracle_ce:.3f} (target <= {target:g})")
            return p.excess <= target

        curve = run_stage(model, self.tok, train, stage, seed=self.cfg.seed + 1, block_size=self._block(train),
                          gen_length=self.gen_length, progress=self.progress, desc=label, check=check if target else None,
                          check_every=self.cfg.cpt_check_every)
        self.timings[f"{objective}_s"] = time.perf_counter() - t
        if target:
            self.stops[objective] = {"target": target, "steps": len(curve), "checks": checks}
        if isinstance(model, DSLModel):  # the "dsl" objective
            model.save_pretrained(path)
        else:
            save_backbone(model, path)
        self.tok.save_pretrained(str(path))
        if objective in self.stops:
            atomic_write_text(path / "stop.json", json.dumps(self.stops[objective]))
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
            self._block_size = longest_prompt(self.tok, train) + self.gen_length
        return self._block_size

    # -- run ---------------------------------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        t0 = time.perf_counter()
        train, evals = self.corpora()
        base = self.pretrained(train).eval()
        self.echo("[2/4] continue-pretraining from the pretrained model")
        models: dict[str, DSLModel | Backbone] = {"base": base, "dsl": self.adapted(base, train, "dsl").eval()}
        methods = list(PAPER_METHODS)
        if self.cfg.controls:
            for obj in ("mdm", "xdlm"):
                models[obj] = self.adapted(base, train, obj).eval()
            methods += list(CONTROL_METHODS)
        if self.cfg.dtype != "float32":
            models = {k: cast_for_inference(m, DTYPES[self.cfg.dtype]) for k, m in models.items()}
        sampling_models: dict[str, DSLModel | Backbone] = dict(models)
        if self.cfg.oracle:
            dsl = models["dsl"]
            assert isinstance(dsl, DSLModel)
            sampling_models.update(oracle_models(self.world, self.special, dsl))
            methods += list(ORACLE_METHODS)
        self.echo(f"[3/4] sampling {len(evals)} held-out prompts x {len(methods)} methods x NFE {list(self.cfg.nfes)}")
        t = time.perf_counter()
        records = self.sample(sampling_models, evals, methods)
        self.timings["sampling_s"] = time.perf_counter() - t
        rows = aggregate(records)
        truth = [score_record(self.world, ex, ex.response, method="World (true samples)", nfe=0, seed=None, index=i,
                              forward_passes=0) for i, ex in enumerate(evals)]
        self.truth_rows = aggregate(truth)
        fixclean = error_correction(models, self.tok, evals[: self.cfg.n_eval_open], n_words=len(self.world.words),
                                    seed=42)
        floors: list[dict[str, Any]] = []
        if self.cfg.oracle:
            self.echo("      every checkpoint against the Bayes floor (held-out conversations)")
            t = time.perf_counter()
            floors = floor_rows(models, self.world, self.special, *self.heldout(), seed=self.cfg.seed)
            self.timings["bayes_floor_s"] = time.perf_counter() - t
            if self.cfg.tv_documents:
                self.echo("      output distributions against the exact summary distributions (TV distance)")
                t = time.perf_counter()
                docs = [e for e in evals if e.task == "summarize"][: self.cfg.tv_documents]
                self.tv = tv_rows(sampling_models, self.world, self.tok, docs, nfes=self.cfg.nfes,
                                  n=self.cfg.tv_samples, seed=self.cfg.seed, batch_size=len(docs) * self.cfg.tv_samples)
                self.timings["tv_s"] = time.perf_counter() - t
        self.echo("[4/4] writing the report")
        self.timings["total_s"] = time.perf_counter() - t0
        self.write(records, rows, fixclean, models, floors)
        return {"rows": rows, "records": records, "fixclean": fixclean, "timings": self.timings, "floors": floors}

    def sample(self, models: dict[str, DSLModel | Backbone], evals, methods) -> list[dict[str, Any]]:
        """Every (sampling seed, method, NFE) run over the held-out prompts, in that order, with a progress bar over
        the runs; a seed-free sampler's outputs are reused across repeated prompts, NFEs of the same tokens and
        seeds (`sample_records`)."""
        runs = [(k, m, nfe) for k in range(self.cfg.sample_seeds) for m in methods for nfe in self.cfg.nfes]
        reuse: Reuse = {}
        records: list[dict[str, Any]] = []
        for k, method, nfe in progress_bar(runs, desc="sampling (method x NFE runs)", enabled=self.progress, leave=True):
            records += sample_records(models, self.world, self.tok, evals, [method], [nfe], gen_length=self.gen_length,
                                      batch_size=self.cfg.batch_size, seed=self.cfg.seed, sample_seed=k, reuse=reuse)
        return records

    def sweep(self, sweep: SweepConfig) -> list[dict[str, Any]]:
        """The paper's SDE sensitivity sweep on this demo's DSL checkpoint (cached stages reused); OUT/sweep/."""
        train, evals = self.corpora(sweep.n_open, sweep.n_summarize)
        base = self.pretrained(train).eval()
        self.echo("[2/3] DSL model")
        dsl = self.adapted(base, train, "dsl").eval()
        assert isinstance(dsl, DSLModel)  # the "dsl" stage is a DSL checkpoint
        self.echo("[3/3] SDE sensitivity sweep")
        out = self.out / "sweep"
        rows = run_sweep(dsl, self.world, self.tok, evals, out, sweep, gen_length=self.gen_length,
                         progress=self.progress, echo=self.echo)
        with staged_files(out, SWEEP_FILES, report="sweep.md") as stage:  # the report last, as one set
            atomic_write_text(stage / "config.json", json.dumps(
                {"run_id": self.run_id, "files": sorted(SWEEP_FILES), "demo": self.cfg.to_dict(),
                 "sweep": sweep.to_dict(), "world": self.world.config.to_dict(),
                 "environment": finish_record(self.environment)}, indent=2) + "\n")
            write_sweep(rows, reference_rows(self.world, evals), sweep, stage)
        return rows

    def cache_frontier(self, fc: FrontierConfig) -> list[dict[str, Any]]:
        """Every sampler's exact quality against samples per second on this demo's checkpoints (cached stages
        reused), with the exact denoisers as the ceiling when `fc.oracle`; OUT/cache_frontier/."""
        train, evals = self.corpora(fc.n_open, fc.n_summarize)
        base = self.pretrained(train).eval()
        self.echo("[2/3] DSL model")
        dsl = self.adapted(base, train, "dsl").eval()
        self.echo("[3/3] cache frontier")
        out = self.out / "cache_frontier"
        models: dict[str, Any] = {"base": base, "dsl": dsl}
        if fc.oracle:
            assert isinstance(dsl, DSLModel)
            models |= oracle_models(self.world, self.special, dsl)
        rows = run_frontier(models, self.world, self.tok, evals, out, fc,
                            gen_length=self.gen_length, progress=self.progress, echo=self.echo)
        reference = reference_rows(self.world, evals)
        with staged_files(out, FRONTIER_FILES, report="frontier.md") as stage:  # the report last, as one set
            # with runs.jsonl, config.json holds every input of frontier.md (`frontier_report.render_run`)
            atomic_write_text(stage / "config.json", json.dumps(
                {"run_id": self.run_id, "files": sorted(FRONTIER_FILES), "demo": self.cfg.to_dict(),
                 "frontier": fc.to_dict(), "keys": [r["key"] for r in rows], "reference": reference,
                 "world": self.world.config.to_dict(), "environment": finish_record(self.environment)},
                indent=2) + "\n")
            write_frontier(rows, fc.to_dict(), reference, stage)
        return rows

    def write(self, records, rows, fixclean, models, floors=()) -> None:
        """Write the run's files into OUT as one set (`run_files.staged_files`): report.md is moved in last, after
        the previous run's report is removed, so a kill at any point never leaves a report beside another run's
        results. config.json lists the files and, with bayes_floor.json and report.md, names the run's id."""
        names = ["results.jsonl", "config.json", "nfe_curve.png", "report.md"]
        if floors:
            names += ["bayes_floor.json", "excess_loss.png"]
        self.environment = finish_record(self.environment)
        with staged_files(self.out, COMPARISON_FILES, report="report.md") as stage:
            atomic_write_text(stage / "results.jsonl", "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records))
            atomic_write_text(stage / "config.json", json.dumps(
                {"run_id": self.run_id, "files": sorted(names), "demo": self.cfg.to_dict(),
                 "world": self.world.config.to_dict(), "timings_s": self.timings, "environment": self.environment},
                indent=2) + "\n")
            open_rows = [r for r in rows if r["task"] == "open"]
            plot_nfe_curves(open_rows, stage / "nfe_curve.png", title="Toy world, open-ended generation")
            if floors:
                atomic_write_text(stage / "bayes_floor.json", json.dumps(
                    {"run_id": self.run_id, "rows": list(floors), "stops": self.stops, "tv": self.tv}, indent=1))
                plot_excess(floors, stage / "excess_loss.png")
            atomic_write_text(stage / "report.md", render_report(self, records, rows, fixclean, models, floors))
