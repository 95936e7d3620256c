"""Pairwise LLM-as-judge for summaries (the paper's judge table; protocol: docs/provenance.md §5.7).

Two runs of the same dataset at the same NFE are paired by sample id; the common ids are shuffled with
`random.Random(seed)` (seed 42 in the paper) and the first `n` kept. The same RNG then draws, per sample, a swap bit
that decides which run is displayed as "Candidate A", so position bias cancels on average and can be measured (the
"shown-A" rate). The judge scores both candidates 1–5 on four axes and gives an overall verdict; the verdict is
mapped back to the runs ("un-swapped") before aggregation.

Differences from the authors' script, each switchable:
- their parser accepts a reply only if one greedy `{...}` span is valid JSON (a reply holding two objects fails);
  ours takes the first JSON object that has the required fields (`parse_mode="authors"` restores theirs);
- their system prompt mentions a source document that is never shown; ours does not mention it unless
  `include_source=True`, which also shows the document (off = the paper's protocol);
- optionally each sample is judged in both presentation orders (`both_orders=True`).
"""

from __future__ import annotations

import hashlib
import json
import math
import random
import re
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

AXES = ("factuality", "coverage", "fluency", "conciseness")
VERDICTS = ("A", "B", "tie")
USER_PLACEHOLDERS = ("{reference}", "{candidate_a}", "{candidate_b}")


@dataclass(frozen=True)
class JudgeConfig:
    """How samples are paired, shown and aggregated (the judge back-end is configured separately)."""

    n: int = 100
    """Number of common samples judged (the first n after shuffling; the paper uses 100)."""
    seed: int = 42
    """Seed of `random.Random` that shuffles the common ids and draws the per-sample swap bits (paper: 42)."""
    both_orders: bool = False
    """Judge every sample twice, once in each presentation order (off = one order per sample, as the paper)."""
    include_source: bool = False
    """Show the source document to the judge (off = the paper's protocol: reference and candidates only)."""
    parse_mode: str = "robust"
    """'robust': the first JSON object in the reply with every required field; 'authors': one greedy {...} span
    whose "overall" is exactly "A", "B" or "tie"."""
    bootstrap_resamples: int = 10_000
    """Bootstrap resamples for the 95 % confidence intervals of the win/tie/loss rates."""
    bootstrap_seed: int = 0
    """Seed of the bootstrap's numpy generator."""
    system_prompt: str | None = None
    """The judge's system prompt (None = ours, `SYSTEM_PROMPT`); e.g. the authors' own, from `--judge-prompt-file`."""
    user_template: str | None = None
    """The user turn with the placeholders {reference}, {candidate_a}, {candidate_b} (and optionally {source})
    filled in by plain replacement (None = ours)."""
    min_parse_rate: float = 0.9
    """Below this share of parsed replies the win rate is withheld (the summary says why)."""

    def __post_init__(self) -> None:
        if self.user_template is not None:
            missing = [k for k in USER_PLACEHOLDERS if k not in self.user_template]
            if missing:
                raise ValueError(f"the judge user template lacks the placeholder(s) {missing}; it must contain "
                                 f"{list(USER_PLACEHOLDERS)} (and may contain {{source}})")
        if (self.system_prompt is None) != (self.user_template is None):
            raise ValueError("give both a judge system prompt and a user template, or neither")
        if not 0.0 <= self.min_parse_rate <= 1.0:
            raise ValueError(f"min_parse_rate={self.min_parse_rate!r} must be in [0, 1]")
        if not (isinstance(self.n, int) and self.n >= 1):
            raise ValueError(f"n={self.n!r} must be an int >= 1")
        if self.parse_mode not in ("robust", "authors"):
            raise ValueError(f"parse_mode={self.parse_mode!r} is not valid; expected 'robust' or 'authors'")
        if not (isinstance(self.bootstrap_resamples, int) and self.bootstrap_resamples >= 100):
            raise ValueError(f"bootstrap_resamples={self.bootstrap_resamples!r} must be an int >= 100")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "JudgeConfig":
        return cls(**d)


@dataclass(frozen=True)
class Sample:
    """One system's output for one sample id."""

    id: str
    output: str
    reference: str
    source: str | None = None
    source_sha256: str | None = None
    """SHA-256 of the source document when the record holds its digest instead of its text (`eval run`'s records)."""

    def source_digest(self) -> str | None:
        """SHA-256 (hex) of the source document: of `source` when the text is known, else `source_sha256`."""
        if self.source is not None:
            return hashlib.sha256(self.source.encode("utf-8")).hexdigest()
        return self.source_sha256


@dataclass(frozen=True)
class Pair:
    """A judged presentation: `swap=True` shows run B as "Candidate A"."""

    id: str
    swap: bool
    a: Sample
    b: Sample

    @property
    def key(self) -> str:
        return f"{self.id}|{'BA' if self.swap else 'AB'}"


def check_same_samples(run_a: dict[str, Sample], run_b: dict[str, Sample]) -> list[str]:
    """The sample ids both runs hold, sorted, after checking that each holds the same sample in both: the same
    reference and, when both runs record it (its text or its digest), the same source document. Two runs that hold
    other documents under the same ids would be judged against run A's reference; refused naming the first such id."""
    common = sorted(set(run_a) & set(run_b))
    if not common:
        raise ValueError("the two runs have no sample id in common; judge runs of the same dataset "
                         f"(run A ids e.g. {sorted(run_a)[:3]}, run B ids e.g. {sorted(run_b)[:3]})")
    for sid in common:
        a, b = run_a[sid], run_b[sid]
        src_a, src_b = a.source_digest(), b.source_digest()
        what = "reference" if a.reference != b.reference else \
            "source" if src_a is not None and src_b is not None and src_a != src_b else None
        if what is not None:
            raise ValueError(f"sample id {sid!r} holds a different {what} in run B than in run A (of "
                             f"{len(common)} common ids, the first that differs): the runs are not of the same data; "
                             f"judge only runs whose samples have the same source and reference under each id")
    return common


def pair_samples(run_a: dict[str, Sample], run_b: dict[str, Sample], config: JudgeConfig) -> list[Pair]:
    """Common ids (each the same sample in both runs, `check_same_samples`) shuffled with Random(seed), first n
    kept; one swap bit per sample from the same RNG."""
    common = check_same_samples(run_a, run_b)
    rng = random.Random(config.seed)
    rng.shuffle(common)
    chosen = common[: config.n]
    pairs: list[Pair] = []
    for sid in chosen:
        swap = rng.random() < 0.5
        pairs.append(Pair(sid, swap, run_a[sid], run_b[sid]))
        if config.both_orders:
            pairs.append(Pair(sid, not swap, run_a[sid], run_b[sid]))
    return pairs


SYSTEM_PROMPT = (
    "You are a strict, impartial judge of summaries. You will see a reference summary{src} and two candidate "
    "summaries, A and B. Score each candidate from 1 (poor) to 5 (excellent) on four axes: factuality (agrees with "
    "the reference, invents nothing), coverage (contains the reference's key points), fluency (grammatical, "
    "readable), and conciseness (neither cut off nor padded). Then decide which candidate is better overall: "
    '"A", "B", or "tie". Answer with one line of JSON and nothing else: '
    '{{"a": {{"factuality": n, "coverage": n, "fluency": n, "conciseness": n}}, '
    '"b": {{"factuality": n, "coverage": n, "fluency": n, "conciseness": n}}, '
    '"overall": "A" | "B" | "tie", "rationale": "one sentence"}}'
)


def build_messages(pair: Pair, *, include_source: bool = False, system_prompt: str | None = None,
                   user_template: str | None = None) -> list[dict[str, str]]:
    """The chat messages for one presentation (system + user). With ``system_prompt``/``user_template`` (e.g. the
    authors' prompt from a file) the template's ``{reference}``, ``{candidate_a}`` (shown first),
    ``{candidate_b}`` and ``{source}`` are replaced literally (JSON braces in the text stay as written)."""
    first, second = (pair.b, pair.a) if pair.swap else (pair.a, pair.b)
    if user_template is not None:  # one pass, so a placeholder written inside a summary is never expanded
        values = {"{reference}": pair.a.reference, "{candidate_a}": first.output, "{candidate_b}": second.output,
                  "{source}": pair.a.source or ""}
        user = re.sub(r"\{reference\}|\{candidate_a\}|\{candidate_b\}|\{source\}", lambda m: values[m.group(0)],
                      user_template)
        return [{"role": "system", "content": system_prompt or ""}, {"role": "user", "content": user}]
    parts = []
    if include_source and pair.a.source:
        parts.append(f"SOURCE DOCUMENT:\n{pair.a.source}\n")
    parts += [f"REFERENCE SUMMARY:\n{pair.a.reference}\n", f"=== Candidate A ===\n{first.output}\n",
              f"=== Candidate B ===\n{second.output}\n",
              "Return the JSON object described above, on one line."]
    system = SYSTEM_PROMPT.format(src=", the source document" if include_source else "")
    return [{"role": "system", "content": system}, {"role": "user", "content": "\n".join(parts)}]


def _valid_scores(obj: Any) -> dict[str, float] | None:
    if not isinstance(obj, dict):
        return None
    out = {}
    for axis in AXES:
        v = obj.get(axis)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or not 1 <= v <= 5:
            return None
        out[axis] = float(v)
    return out


def _validate(obj: Any) -> dict[str, Any] | None:
    if not isinstance(obj, dict):
        return None
    a, b = _valid_scores(obj.get("a")), _valid_scores(obj.get("b"))
    overall = obj.get("overall")
    if a is None or b is None or not isinstance(overall, str):
        return None
    o = overall.strip().strip('"').upper()
    verdict = {"A": "A", "B": "B", "TIE": "tie"}.get(o)
    if verdict is None:
        return None
    return {"a": a, "b": b, "overall": verdict, "rationale": str(obj.get("rationale", ""))}


def parse_reply(text: str, mode: str = "robust") -> dict[str, Any] | None:
    """The judge's verdict from its reply, or None when nothing valid is found.

    robust: scan every '{' and decode the JSON value starting there; return the first object with all fields
    (scores 1-5 on every axis, verdict A/B/tie in any case).
    authors (docs/provenance.md §5.7): the greedy span from the first '{' to the last '}' must decode as a JSON
    object whose "overall" is exactly "A", "B" or "tie" (case-sensitive: {"overall": "a"} gives None); it is
    returned as decoded (no field added, none normalised; a reply holding two objects fails).
    """
    if mode == "authors":
        m = re.search(r"\{.*\}", text, flags=re.DOTALL)
        if not m:
            return None
        try:
            obj = json.loads(m.group(0))
        except json.JSONDecodeError:
            return None
        return obj if isinstance(obj, dict) and obj.get("overall") in VERDICTS else None
    decoder = json.JSONDecoder()
    for m in re.finditer(r"\{", text):
        try:
            obj, _ = decoder.raw_decode(text, m.start())
        except json.JSONDecodeError:
            continue
        parsed = _validate(obj)
        if parsed is not None:
            return parsed
    return None


def unswap(pair: Pair, parsed: dict[str, Any]) -> dict[str, Any]:
    """Map a verdict about the displayed candidates back to the runs: winner 'A'/'B' = run A/run B."""
    shown_first, shown_second = parsed["a"], parsed["b"]
    if pair.swap:
        scores_a, scores_b = shown_second, shown_first
        winner = {"A": "B", "B": "A", "tie": "tie"}[parsed["overall"]]
    else:
        scores_a, scores_b = shown_first, shown_second
        winner = parsed["overall"]
    shown_first_won = None if parsed["overall"] == "tie" else parsed["overall"] == "A"
    return {"winner": winner, "scores_a": scores_a, "scores_b": scores_b, "shown_first_won": shown_first_won}


def _authors_judgment(obj: dict[str, Any]) -> dict[str, Any]:
    """An authors-mode reply (`parse_reply` checked its verdict) as a judgment: the verdict as written and, per
    side, the axes whose score is a number (for the per-axis means)."""
    def nums(side: Any) -> dict[str, float]:
        if not isinstance(side, dict):
            return {}
        return {ax: float(side[ax]) for ax in AXES
                if isinstance(side.get(ax), (int, float)) and not isinstance(side.get(ax), bool)}

    return {"a": nums(obj.get("a")), "b": nums(obj.get("b")), "overall": obj["overall"],
            "rationale": obj.get("rationale")}


def judgment_record(pair: Pair, reply: str | None, *, mode: str, error: str | None = None) -> dict[str, Any]:
    """One JSON line of the judgments file (keyed by `key` = sample id + presentation order)."""
    parsed = parse_reply(reply, mode) if reply is not None else None
    if parsed is not None and mode == "authors":
        parsed = _authors_judgment(parsed)
    rec: dict[str, Any] = {"key": pair.key, "id": pair.id, "swap": pair.swap, "reply": reply, "parsed": parsed is not None}
    if parsed is not None:
        rec.update(unswap(pair, parsed))
        rec["rationale"] = parsed.get("rationale")
    if error is not None:
        rec["error"] = error
    return rec


def _rates(winners: np.ndarray) -> np.ndarray:
    """(…, n) array of codes 0=A wins, 1=tie, 2=B wins → (…, 3) percentages."""
    n = winners.shape[-1]
    return np.stack([(winners == c).sum(-1) / n * 100.0 for c in range(3)], axis=-1)


def bootstrap_rates(groups: Sequence[Sequence[int]], *, resamples: int, seed: int) -> np.ndarray:
    """(resamples, 3) win/tie/loss percentages from resampling the groups (one group = one sample id's verdict
    codes, 0 = run A wins, 1 = tie, 2 = run B wins) with replacement."""
    rng = np.random.default_rng(seed)
    arrays = [np.asarray(g) for g in groups]
    sizes = {len(g) for g in arrays}
    if len(sizes) == 1:
        mat = np.stack(arrays)  # (n_ids, k): one vectorised draw
        draws = rng.integers(0, len(arrays), size=(resamples, len(arrays)))
        return _rates(mat[draws].reshape(resamples, -1))
    boot = np.empty((resamples, 3))  # uneven groups (one order unparsed): one resample at a time
    for k in range(resamples):
        draw = rng.integers(0, len(arrays), size=len(arrays))
        boot[k] = _rates(np.concatenate([arrays[j] for j in draw])[None])[0]
    return boot


def aggregate(records: Iterable[dict[str, Any]], *, resamples: int = 10_000, seed: int = 0,
              min_parse_rate: float = 0.9) -> dict[str, Any]:
    """Win/tie/loss % of run A against run B over parsed judgments, with bootstrap 95 % CIs.

    Ties stay in the denominator (as the paper). The bootstrap resamples sample ids (all judgments of a sampled id
    move together, so `both_orders` runs are not over-confident). Per-axis means are over parsed judgments.
    "shown_a_rate" is the share of non-tie verdicts won by the candidate displayed first (0.5 = no position bias).
    """
    recs = list(records)
    parsed = [r for r in recs if r.get("parsed")]
    out: dict[str, Any] = {"n_judgments": len(recs), "n_parsed": len(parsed), "n_unparsed": len(recs) - len(parsed),
                           "n_errors": sum(1 for r in recs if r.get("error")),
                           "parse_rate": len(parsed) / len(recs) if recs else None, "refused": None}
    decisive = [r["shown_first_won"] for r in parsed if r.get("shown_first_won") is not None]
    out["shown_a_rate"] = float(np.mean(decisive)) if decisive else None
    out["n_decisive"] = len(decisive)
    if recs and len(parsed) < min_parse_rate * len(recs):
        out["refused"] = (f"win rate withheld: only {len(parsed)} of {len(recs)} replies "
                          f"({100 * len(parsed) / len(recs):.1f} %) parsed, below the {100 * min_parse_rate:.0f} % "
                          "needed; use a stronger judge, or a local judge with constrained decoding")
    if not parsed or out["refused"]:
        out.update({"win": None, "tie": None, "loss": None})
        return out
    code = {"A": 0, "tie": 1, "B": 2}
    ids = sorted({r["id"] for r in parsed})
    by_id: dict[str, list[int]] = {i: [] for i in ids}
    for r in parsed:
        by_id[r["id"]].append(code[r["winner"]])
    point = _rates(np.array([c for i in ids for c in by_id[i]])[None])[0]
    boot = bootstrap_rates([by_id[i] for i in ids], resamples=resamples, seed=seed)
    lo, hi = np.percentile(boot, [2.5, 97.5], axis=0)
    for j, name in enumerate(("win", "tie", "loss")):
        out[name] = float(point[j])
        out[f"{name}_ci95"] = [float(lo[j]), float(hi[j])]
    for side in ("a", "b"):
        vals = {ax: [r[f"scores_{side}"][ax] for r in parsed if ax in (r.get(f"scores_{side}") or {})] for ax in AXES}
        out[f"axes_{side}"] = {ax: float(np.mean(v)) if v else None for ax, v in vals.items()}
    both = [v for v in by_id.values() if len(v) == 2]
    if both:
        out["order_consistency"] = float(np.mean([v[0] == v[1] for v in both]))
    return out


def render_summary(summary: dict[str, Any], *, name_a: str, name_b: str) -> str:
    """A Markdown table of one judge summary."""
    def pct(key: str) -> str:
        if summary.get(key) is None:
            return "–"
        lo, hi = summary[f"{key}_ci95"]
        return f"{summary[key]:.1f} [{lo:.1f}, {hi:.1f}]"

    shown = "–" if summary.get("shown_a_rate") is None else f"{summary['shown_a_rate']:.2f}"
    rate = summary.get("parse_rate")
    parsed = "–" if rate is None else f"{100 * rate:.1f} % ({summary['n_parsed']}/{summary['n_judgments']})"
    lines = [f"# Judge: {name_a} (A) vs {name_b} (B)", "",
             f"{summary['n_parsed']} parsed of {summary['n_judgments']} judgments "
             f"({summary['n_unparsed']} unparsed, {summary['n_errors']} back-end errors).", ""]
    if summary.get("refused"):
        lines += [f"**{summary['refused']}**", ""]
    lines += ["| A wins % [95 % CI] | tie % | B wins % | parsed | shown-A rate (position bias; 0.50 = none) |",
              "|---|---|---|---|---|", f"| {pct('win')} | {pct('tie')} | {pct('loss')} | {parsed} | {shown} "
              f"(n = {summary.get('n_decisive', 0)}) |"]
    if summary.get("order_consistency") is not None:
        lines += ["", f"Same verdict in both presentation orders: {100 * summary['order_consistency']:.1f} % of samples."]

    def mean(v: float | None) -> str:
        return "–" if v is None else f"{v:.2f}"

    if summary.get("axes_a") and not summary.get("refused"):
        lines += ["", "| axis | A mean | B mean |", "|---|---|---|"]
        lines += [f"| {ax} | {mean(summary['axes_a'][ax])} | {mean(summary['axes_b'][ax])} |" for ax in AXES]
    return "\n".join(lines) + "\n"


@dataclass
class RunSamples:
    """The outputs of one run for one dataset (and NFE), keyed by sample id."""

    name: str
    samples: dict[str, Sample] = field(default_factory=dict)


TEXT_FIELDS = ("output", "generated", "response", "text")


def samples_from_records(records: Sequence[dict[str, Any]], *, name: str, dataset: str | None = None,
                         nfe: int | None = None, method: str | None = None, seed: int | None = None) -> RunSamples:
    """Pick one run's summaries out of result records (JSON lines), filtering on dataset / nfe / method when the
    records carry those fields. The output is the first of `TEXT_FIELDS`; the reference (and source) are read at
    the top level or in the record's `info` (the evaluation runner's layout), and so is the source's digest
(`source_sha256`) when the record holds no source text. Records with an error or no reference
    are skipped; a duplicated id is an error."""
    run = RunSamples(name)
    for r in records:
        if dataset is not None and r.get("dataset", dataset) != dataset:
            continue
        if nfe is not None and r.get("nfe", nfe) != nfe:
            continue
        if method is not None and r.get("method", method) != method:
            continue
        if seed is not None and r.get("seed", seed) != seed:
            continue
        if r.get("error"):
            continue
        info: dict[str, Any] = r["info"] if isinstance(r.get("info"), dict) else {}
        text = next((r[f] for f in TEXT_FIELDS if isinstance(r.get(f), str)), None)
        ref = r.get("reference", info.get("reference"))
        sid = r.get("sample_id", r.get("id"))
        if text is None or sid is None or not isinstance(ref, str):
            continue
        sid = str(sid)
        if sid in run.samples:
            raise ValueError(f"run {name!r}: sample id {sid!r} occurs twice after filtering; narrow it with "
                             "--dataset / --nfe / --method / --run-seed")
        run.samples[sid] = Sample(sid, text, ref, r.get("source", info.get("source")),
                                  r.get("source_sha256", info.get("source_sha256")))
    return run
