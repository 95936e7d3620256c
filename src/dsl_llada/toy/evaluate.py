"""Evaluate samplers and models on the toy world: exact NLL under the true distribution, Rep, Distinct-2, Len,
failure tags, ROUGE (summarisation) and random-token error correction (Fix/Clean)."""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import torch

from ..config import REMDM, RemaskConfig
from ..eval import metrics as M
from ..eval.fix_clean import aggregate_fix_clean, fix_clean_records
from ..core.backbones.base import Backbone
from ..core.model import DSLModel
from ..sampling.batches import RowResult, run_batches
from ..sampling.common import SampleOutput
from ..sampling.remask import fewest_equivalent_steps
from ..sampling.registry import SamplerConfig, get_spec, sampler_config
from ..stats import bootstrap_ratio
from .tasks import TaskExample, render_prompt, response_words, score_response
from .world import ToyWorld


@dataclass(frozen=True)
class Method:
    """A row of the paper's comparison: which model, which sampler, which sampler options."""

    name: str
    model: str
    """Key into the models dict: 'base' (pretrained MDM), 'dsl', 'mdm' (MDM-CPT), 'xdlm'."""
    sampler: str
    """A registry sampler name; 'remask' with option remdm=True runs 'remdm'."""
    options: dict[str, Any] = field(default_factory=dict)

    def config(self, nfe: int, gen_length: int) -> SamplerConfig:
        """The sampler config of this row at `nfe` model evaluations (the registry's parser builds it)."""
        opts = dict(self.options)
        if opts.pop("blocks", None):
            opts["block_length"] = gen_length // BLOCKS
        name = REMDM if opts.pop("remdm", False) else self.sampler
        return sampler_config(name, {get_spec(name).steps_field: nfe, "gen_length": gen_length, **opts})


BLOCKS = 4
"""LLaDA+EOS+Block uses gen_length/4-token blocks (the paper: 32 of 256 = 8 blocks; 4 keeps NFE 4 valid)."""

PAPER_METHODS = (
    # The paper's defaults (eta by NFE, beta_inf = 2 beta, top-M 512, sensitive schedule) with the authors' sampler:
    # noise also in the Heun predictor, so a step adds (eta/gamma_{s+1}) dW (0.38 eta xi on the first step 0.01 -> 7).
    Method("DSL-SDE", "dsl", "sde"),
    # Algorithm 2 as printed: noise only in the final update, 1/2 (eta/gamma_s + eta/gamma_{s+1}) dW -- about 132 eta
    # per coordinate on the first step against a unit-norm state (1/sqrt(d) per coordinate), 350x the authors'.
    Method("DSL-SDE (Alg. 2 as printed)", "dsl", "sde", {"predictor_noise": False}),
    Method("DSL-SDE (eta=0)", "dsl", "sde", {"eta": 0.0}),
    Method("LLaDA", "base", "remask"),
    Method("LLaDA+EOS", "base", "remask", {"eos_inf": True}),
    Method("LLaDA+EOS+Block", "base", "remask", {"eos_inf": True, "blocks": True}),
    Method("ReMDM", "base", "remask", {"remdm": True}),
    Method("DSL-Remask", "dsl", "remask"),
)
CONTROL_METHODS = (Method("MDM-CPT", "mdm", "remask"), Method("XDLM", "xdlm", "remask"))
ORACLE_METHODS = (
    # The exact Bayes-optimal denoisers (toy/oracle.py) in place of the trained models: what each sampler does when the
    # model is perfect, so the distance to the trained rows is model error and the distance to the world is the
    # sampler's own. "Oracle DSL-SDE" runs the paper's defaults; "(eta=1, beta_inf=beta)" the localisation SDE itself
    # (its noise in y = z/gamma is (1/gamma) dW: eta = 1) reading the exact likelihood (beta_inf = the oracle's beta 1).
    Method("Oracle DSL-SDE", "oracle-dsl", "sde"),
    Method("Oracle DSL-SDE (eta=1, beta_inf=beta)", "oracle-dsl", "sde", {"eta": 1.0, "beta_scale": 1.0}),
    Method("Oracle LLaDA", "oracle", "remask"),
)


class SamplingMethod(Protocol):
    """What `sample_records` needs of a row: its name, its model's key and its sampler config per NFE."""

    @property
    def name(self) -> str: ...

    @property
    def model(self) -> str: ...

    def config(self, nfe: int, gen_length: int) -> SamplerConfig: ...


def sampled_rows(model: DSLModel | Backbone, prompt_ids: Sequence[Sequence[int]], config: SamplerConfig, *,
                 batch_size: int, seed_of: Callable[[int], int], skip: Collection[int] = ()
                 ) -> Iterator[tuple[RowResult, SampleOutput]]:
    """Every prompt's row (but those in `skip`) with its sampler call's output (`run_batches` without retries: a
    failing call raises)."""
    for rows in run_batches(model, prompt_ids, config, batch_size=batch_size, retry=False, seed_of=seed_of, skip=skip):
        for r in rows:
            assert r.output is not None  # without retries no row is recorded as failed
            yield r, r.output


def seed_free(config: SamplerConfig) -> bool:
    """True when the sampler draws no random number under `config` and runs a fixed number of steps: greedy
    (temperature 0) low-confidence remasking without ReMDM's re-mask draws (`remask_step`) and without a confidence
    threshold (whose batch runs until its slowest row is done). Its tokens are then a function of the prompt alone,
    whatever the row's seed, and its forward passes are its steps (twice with guidance)."""
    return (isinstance(config, RemaskConfig) and config.temperature == 0 and config.remasking == "low_confidence"
            and not config.remdm and config.threshold is None)


Reuse = dict[tuple[str, SamplerConfig, tuple[int, ...]], str]
"""Outputs of seed-free runs kept for reuse: (model key, the config with the fewest equivalent steps, prompt ids) ->
decoded text."""


def sample_records(models: Mapping[str, DSLModel | Backbone], world: ToyWorld, tokenizer,
                   examples: Sequence[TaskExample], methods: Sequence[SamplingMethod], nfes: Sequence[int], *,
                   gen_length: int, batch_size: int = 32, seed: int = 0, on_progress: Callable[[str], None] | None = None,
                   sample_seed: int = 0, reuse: Reuse | None = None) -> list[dict[str, Any]]:
    """One record per (method, NFE, example) with the decoded output and its per-sample metrics. `sample_seed`
    k > 0 draws another seed per row (the demo's `--seeds K` runs k = 0..K-1; k = 0 is the historical seeding).

    A seed-free sampler (`seed_free`) samples a prompt once per model and token sequence: an example whose prompt
    ids were sampled before with a config of the same tokens (the same config, or one with more steps than a block
    can use: `remask.fewest_equivalent_steps`), in this call or, through `reuse` (a dict the caller keeps between
    calls for the same models), in an earlier call or under another sampling seed, gets that output; its record
    still gives its own seed and its config's forward passes. The first run of such a config samples with its
    fewest equivalent steps, so steps that would commit nothing are not run either. Skipped rows leave their places
    in the batch grid empty (`run_batches`' `skip`), so the rows that run keep their batch's prompts and padding
    and only the batch is smaller; rows do not depend on their batch-mates (`tests/test_toy_evaluate.py` checks
    the records)."""
    records = []
    prompt_ids = [tokenizer.encode(render_prompt(ex.prompt), add_special_tokens=False) for ex in examples]
    base = seed * 100_003 + sample_seed * 1_000_003
    kept: Reuse = {} if reuse is None else reuse
    for method in methods:
        model = models[method.model]
        for nfe in nfes:
            config = method.config(nfe, gen_length)
            shared = seed_free(config)
            same = fewest_equivalent_steps(config) if isinstance(config, RemaskConfig) and shared else config
            key = [(method.model, same, tuple(ids)) for ids in prompt_ids]
            skip = {i for i, k in enumerate(key) if shared and (k in kept or k in key[:i])}
            made: dict[int, tuple[str, int]] = {}
            # a seed-free config runs as its fewest equivalent steps; its records count its own forward passes
            own = _seed_free_forwards(config) if shared else None
            for r, output in sampled_rows(model, prompt_ids, same, batch_size=batch_size, seed_of=lambda i: base + i,
                                          skip=skip):
                # truncate_at_eos=False decodes as the authors do (special tokens dropped, text after EOS kept)
                keep_all = not output.config.get("truncate_at_eos", True)
                made[r.index] = (tokenizer.decode(r.ids, skip_special_tokens=keep_all),
                                 output.forward_passes if own is None else own)
                if shared:
                    kept[key[r.index]] = made[r.index][0]
            for i, ex in enumerate(examples):
                text, passes = made[i] if i in made else (kept[key[i]], _seed_free_forwards(config))
                records.append(score_record(world, ex, text, method=method.name, nfe=nfe, seed=base + i, index=i,
                                            forward_passes=passes, **({"sample_seed": sample_seed} if sample_seed else {})))
            if on_progress is not None:
                on_progress(f"{method.name} NFE {nfe}")
    return records


def _seed_free_forwards(config: SamplerConfig) -> int:
    """The forward passes of a seed-free run (`seed_free`): one per step, two with classifier-free guidance."""
    assert isinstance(config, RemaskConfig)
    return config.steps * (2 if config.cfg_scale > 0 else 1)


def score_record(world: ToyWorld, ex: TaskExample, raw_text: str, **meta: Any) -> dict[str, Any]:
    """Per-sample metrics of one output (the response is cut at the first end-of-turn/EOS)."""
    words = response_words(raw_text)
    output = " ".join(words)
    s = score_response(world, words, ex)
    reference = ex.reference if ex.task == "summarize" else ex.response
    tags = M.failure_tags(output, reference, paper_thresholds=True).as_dict()
    rec = {**meta, "task": ex.task, "prompt": ex.prompt, "output": output, "reference": reference,
           "nll_sum": s["nll_sum"], "n_tokens": s["n_tokens"], "nll_per_token": s["nll_per_token"],
           "in_support": s["in_support"], "rep": M.repetition_rate(output), "len": M.length_words(output),
           "tags": tags}
    if ex.task == "summarize":
        rec["rouge"] = M.rouge_scores(ex.reference or "", output)
    return rec


def is_complete(r: dict[str, Any]) -> bool:
    """A complete answer: inside the world's support (`in_support`: every word is grammatical there and the world
    may end the answer where it ends) and not tagged `empty` or `premature_eos` (fewer than 0.4 x the words of the
    world's own answer to the same prompt, the record's `reference`). A record's own fields decide it."""
    tags = r["tags"]
    return bool(r["in_support"]) and not tags.get("empty") and not tags.get("premature_eos")


def _per_record(key: str) -> Callable[[dict[str, Any]], float]:
    """A record's contribution to the numerator of metric `key` (its denominator is 1 per record, or the record's
    token count for 'ppl' and, for complete answers only, 'ppl_complete', whose ratios are NLL per token)."""
    if key == "ppl":
        return lambda r: r["nll_sum"]
    if key == "ppl_complete":
        return lambda r: r["nll_sum"] if is_complete(r) else 0.0
    if key == "complete":
        return lambda r: 100.0 * is_complete(r)
    if key in ("in_support", "rep"):
        return lambda r: 100.0 * r[key]
    if key == "len":
        return lambda r: r["len"]
    if key.endswith("%") and key[:-1] in M.FAILURE_TAG_NAMES:
        return lambda r: 100.0 * bool(r["tags"].get(key[:-1]))
    if key in ("rouge1", "rouge2", "rougeL"):
        return lambda r: r["rouge"][key]
    raise KeyError(f"no per-record metric {key!r}")


def _denominator(key: str) -> Callable[[dict[str, Any]], float]:
    """A record's contribution to the denominator of metric `key` (see `_per_record`)."""
    if key == "ppl":
        return lambda r: r["n_tokens"]
    if key == "ppl_complete":
        return lambda r: r["n_tokens"] if is_complete(r) else 0.0
    return lambda r: 1.0


INTERVAL_KEYS = ("ppl", "in_support", "complete", "rep", "len", *(f"{t}%" for t in M.FAILURE_TAG_NAMES))
"""Metrics given a 95 % interval in every row (summarisation rows also rouge1, rouge2, rougeL)."""


def clusters(rs: Sequence[dict[str, Any]]) -> dict[int, list[dict[str, Any]]]:
    """A row's records grouped by prompt index (a prompt's samples under several seeds stay together)."""
    out: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for r in rs:
        out[r["index"]].append(r)
    return out


def metric_sums(cs: Sequence[Sequence[dict[str, Any]]], key: str) -> tuple[list[float], list[float]]:
    """Per cluster, the numerator and denominator sums of metric `key` (the metric is sum(num) / sum(den); exp of
    it for 'ppl' and 'ppl_complete')."""
    num, den = _per_record(key), _denominator(key)
    return [float(sum(num(r) for r in c)) for c in cs], [float(sum(den(r) for r in c)) for c in cs]


def _intervals(rs: Sequence[dict[str, Any]], task: str) -> dict[str, Any]:
    """95 % bootstrap intervals (`KEY_ci`) of a row's per-item metrics, resampling prompts (a prompt's samples
    under several seeds stay together), and the per-seed perplexities (`ppl_seeds`) when several seeds ran."""
    cs = list(clusters(rs).values())
    out: dict[str, Any] = {"ppl_ci": bootstrap_ratio(*metric_sums(cs, "ppl"), transform=np.exp), "n_prompts": len(cs)}
    if any(is_complete(r) for r in rs):
        out["ppl_complete_ci"] = bootstrap_ratio(*metric_sums(cs, "ppl_complete"), transform=np.exp)
    for key in INTERVAL_KEYS[1:] + (("rouge1", "rouge2", "rougeL") if task == "summarize" else ()):
        out[f"{key}_ci"] = bootstrap_ratio(*metric_sums(cs, key))
    seeds = sorted({r.get("sample_seed", 0) for r in rs})
    if len(seeds) > 1:
        out["ppl_seeds"] = [math.exp(sum(r["nll_sum"] for r in rs if r.get("sample_seed", 0) == s)
                                     / sum(r["n_tokens"] for r in rs if r.get("sample_seed", 0) == s)) for s in seeds]
    return out


def _complete_ppl(rs: Sequence[dict[str, Any]]) -> float | None:
    """Token-weighted perplexity of the complete answers among `rs` (None when there is none)."""
    done = [r for r in rs if is_complete(r)]
    return math.exp(sum(r["nll_sum"] for r in done) / sum(r["n_tokens"] for r in done)) if done else None


def aggregate(records: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per (method, task, NFE): token-weighted perplexity (of every answer, and of the complete answers only), the
    share of complete answers, Rep, Distinct-2, Len, failure rates, ROUGE, each per-item metric with its 95 %
    bootstrap interval (`KEY_ci`, see `dsl_llada.stats`)."""
    groups: dict[tuple, list[dict[str, Any]]] = defaultdict(list)
    for r in records:
        groups[(r["method"], r["task"], r["nfe"])].append(r)
    rows = []
    for (method, task, nfe), rs in groups.items():
        outputs = [r["output"] for r in rs]
        row = {"method": method, "task": task, "nfe": nfe, "n": len(rs),
               "ppl": math.exp(sum(r["nll_sum"] for r in rs) / sum(r["n_tokens"] for r in rs)),
               "nll_per_token": sum(r["nll_sum"] for r in rs) / sum(r["n_tokens"] for r in rs),
               "in_support": 100 * float(np.mean([r["in_support"] for r in rs])),
               "complete": 100 * float(np.mean([is_complete(r) for r in rs])),
               "n_complete": sum(map(is_complete, rs)), "ppl_complete": _complete_ppl(rs),
               "rep": 100 * float(np.mean([r["rep"] for r in rs])), "d2": 100 * M.distinct_n(outputs, 2),
               "len": float(np.mean([r["len"] for r in rs])), "forward_passes": rs[0]["forward_passes"]}
        row.update({f"{k}%": v for k, v in M.failure_rates([r["tags"] for r in rs]).items()})
        if task == "summarize":
            for k in ("rouge1", "rouge2", "rougeL"):
                row[k] = float(np.mean([r["rouge"][k] for r in rs]))
        row.update(_intervals(rs, task))
        rows.append(row)
    rows.sort(key=lambda r: (r["task"], r["method"], r["nfe"]))
    return rows


@torch.no_grad()
def error_correction(models: Mapping[str, torch.nn.Module], tokenizer, examples: Sequence[TaskExample],
                     rates: Sequence[float] = (0.1, 0.3, 0.5), *, n_words: int, seed: int = 42) -> list[dict[str, Any]]:
    """Random-token error correction (paper T1): corrupt a fraction of a clean response's tokens with random word
    ids, one forward, argmax; Fix/Clean per text, macro-averaged over texts. Every model is read through its
    discrete path (wte, the authors' protocol); DSL models also through the converter's clean embeddings
    W[:, id] + c, the input pathway DSL training actually adapted (the authors' probes never exercise it).
    The shared implementation is `dsl_llada.eval.fix_clean` (one text per forward here, as before)."""
    rows = []
    texts = [ex.response for ex in examples if ex.response.strip()]
    paths = []
    for name, model in models.items():
        model.eval()
        paths.append((name, model, "discrete"))
        if hasattr(model, "converter"):  # a DSL model also reads clean tokens through its trained converter
            paths.append((f"{name} (converter path)", model, "converter"))
    for name, model, path in paths:
        for rate in rates:
            recs = fix_clean_records(model, tokenizer, texts, rate=rate, path=path, seed=seed, batch_size=1,
                                     id_range=(0, n_words))
            avg = aggregate_fix_clean(recs)
            rows.append({"model": name, "rate": rate, "fix": 100 * (avg["fix"] or 0.0),
                         "clean": 100 * (avg["clean"] or 0.0), "n_texts": len(recs)})
    return rows
