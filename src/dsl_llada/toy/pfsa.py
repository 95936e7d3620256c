"""A small probabilistic finite-state automaton (PFSA) with exact scoring.

A PFSA emits one token per transition.  ``P(string)`` is the sum over all
hidden state paths that emit it, computed exactly with the forward algorithm.
The end of a string is itself an emitted token (``end_token``) that leads to a
single absorbing ``FINAL`` state, so ``P`` is a proper distribution over
finite strings whenever every non-final state's outgoing probabilities sum
to one and ``FINAL`` is reached with probability one.

Optional ε-smoothing (used to score text outside the support) defines the
*smoothed* automaton

    P_ε(s --w--> s') = (1-ε)·P(s --w--> s') + ε/|A|·[s' = s]      (w ≠ end)
    P_ε(s --end--> FINAL) = (1-ε)·P(s --end--> FINAL) + ε/|A|

where ``|A|`` is the alphabet size (every scorable token, ``end`` included).
Each state's outgoing mass is still exactly one, so this is again a proper
distribution, every string gets probability ≥ (ε/|A|)^(len+1), and the same
forward algorithm scores it exactly.

Models are written with a :class:`PfsaBuilder` that also accepts ε-moves
(``token=None``; they must form an acyclic graph); :meth:`PfsaBuilder.compile`
eliminates them, which leaves the string distribution unchanged.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Hashable, Mapping, Sequence

import numpy as np

FINAL: Hashable = ("<FINAL>",)


class PfsaBuilder:
    """Collects named states and arcs ``src --token/prob--> dst`` (token None = ε-move)."""

    def __init__(self, start: Hashable) -> None:
        self.start = start
        self._arcs: dict[Hashable, list[tuple[Hashable, str | None, float, str]]] = defaultdict(list)

    def add(self, src: Hashable, dst: Hashable, token: str | None, prob: float, tag: str = "") -> None:
        """Add an arc; zero-probability arcs are dropped."""
        if prob < 0.0:
            raise ValueError(f"negative probability {prob} on arc {src!r} -> {dst!r}")
        if prob > 0.0:
            self._arcs[src].append((dst, token, float(prob), tag))

    def compile(self, token_to_id: Mapping[str, int], end_token: str,
                alphabet_size: int | None = None) -> "Pfsa":
        """Eliminate ε-moves, keep states reachable from ``start`` and index everything.

        ``alphabet_size`` (default ``len(token_to_id)``) is the ``|A|`` of ε-smoothing.
        """
        memo: dict[Hashable, list[tuple[Hashable, str, float, str]]] = {}
        active: set[Hashable] = set()

        def emitting(state: Hashable) -> list[tuple[Hashable, str, float, str]]:
            if state in memo:
                return memo[state]
            if state in active:
                raise ValueError(f"cycle of epsilon moves through {state!r}")
            active.add(state)
            out: list[tuple[Hashable, str, float, str]] = []
            for dst, tok, p, tag in self._arcs.get(state, ()):
                if tok is None:
                    out.extend((d2, t2, p * p2, g2) for d2, t2, p2, g2 in emitting(dst))
                else:
                    out.append((dst, tok, p, tag))
            active.discard(state)
            memo[state] = out
            return out

        index: dict[Hashable, int] = {self.start: 0}
        order: list[Hashable] = [self.start]
        src, dst, tok, prob, tags = [], [], [], [], []
        i = 0
        while i < len(order):
            state = order[i]
            i += 1
            if state == FINAL:
                continue
            for d, t, p, g in emitting(state):
                if (t == end_token) != (d == FINAL):
                    raise ValueError(f"end token must lead to FINAL and only there ({state!r} -> {d!r})")
                if d not in index:
                    index[d] = len(order)
                    order.append(d)
                src.append(index[state])
                dst.append(index[d])
                tok.append(token_to_id[t])
                prob.append(p)
                tags.append(g)
        if FINAL not in index:
            raise ValueError("FINAL is unreachable")
        return Pfsa(order, index[FINAL], token_to_id[end_token], alphabet_size or len(token_to_id),
                    np.asarray(src, np.int64), np.asarray(dst, np.int64),
                    np.asarray(tok, np.int64), np.asarray(prob, np.float64), tags)


class Pfsa:
    """Compiled PFSA over integer token ids (start state is 0).

    ``alphabet_size`` is the ``|A|`` of ε-smoothing: the number of distinct
    tokens a scored string may contain (the end token included).
    """

    def __init__(self, states: list[Hashable], final: int, end_id: int, alphabet_size: int,
                 src: np.ndarray, dst: np.ndarray, tok: np.ndarray, prob: np.ndarray,
                 tags: list[str]) -> None:
        self.states = states
        self.n_states = len(states)
        self.start = 0
        self.final = final
        self.end_id = end_id
        self.alphabet_size = alphabet_size
        order = np.argsort(src, kind="stable")
        self.src, self.dst, self.tok, self.prob = src[order], dst[order], tok[order], prob[order]
        self.tags = [tags[j] for j in order]
        self.offsets = np.searchsorted(self.src, np.arange(self.n_states + 1))
        self._by_tok: dict[int, np.ndarray] = {}
        for t in np.unique(self.tok):
            self._by_tok[int(t)] = np.nonzero(self.tok == t)[0]
        self._nonfinal = np.ones(self.n_states, bool)
        self._nonfinal[final] = False

    # ------------------------------------------------------------------ checks
    def out_mass(self) -> np.ndarray:
        """Total outgoing probability of every state (1 for all but FINAL, which has 0)."""
        return np.bincount(self.src, weights=self.prob, minlength=self.n_states)

    # ----------------------------------------------------------------- scoring
    def log_prob(self, ids: Sequence[int], epsilon: float = 0.0) -> float:
        """Exact ``log P_ε(ids + [end])`` by the forward algorithm (scaled, linear space).

        ``ids`` must not contain ``end_id``; ``epsilon=0`` gives the unsmoothed
        model and may return ``-inf``.
        """
        if not 0.0 <= epsilon < 1.0:
            raise ValueError(f"epsilon must be in [0, 1), got {epsilon}")
        keep, leak = 1.0 - epsilon, epsilon / self.alphabet_size
        alpha = np.zeros(self.n_states)
        alpha[self.start] = 1.0
        log_scale = 0.0
        ids = [int(t) for t in ids]
        if self.end_id in ids:
            raise ValueError("ids must not contain the end token (it is appended automatically)")
        for t in ids + [self.end_id]:
            new = np.zeros(self.n_states)
            idx = self._by_tok.get(t)
            if idx is not None:
                new += np.bincount(self.dst[idx], weights=alpha[self.src[idx]] * self.prob[idx] * keep,
                                   minlength=self.n_states)
            if leak > 0.0:
                if t == self.end_id:
                    new[self.final] += leak * alpha[self._nonfinal].sum()
                else:
                    new[self._nonfinal] += leak * alpha[self._nonfinal]
            total = new.sum()
            if total <= 0.0:
                return -math.inf
            log_scale += math.log(total)
            alpha = new / total
        return log_scale + math.log(alpha[self.final]) if alpha[self.final] > 0 else -math.inf

    # ---------------------------------------------------------------- sampling
    def sample(self, rng: np.random.Generator) -> tuple[list[int], list[str]]:
        """Sample one path; returns (token ids without the final end token, arc tags incl. end)."""
        ids: list[int] = []
        tags: list[str] = []
        s = self.start
        while s != self.final:
            lo, hi = self.offsets[s], self.offsets[s + 1]
            cum = np.cumsum(self.prob[lo:hi])
            j = lo + min(int(np.searchsorted(cum, rng.random() * cum[-1], side="right")), hi - lo - 1)
            if self.tok[j] != self.end_id:
                ids.append(int(self.tok[j]))
            tags.append(self.tags[j])
            s = int(self.dst[j])
        return ids, tags

    # ---------------------------------------------------------- exact analysis
    def enumerate(self, max_paths: int = 200_000) -> dict[tuple[int, ...], float]:
        """Brute force: sum path probabilities per string (for tiny automata and tests)."""
        out: dict[tuple[int, ...], float] = defaultdict(float)
        n_paths = 0

        def walk(s: int, prefix: tuple[int, ...], p: float) -> None:
            nonlocal n_paths
            if s == self.final:
                n_paths += 1
                if n_paths > max_paths:
                    raise RuntimeError(f"more than {max_paths} paths; automaton too large to enumerate")
                out[prefix[:-1]] += p
                return
            for j in range(self.offsets[s], self.offsets[s + 1]):
                walk(int(self.dst[j]), prefix + (int(self.tok[j]),), p * float(self.prob[j]))

        walk(self.start, (), 1.0)
        return dict(out)

    def expected_visits(self, max_steps: int = 10_000) -> np.ndarray:
        """Expected number of visits to each state (exact for acyclic automata)."""
        v: np.ndarray = np.zeros(self.n_states)
        v[self.start] = 1.0
        total = np.zeros(self.n_states)
        for _ in range(max_steps):
            total += v
            v = np.bincount(self.dst, weights=v[self.src] * self.prob, minlength=self.n_states)
            if v.sum() < 1e-14:
                break
        return total

    def path_entropy(self) -> float:
        """Entropy (nats) of the path distribution — an upper bound on the string entropy."""
        plogp = np.where(self.prob > 0, -self.prob * np.log(np.where(self.prob > 0, self.prob, 1.0)), 0.0)
        h_out = np.bincount(self.src, weights=plogp, minlength=self.n_states)
        return float(self.expected_visits() @ h_out)

    def expected_length(self) -> float:
        """Expected number of emitted tokens, excluding the end token."""
        return float(self.expected_visits()[self._nonfinal].sum() - 1.0)

    def max_length(self, max_steps: int = 10_000) -> int:
        """Length (excluding end) of the longest string; raises if the automaton is cyclic."""
        reach = np.zeros(self.n_states, bool)
        reach[self.start] = True
        longest = -1
        for step in range(max_steps):
            if reach[self.final]:
                longest = step - 1
            nxt = np.zeros(self.n_states, bool)
            nxt[self.dst[reach[self.src]]] = True
            if not nxt.any():
                return longest
            reach = nxt
        raise ValueError("automaton appears to be cyclic")
