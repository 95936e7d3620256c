"""Where a trained DSL model's error enters the SDE, measured against the toy world's exact denoiser.

Every measurement here runs the library's own `sample_sde` unchanged, on `PairedDSLModel`: two DSL models over one
noise table behind a single `DSLModel`. Each denoiser evaluation of a run is answered by one of them (which one is a
function of the evaluation's index, so "the trained model for the first k Heun steps, the oracle after" is a pair, not
a sampler option), and an observer can see both models' logits on the very state the sampler built:

- `trajectory_kl`: KL(oracle || model) of the two posteriors over tokens at every response position of every
  evaluation along real trajectories of the trained model, by SNR band; the same runs give `final_decodes`, the
  model's argmax at the last SNR against the nearest noise embedding of the final state and the oracle's argmax;
- `swap_runs`: the trained model for the first k Heun steps and the oracle after (and the reverse), exact quality
  per k;
- `tv_rows`: total-variation distance between a sampler's outputs and the exact summary distribution of a document,
  with a bootstrap interval and the finite-sample floor;
- `identical_outputs`: how many outputs of a method agree between two NFEs of a finished demo's `results.jsonl`.

A sampler run through a pair makes 2S + 1 denoiser evaluations (S Heun steps of two evaluations each, then the
decode at the last SNR): `evaluation_gammas(config)` lists their SNRs in call order, and the pair counts its calls
modulo 2S + 1, so it serves any number of consecutive whole runs with that config (no Block SDE, no key/value cache,
no step callback that drops rows).
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import nn

from ..core.backbones.base import Backbone, Positions
from ..config import SDEConfig
from ..core.converter import Converter
from ..core.model import DSLModel
from ..core.numerics import Workspace
from ..sampling.batches import run_batch
from ..sampling.registry import get_spec, sampler_config
from .evaluate import aggregate, sampled_rows, score_record
from .oracle import response_machine
from .pfsa import Pfsa
from .tasks import TaskExample, render_prompt
from .world import ToyWorld

__all__ = ["BANDS", "Evaluation", "PairedDSLModel", "TV_METHODS", "evaluation_gammas", "exact_distribution",
           "final_decodes", "first_off_support", "identical_outputs", "nearest_decode", "swap_runs", "total_variation",
           "trajectory_kl", "tv_from_outputs", "tv_rows"]

BANDS: tuple[tuple[float, float], ...] = ((0.0, 1.0), (1.0, 7.0), (7.0, 30.0), (30.0, math.inf))
"""SNR bands [lo, hi) of the KL table; the last one holds the schedule's end (74 or 100) and the final decode."""


def evaluation_gammas(config: SDEConfig) -> list[float]:
    """The SNR of each denoiser evaluation of one `sample_sde` run with `config`, in call order: the predictor at
    γ_s and the corrector at γ_{s+1} for every Heun step s, then the decode at the last SNR (2S + 1 values)."""
    grid = config.snr_grid
    out: list[float] = []
    for s in range(len(grid) - 1):
        out += [grid[s], grid[s + 1]]
    return out + [grid[-1]]


def band_of(gamma: float, bands: Sequence[tuple[float, float]] = BANDS) -> int:
    """Index of the band [lo, hi) that holds `gamma`."""
    for i, (lo, hi) in enumerate(bands):
        if lo <= gamma < hi:
            return i
    raise ValueError(f"gamma={gamma!r} lies in none of the bands {list(bands)}")


# -- the pair --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Evaluation:
    """What a pair's observer sees at one denoiser evaluation."""

    index: int
    """Position of the evaluation in its run (0 .. 2S; 2S is the decode)."""
    gamma: float
    state: torch.Tensor
    """z = γ·y, (B, W, d): the noisy state both models read."""
    logits: tuple[torch.Tensor | None, torch.Tensor | None]
    """(first, second) model's (B, W, V) logits; both set when an observer is attached."""
    driver: int
    """0 or 1: the model whose answer the sampler received."""


class _Router:
    """Shared run state of a pair: the call counter, the state of the current evaluation, and the two rules."""

    def __init__(self, gammas: list[float], drive: Callable[[int], int], observer: Callable[[Evaluation], None] | None):
        self.gammas, self.drive, self.observer = gammas, drive, observer
        self.calls = 0
        self.state: torch.Tensor | None = None


class _PairConverter(Converter):
    """Both models' converters on the same state; their backbone inputs side by side along the hidden axis. The
    second model reads β_inf × (its trained β / the first's): each at the same multiple of its own trained β."""

    def __init__(self, first: DSLModel, second: DSLModel, router: _Router):
        nn.Module.__init__(self)
        self.a, self.b = first.converter, second.converter
        self.noise_a = first.unit_noise().detach()
        self.noise_b = second.unit_noise().detach()
        self.ratio = second.trained_beta / first.trained_beta
        self.router = router

    def forward(self, z: torch.Tensor, E: torch.Tensor, beta: torch.Tensor | float | None = None, *,
                tolerance: float = 0.0, workspace: Workspace | None = None) -> torch.Tensor:
        self.router.state = z.detach()
        beta_b = None if beta is None else float(beta) * self.ratio
        ha = self.a(z, self.noise_a, beta, tolerance=tolerance, workspace=workspace)
        hb = self.b(z, self.noise_b, beta_b, tolerance=tolerance, workspace=workspace)
        return torch.cat([ha.float(), hb.float()], dim=-1)

    def clean_embedding(self, ids: torch.Tensor) -> torch.Tensor:
        return torch.cat([self.a.clean_embedding(ids).float(), self.b.clean_embedding(ids).float()], dim=-1)


class _PairBackbone(Backbone):
    """Splits the side-by-side inputs and asks the driving model (both, when an observer is attached)."""

    family = "paired"

    def __init__(self, a: Backbone, b: Backbone, router: _Router):
        super().__init__()
        self.a, self.b, self.router = a, b, router
        self.special = a.special

    @property
    def vocab_size(self) -> int:
        return self.a.vocab_size

    @property
    def hidden_size(self) -> int:
        return self.a.hidden_size + self.b.hidden_size

    @property
    def max_length(self) -> int | None:
        limits = [m for m in (self.a.max_length, self.b.max_length) if m is not None]
        return min(limits) if limits else None

    def input_embeddings(self) -> nn.Embedding:
        return self.a.input_embeddings()

    def config_dict(self) -> dict[str, Any]:
        return {"model_type": self.family, "first": self.a.config_dict(), "second": self.b.config_dict()}

    def forward(self, inputs_embeds: torch.Tensor, attention_mask: torch.Tensor | None = None, *,
                positions: Positions = None) -> torch.Tensor:
        r = self.router
        j = r.calls % len(r.gammas)
        r.calls += 1
        who = r.drive(j)
        if who not in (0, 1):
            raise ValueError(f"a pair's drive rule must return 0 or 1, got {who!r} for evaluation {j}")
        ha = self.a.hidden_size
        dtype = self.a.input_embeddings().weight.dtype
        want = (who == 0 or r.observer is not None, who == 1 or r.observer is not None)
        la = self.a(inputs_embeds[..., :ha].to(dtype).contiguous(), attention_mask, positions=positions) \
            if want[0] else None
        lb = self.b(inputs_embeds[..., ha:].contiguous(), attention_mask, positions=positions) if want[1] else None
        if r.observer is not None:
            assert r.state is not None  # the converter ran first
            r.observer(Evaluation(j, r.gammas[j], r.state, (la, lb), who))
        out = la if who == 0 else lb
        assert out is not None
        return out.float()


class PairedDSLModel(DSLModel):
    """Two DSL models over one noise table as one `DSLModel` for `sample_sde` (module docstring).

    `drive(j)` (0 = `first`, 1 = `second`) picks the model that answers evaluation j of a run; `observer`, when
    given, makes both answer every evaluation and sees an `Evaluation`. `config` is the SDE config the pair will be
    sampled with (its schedule numbers the evaluations). The context and the posterior mean use `first`'s noise
    table; `second`'s must be the same table (to 1e-5).
    """

    def __init__(self, first: DSLModel, second: DSLModel, config: SDEConfig, drive: Callable[[int], int],
                 observer: Callable[[Evaluation], None] | None = None):
        if config.block_length or config.kv_cache != "off" or config.compile:
            raise ValueError("a paired model runs the whole-response SDE without a key/value cache or compilation "
                             f"(got block_length={config.block_length}, kv_cache={config.kv_cache!r}, "
                             f"compile={config.compile})")
        if first.vocab_size != second.vocab_size or first.special.mask != second.special.mask:
            raise ValueError(f"the paired models need one vocabulary: {first.vocab_size} and {second.vocab_size} "
                             f"tokens, [MASK] ids {first.special.mask} and {second.special.mask}")
        ea, eb = first.unit_noise().detach(), second.unit_noise().detach()
        if ea.shape != eb.shape or not torch.allclose(ea, eb.to(ea.device), atol=1e-5, rtol=0.0):
            raise ValueError("the paired models must share one noise table (e.g. the oracle built with "
                             "oracle_dsl_model over the trained model's unit_noise())")
        nn.Module.__init__(self)
        self.config = first.config
        self.first, self.second = first, second
        self.router = _Router(evaluation_gammas(config), drive, observer)
        self.noise_embed = first.noise_embed
        self.backbone = _PairBackbone(first.backbone, second.backbone, self.router)
        self.converter = _PairConverter(first, second, self.router)

    @property
    def trained_beta(self) -> float:
        return self.first.trained_beta

    @property
    def evaluations_per_run(self) -> int:
        return len(self.router.gammas)

    def reset(self) -> None:
        """Start counting evaluations from a new run (after an interrupted one)."""
        self.router.calls = 0

    def context_embed(self, ids: torch.Tensor) -> torch.Tensor:
        return torch.cat([self.first.context_embed(ids).float(), self.second.context_embed(ids).float()], dim=-1)

    def mask_embed(self, ids: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError("a paired model runs the whole-response SDE only (no Block SDE)")

    def logits_from_ids(self, ids: torch.Tensor, attention_mask: torch.Tensor | None = None, *,
                        positions: Positions = None) -> torch.Tensor:
        raise NotImplementedError("a paired model runs the SDE only (no discrete sampler)")


def switch_after(k_evaluations: int) -> Callable[[int], int]:
    """The drive rule 'the first model for the first `k_evaluations` evaluations of a run, the second after'."""
    return lambda j: 0 if j < k_evaluations else 1


# -- exact strings ------------------------------------------------------------------------------------------


def first_off_support(machine: Pfsa, ids: Sequence[int]) -> int | None:
    """The first position at which `ids` (a response's tokens before its end) leaves the automaton's support: the
    index of the first token no path can emit after the prefix, len(ids) when the prefix is fine but cannot end
    there (a premature or missing end), None when ids + end is in the support."""
    alive = np.zeros(machine.n_states, bool)
    alive[machine.start] = True
    for t, tok in enumerate(list(ids) + [machine.end_id]):
        arcs = (machine.tok == tok) & alive[machine.src] & (machine.prob > 0)
        if not arcs.any():
            return t
        alive = np.zeros(machine.n_states, bool)
        alive[machine.dst[arcs]] = True
    return None if alive[machine.final] else len(ids)


def response_ids(world: ToyWorld, ids: Sequence[int], stop_ids: Sequence[int]) -> list[int]:
    """A sampled response's scoring ids: the tokens before the first stop token, special tokens as [UNK]."""
    out = []
    for t in ids:
        if t in stop_ids:
            break
        out.append(int(t))
    return world.ids_for_scoring([world.tokens[t] for t in out])


# -- 1 and 3: KL along the trajectory, and the final decode --------------------------------------------------


def nearest_decode(state: torch.Tensor, noise_table: torch.Tensor, mask_id: int) -> torch.Tensor:
    """argmax_w ⟨state, e_w⟩ over every token but [MASK] (the tokens the sampler may emit): the noise embedding
    nearest in direction to the state, (B, W, d) -> (B, W)."""
    scores = state.float() @ noise_table.float().T
    scores[..., mask_id] = float("-inf")
    return scores.argmax(-1)


def _argmax_without(logits: torch.Tensor, mask_id: int) -> torch.Tensor:
    """Argmax over the vocabulary with [MASK] excluded (the sampler's decode rule)."""
    logits = logits.clone()
    logits[..., mask_id] = float("-inf")
    return logits.argmax(-1)


def _kl_rows(p_logits: torch.Tensor, q_logits: torch.Tensor) -> torch.Tensor:
    """KL(softmax p || softmax q) per row of (..., V) logits, float64; a token p rules out (-inf) adds 0."""
    lp = torch.log_softmax(p_logits.double(), -1)
    lq = torch.log_softmax(q_logits.double(), -1)
    p = lp.exp()
    terms = torch.where(p > 0, p * (lp - lq), torch.zeros_like(p))
    return terms.sum(-1)


@dataclass
class _KLAccumulator:
    """Per evaluation index: sums over (rows, positions) of KL, argmax disagreement and the state's norm, split by
    the oracle's argmax class (a word, or the end: `<|eot_id|>` / padding)."""

    gammas: list[float]
    end_ids: tuple[int, ...]
    mask_id: int
    sums: dict[str, np.ndarray] = field(default_factory=dict)
    argmax: list[torch.Tensor] = field(default_factory=list)
    final: dict[str, torch.Tensor] = field(default_factory=dict)

    def __post_init__(self) -> None:
        n = len(self.gammas)
        for key in ("kl", "n", "kl_word", "n_word", "kl_end", "n_end", "disagree", "norm"):
            self.sums[key] = np.zeros(n)

    def __call__(self, ev: Evaluation) -> None:
        model, oracle = ev.logits
        assert model is not None and oracle is not None
        kl = _kl_rows(oracle, model)
        o_arg = oracle.argmax(-1)
        end = torch.zeros_like(o_arg, dtype=torch.bool)
        for t in self.end_ids:
            end |= o_arg == t
        j, s = ev.index, self.sums
        s["kl"][j] += float(kl.sum())
        s["n"][j] += kl.numel()
        s["kl_end"][j] += float(kl[end].sum())
        s["n_end"][j] += int(end.sum())
        s["kl_word"][j] += float(kl[~end].sum())
        s["n_word"][j] += int((~end).sum())
        m_arg = _argmax_without(model, self.mask_id)
        s["disagree"][j] += float((m_arg != _argmax_without(oracle, self.mask_id)).sum())
        s["norm"][j] += float(ev.state.double().norm(dim=-1).sum())
        self.argmax.append(m_arg.cpu())
        if j == len(self.gammas) - 1:
            self.final = {"state": ev.state.cpu(), "model": model.cpu(), "oracle": oracle.cpu()}


def _prompt_ids(tokenizer, examples: Sequence[TaskExample]) -> list[list[int]]:
    return [tokenizer.encode(render_prompt(ex.prompt), add_special_tokens=False) for ex in examples]


def _batches(n: int, size: int) -> list[list[int]]:
    return [list(range(i, min(n, i + size))) for i in range(0, n, size)]


def trajectory_kl(model: DSLModel, oracle: DSLModel, world: ToyWorld, tokenizer, examples: Sequence[TaskExample],
                  config: SDEConfig, *, seed: int = 0, batch_size: int = 48,
                  bands: Sequence[tuple[float, float]] = BANDS) -> dict[str, Any]:
    """DSL-SDE with the trained `model` on `examples` (row i seeded `seed` * 100003 + i, as the demo), the exact
    `oracle` evaluated on every state the model is; returns

    - `evaluations`: per evaluation index its γ, mean KL(oracle || model) per response position (all, where the
      oracle's argmax is a word, where it is the end), the share of positions whose argmaxes differ, the mean state
      norm |z| against a training state's sqrt(γ² + γd), and the share of positions whose model argmax there is
      already the output token;
    - `bands`: the same KL means and disagreement pooled over the evaluations in each SNR band;
    - `final_decodes`: `final_decodes` of the runs' last states;
    - `outputs`: the sampled ids (rows, L).
    """
    special = model.special
    end_ids = tuple(special.stop_ids())
    gammas = evaluation_gammas(config)
    acc = _KLAccumulator(gammas, end_ids, special.mask)
    pair = PairedDSLModel(model, oracle, config, drive=lambda j: 0, observer=acc)
    prompts = _prompt_ids(tokenizer, examples)
    finals: dict[str, list[torch.Tensor]] = defaultdict(list)
    outputs, decided = [], np.zeros(len(gammas))
    for idx in _batches(len(prompts), batch_size):
        pair.reset()
        acc.argmax.clear()
        out = run_batch(pair, [prompts[i] for i in idx], config, [seed * 100_003 + i for i in idx])
        outputs.append(out.ids)
        for key, value in acc.final.items():
            finals[key].append(value)
        for j, arg in enumerate(acc.argmax):
            decided[j] += float((arg == out.ids).sum())
    ids = torch.cat(outputs)
    s = acc.sums
    d = model.noise_dim
    evaluations = [{"index": j, "step": min(j // 2, config.steps), "phase": "decode" if j == len(gammas) - 1 else
                    ("predictor" if j % 2 == 0 else "corrector"), "gamma": g,
                    "kl": s["kl"][j] / s["n"][j], "kl_word": _ratio(s["kl_word"][j], s["n_word"][j]),
                    "kl_end": _ratio(s["kl_end"][j], s["n_end"][j]), "disagree": s["disagree"][j] / s["n"][j],
                    "state_norm": s["norm"][j] / s["n"][j], "training_norm": math.sqrt(g * g + g * d),
                    "decided": decided[j] / ids.numel()} for j, g in enumerate(gammas)]
    band_rows = []
    for b, (lo, hi) in enumerate(bands):
        js = [j for j, g in enumerate(gammas) if band_of(g, bands) == b]
        row: dict[str, Any] = {"band": [lo, hi], "evaluations": len(js)}
        for key in ("kl", "kl_word", "kl_end"):
            n_key = "n" + key[2:]
            row[key] = _ratio(sum(s[key][j] for j in js), sum(s[n_key][j] for j in js))
        row["disagree"] = _ratio(sum(s["disagree"][j] for j in js), sum(s["n"][j] for j in js))
        row["positions"] = int(sum(s["n"][j] for j in js))
        band_rows.append(row)
    final = {k: torch.cat(v) for k, v in finals.items()}
    decodes = final_decodes(world, tokenizer, examples, final["state"], final["model"], final["oracle"],
                            model.unit_noise().cpu(), special.mask, end_ids, output_ids=ids, seed=seed)
    return {"evaluations": evaluations, "bands": band_rows, "final_decodes": decodes, "outputs": ids.tolist()}


def _ratio(num: float, den: float) -> float | None:
    return float(num / den) if den else None


def final_decodes(world: ToyWorld, tokenizer, examples: Sequence[TaskExample], state: torch.Tensor,
                  model_logits: torch.Tensor, oracle_logits: torch.Tensor, noise_table: torch.Tensor, mask_id: int,
                  stop_ids: Sequence[int], *, output_ids: torch.Tensor | None = None, seed: int = 0
                  ) -> dict[str, Any]:
    """Three decodes of the same final SDE states (B, L, d) at the last SNR: the model's argmax (the authors' rule,
    what `sample_sde` returns), the nearest noise embedding (`nearest_decode`: y read directly) and the oracle's
    argmax. Per decode the exact quality (`evaluate.aggregate`: in-support %, premature EOS %, words, PPL), and for
    its off-support outputs where the first off-support token came from: 'state' when the decode's token there is
    the nearest embedding's (the final state already pointed at it), 'decode' when the decode chose another token
    than the state's nearest. `output_ids`, when given, must equal the model decode (a check of the capture)."""

    nearest = nearest_decode(state, noise_table, mask_id)
    decodes = {"model": _argmax_without(model_logits, mask_id), "nearest": nearest,
               "oracle": _argmax_without(oracle_logits, mask_id)}
    if output_ids is not None and not torch.equal(decodes["model"], output_ids):
        raise AssertionError("the captured final logits do not decode to the sampler's output")
    result: dict[str, Any] = {"agreement_model_nearest": float((decodes["model"] == nearest).float().mean()),
                              "agreement_oracle_nearest": float((decodes["oracle"] == nearest).float().mean())}
    for name, ids in decodes.items():
        records: list[dict[str, Any]] = []
        causes: Counter[str] = Counter()
        for i, ex in enumerate(examples):
            row = ids[i].tolist()
            text = tokenizer.decode(row, skip_special_tokens=False)
            records.append(score_record(world, ex, text, method=name, nfe=0, seed=seed * 100_003 + i, index=i,
                                        forward_passes=0))
            t = first_off_support(response_machine(world, ex.prompt), response_ids(world, row, stop_ids))
            if t is not None:
                pos = min(t, len(row) - 1)
                causes["state" if row[pos] == int(nearest[i, pos]) else "decode"] += 1
        agg = {r["task"]: r for r in aggregate(records)}
        result[name] = {"rows": {task: {k: r[k] for k in ("n", "ppl", "in_support", "len", "premature_eos%")}
                                 for task, r in agg.items()},
                        "off_support": sum(causes.values()), "first_off_from_state": causes["state"],
                        "first_off_from_decode": causes["decode"]}
    return result


# -- 2: swap runs ---------------------------------------------------------------------------------------------


def swap_runs(model: DSLModel, oracle: DSLModel, world: ToyWorld, tokenizer, examples: Sequence[TaskExample],
              config: SDEConfig, *, seed: int = 0, batch_size: int = 48,
              ks: Sequence[int | str] | None = None) -> list[dict[str, Any]]:
    """DSL-SDE with one denoiser for the first k Heun steps and the other after (the decode included), k = 0 .. S
    (or the given `ks`), and with the first one throughout (k = 'all'), in both orders; same seeds for every run
    (row i seeded `seed` * 100003 + i). One row per (order, k, task) with `evaluate.aggregate`'s exact quality."""
    steps = config.steps
    grid: list[int | str] = list(range(steps + 1)) + ["all"] if ks is None else list(ks)
    if any(k != "all" and not (isinstance(k, int) and 0 <= k <= steps) for k in grid):
        raise ValueError(f"ks={list(grid)!r} is not valid: each k must be an integer from 0 to {steps} or 'all'")
    prompts = _prompt_ids(tokenizer, examples)
    cache: dict[tuple[int, ...], list[dict[str, Any]]] = {}
    rows = []
    for order, (a, b) in (("model then oracle", (model, oracle)), ("oracle then model", (oracle, model))):
        for k in grid:
            n_first = 2 * steps + 1 if k == "all" else 2 * int(k)
            # who answers each evaluation, as 'model' (0) or 'oracle' (1): runs with the same pattern are one run
            flip = 0 if a is model else 1
            pattern = tuple((0 if j < n_first else 1) ^ flip for j in range(2 * steps + 1))
            if pattern not in cache:
                pair = PairedDSLModel(model, oracle, config, drive=pattern.__getitem__)
                records = []
                for idx in _batches(len(prompts), batch_size):
                    pair.reset()
                    out = run_batch(pair, [prompts[i] for i in idx], config, [seed * 100_003 + i for i in idx])
                    for r, i in enumerate(idx):
                        text = tokenizer.decode(out.ids[r].tolist(), skip_special_tokens=False)
                        records.append(score_record(world, examples[i], text, method="swap", nfe=config.nfe,
                                                    seed=seed * 100_003 + i, index=i, forward_passes=0))
                cache[pattern] = aggregate(records)
            for agg in cache[pattern]:
                rows.append({"order": order, "k": k, "task": agg["task"], "n": agg["n"], "ppl": agg["ppl"],
                             "ppl_ci": agg["ppl_ci"], "in_support": agg["in_support"],
                             "in_support_ci": agg["in_support_ci"], "len": agg["len"],
                             "premature_eos%": agg["premature_eos%"],
                             "model_evaluations": sum(1 for w in pattern if w == 0)})
    return rows


# -- 4: total variation to the exact summary distribution --------------------------------------------------------


def exact_distribution(world: ToyWorld, example: TaskExample) -> dict[tuple[int, ...], float]:
    """Every response (token ids before the end) of an example's task with its exact probability; for the
    summarisation task's small automata (an open-ended topic has too many strings to list)."""
    return response_machine(world, example.prompt).enumerate()


def total_variation(counts: Mapping[tuple[int, ...], int], exact: Mapping[tuple[int, ...], float]) -> float:
    """½ Σ_s |n_s/n − p(s)| over every string, the sampled ones outside the support included (p = 0 there)."""
    n = sum(counts.values())
    if n <= 0:
        raise ValueError("total_variation needs at least one sample")
    keys = set(counts) | set(exact)
    return 0.5 * sum(abs(counts.get(s, 0) / n - exact.get(s, 0.0)) for s in keys)


def _tv_matrix(counts: np.ndarray, n: int, p: np.ndarray) -> np.ndarray:
    """TV of each row of counts (R, U) over n samples against p (U,)."""
    return 0.5 * np.abs(counts / n - p[None, :]).sum(-1)


def tv_from_outputs(outputs: Sequence[Sequence[tuple[int, ...]]], exacts: Sequence[Mapping[tuple[int, ...], float]],
                    *, seed: int = 0, n_boot: int = 2000, floor_reps: int = 200) -> dict[str, float]:
    """Mean TV over documents between each document's sampled strings (`outputs[d]`, n each) and its exact
    distribution, with a 95 % percentile bootstrap interval over documents and the floor: the mean TV that n exact
    samples from each document's own distribution get (`floor_reps` simulations), the value a perfect sampler shows
    at this n (the plug-in TV is biased upward).

    Each document's TV already carries its n samples' sampling error, and documents are independent, so resampling
    documents covers both; resampling the samples again inside each document would add a second draw's upward bias
    (for exact samples such an interval lies above the floor)."""
    rng = np.random.default_rng(seed)
    if not outputs or len(outputs) != len(exacts):
        raise ValueError(f"need one output list per document, got {len(outputs)} lists for {len(exacts)} documents")
    tvs, floors, ns = [], [], set()
    for outs, exact in zip(outputs, exacts):
        n = len(outs)
        ns.add(n)
        counts = Counter(outs)
        tvs.append(total_variation(counts, exact))
        keys = sorted(exact)
        p = np.array([exact[s] for s in keys])
        floors.append(float(_tv_matrix(rng.multinomial(n, p / p.sum(), size=floor_reps), n, p / p.sum()).mean()))
    per = np.asarray(tvs)
    boot = per[rng.integers(0, len(per), size=(n_boot, len(per)))].mean(1)
    lo, hi = np.percentile(boot, [2.5, 97.5])
    return {"tv": float(per.mean()), "lo": float(lo), "hi": float(hi), "floor": float(np.mean(floors)),
            "n": min(ns), "documents": len(per)}


TV_METHODS: tuple[tuple[str, str, dict[str, str]], ...] = (
    ("DSL-SDE", "sde", {"trained": "dsl", "oracle": "oracle-dsl"}),
    ("LLaDA", "remask", {"trained": "base", "oracle": "oracle"}),
)
"""(method, sampler, denoiser -> model key) of `tv_rows`: the paper's defaults of each sampler; the keys are the
demo's (`oracle.oracle_models` for the oracle ones)."""


def tv_rows(models: Mapping[str, DSLModel | Backbone], world: ToyWorld, tokenizer, documents: Sequence[TaskExample],
            *, nfes: Sequence[int] = (4, 8, 16, 32, 64), n: int = 32, seed: int = 0, batch_size: int = 64,
            gen_length: int | None = None, methods: Sequence[tuple[str, str, dict[str, str]]] = TV_METHODS,
            n_boot: int = 1000, floor_reps: int = 200) -> list[dict[str, Any]]:
    """TV distance between each sampler's outputs and the exact summary distribution, per (method, denoiser, NFE):
    `n` samples per summarisation document (sample j of document d seeded `seed` * 100003 + d * n + j), averaged
    over `documents`; rows (method, denoiser, nfe, tv, lo, hi, floor, n, documents) as `tv_from_outputs`. Models
    missing from `models` are skipped."""
    if any(ex.task != "summarize" for ex in documents):
        raise ValueError("tv_rows needs summarisation examples: only their exact distributions are small enough "
                         "to list")
    L = gen_length if gen_length is not None else world.config.gen_length
    exacts = [exact_distribution(world, ex) for ex in documents]
    prompts = [p for p in _prompt_ids(tokenizer, documents) for _ in range(n)]
    rows = []
    for method, sampler, keys in methods:
        for denoiser, key in keys.items():
            if key not in models:
                continue
            model = models[key]
            stops = model.special.stop_ids()
            for nfe in nfes:
                config = sampler_config(sampler, {get_spec(sampler).steps_field: nfe, "gen_length": L})
                outs: list[list[tuple[int, ...]]] = [[] for _ in documents]
                for r, _ in sampled_rows(model, prompts, config, batch_size=batch_size,
                                         seed_of=lambda i: seed * 100_003 + i):
                    assert r.ids is not None
                    outs[r.index // n].append(tuple(response_ids(world, r.ids, stops)))
                stats = tv_from_outputs(outs, exacts, seed=seed, n_boot=n_boot, floor_reps=floor_reps)
                rows.append({"method": method, "denoiser": denoiser, "nfe": nfe, **stats})
    return rows


# -- 5: identical outputs across NFE ------------------------------------------------------------------------------


def identical_outputs(records: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """From a demo's `results.jsonl` records: for every method, task and pair of NFEs, how many prompts got the same
    output text at both (prompts matched by index and sample seed)."""
    by: dict[tuple[str, str], dict[int, dict[tuple[int, int], str]]] = defaultdict(lambda: defaultdict(dict))
    for r in records:
        by[(r["method"], r["task"])][r["nfe"]][(r["index"], r.get("sample_seed", 0))] = r["output"]
    rows = []
    for (method, task), per_nfe in sorted(by.items()):
        nfes = sorted(per_nfe)
        for i, a in enumerate(nfes):
            for b in nfes[i + 1:]:
                common = set(per_nfe[a]) & set(per_nfe[b])
                same = sum(per_nfe[a][k] == per_nfe[b][k] for k in common)
                rows.append({"method": method, "task": task, "nfe_a": a, "nfe_b": b, "identical": same,
                             "n": len(common)})
    return rows
