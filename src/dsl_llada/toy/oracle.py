"""The toy world's Bayes-optimal denoisers: exact posterior marginals p(x_i | observation, prompt) by forward-backward.

Every toy prompt fixes its response distribution (a topic's automaton, or a document's summary automaton: `tasks.py`),
and the demo's models are trained on responses laid out as `words <|eot_id|> <|endoftext|>...` padded to the
response length. Under either corruption process the observation factorises over positions, so the exact posterior
of each position given everything observed is a forward-backward pass over the automaton with one emission term per
position:

- DSL (continuous) observation z_i = γ_i e_{x_i} + √γ_i ε_i with unit-norm e: the likelihood of token w is
  ∝ exp(-|z_i - γ_i e_w|² / (2γ_i)) ∝ exp(⟨z_i, e_w⟩), the same for every per-position γ_i (γ = 0: z = 0, flat);
- masked (discrete) observation: a [MASK] position is flat, a clean one a delta on its token.

`ToyOracle` is a `Backbone` that reads those emission terms from its input embeddings, and `oracle_dsl_model` wraps it
in a `DSLModel` whose converter turns a noisy state into exactly the DSL likelihood, so the oracle goes through every
sampler (`sample_sde`, Block SDE, remasking, ReMDM) and the training objectives' forward unchanged:

- the oracle's hidden size is V + 1 and its input embeddings are one-hot rows: a clean token w is e_w (the
  converter's clean embedding W[:, w] with W = I is the same one-hot), so prompts and committed blocks are deltas;
- its converter has W = I, c = 0, zero logit biases on the tokens and -inf-like biases on the [MASK] token and the
  mask slot, so h = softmax(β ⟨z, e_w⟩) over the tokens: the exact likelihood when β = 1 (the oracle's trained β);
  a sampler run with β_inf = 2β reads the likelihood squared, as a trained model reads a sharpened converter;
- mass on the mask slot or the [MASK] token (the discrete path's [MASK] input, Block SDE's future blocks) means
  "no information": it adds a flat term to the emission.

The returned logits are log posterior marginals (-inf where the prior rules a token out), so softmax(logits) is the
exact marginal, and the samplers' posterior mean ê = Σ_w p(w | ·) e_w is the Bayes-optimal denoiser.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from ..core.backbones.base import Backbone, Positions, SpecialTokens, select_positions
from ..config import ConverterConfig, DSLConfig
from ..core.model import DSLModel
from . import words as W
from .pfsa import Pfsa
from .tasks import open_prompts, summary_machine
from .world import ToyWorld

__all__ = ["EMISSION_FLOOR", "ORACLE_FAMILY", "ResponseChain", "ToyOracle", "oracle_dsl_model", "oracle_models",
           "posterior_marginals", "response_machine"]

ORACLE_FAMILY = "toy-oracle"
EMISSION_FLOOR = 1e-30
"""Added to every emission term after each position's terms are scaled to a maximum of 1 (float64): evidence that no
path of the automaton can produce (a committed off-grammar token, or a float32 likelihood that underflowed to 0) then
leaves the posterior defined instead of 0/0. A path's weight changes by a relative 1e-30 or less otherwise."""
UNION_BELOW_ARCS = 256
"""Automata with fewer arcs (summary automata) share one forward-backward pass per call (`ResponseChain.union`); a
pass costs about the same for 20 arcs as for 6,000, so each topic automaton keeps a pass of its own."""
MASKED_BIAS = -1.0e4
"""The oracle converter's logit bias on the [MASK] token and the mask slot: exp(-1e4) is 0 in float32, so a noisy
state carries no 'no information' mass."""


@dataclass(frozen=True)
class ResponseChain:
    """An automaton extended to the padded response layout: after `<|eot_id|>` (the automaton's end token, which
    leads to FINAL) every remaining position emits the padding token, so a response of n words fills exactly
    n + 1 + padding positions. Arrays are torch tensors (int64 / float64) for the batched passes."""

    src: torch.Tensor
    dst: torch.Tensor
    tok: torch.Tensor
    prob: torch.Tensor
    n_states: int
    start: int
    final: int

    @classmethod
    def build(cls, machine: Pfsa, pad_id: int) -> "ResponseChain":
        f = machine.final
        src = torch.as_tensor(list(machine.src) + [f], dtype=torch.long)
        dst = torch.as_tensor(list(machine.dst) + [f], dtype=torch.long)
        tok = torch.as_tensor(list(machine.tok) + [pad_id], dtype=torch.long)
        prob = torch.as_tensor(list(machine.prob) + [1.0], dtype=torch.float64)
        return cls(src, dst, tok, prob, machine.n_states, machine.start, f)

    @classmethod
    def union(cls, chains: list["ResponseChain"]) -> tuple["ResponseChain", list[int]]:
        """One chain holding `chains` side by side (disjoint states) and each one's state offset: rows that start
        in chain k's start state (`start + offset[k]`) never leave its states, so many small automata share one pass."""
        offsets, n = [], 0
        for c in chains:
            offsets.append(n)
            n += c.n_states
        cat = lambda name: torch.cat([getattr(c, name) + (o if name in ("src", "dst") else 0)  # noqa: E731
                                      for c, o in zip(chains, offsets)])
        return cls(cat("src"), cat("dst"), cat("tok"), cat("prob"), n, 0, 0), offsets


def posterior_marginals(chain: ResponseChain, emissions: torch.Tensor, start: torch.Tensor | None = None,
                        final: torch.Tensor | None = None) -> torch.Tensor:
    """Exact p(x_t = w | evidence) for a batch of responses that share one automaton.

    `emissions` is (G, L, V) float64: the likelihood of each token at each of the L response positions (any positive
    scale per position; 1 everywhere = no information). Returns (G, L, V) float64 marginals, each row summing to 1,
    under the automaton's distribution restricted to responses that fit the L positions (words, end-of-turn, padding).
    `start`/`final` (G,) give each row its own start and final state (rows of a `ResponseChain.union`); default the
    chain's. Scaled forward-backward in linear space: O(L * arcs) per row.
    """
    if emissions.dim() != 3:
        raise ValueError(f"emissions must be (rows, positions, vocab), got shape {tuple(emissions.shape)}")
    G, L, V = emissions.shape
    emissions = emissions.to(torch.float64)
    emissions = emissions / emissions.amax(-1, keepdim=True).clamp_min(1e-300) + EMISSION_FLOOR
    src, dst, tok, prob = chain.src, chain.dst, chain.tok, chain.prob
    arc = prob[None, None, :] * emissions[:, :, tok]  # (G, L, A): p(arc) x L_t(token of arc)
    alpha = emissions.new_zeros(G, L + 1, chain.n_states)
    rows = torch.arange(G, device=emissions.device)
    alpha[rows, 0, chain.start if start is None else start] = 1.0
    for t in range(L):
        nxt = alpha.new_zeros(G, chain.n_states).index_add_(1, dst, alpha[:, t, src] * arc[:, t])
        alpha[:, t + 1] = nxt / nxt.sum(1, keepdim=True)
    beta = emissions.new_zeros(G, L + 1, chain.n_states)
    beta[rows, L, chain.final if final is None else final] = 1.0
    for t in range(L - 1, -1, -1):
        prev = beta.new_zeros(G, chain.n_states).index_add_(1, src, arc[:, t] * beta[:, t + 1, dst])
        beta[:, t] = prev / prev.sum(1, keepdim=True).clamp_min(1e-300)
    xi = alpha[:, :L, src] * arc * beta[:, 1:, dst]  # (G, L, A): posterior weight of each arc at each position
    xi = xi / xi.sum(-1, keepdim=True)
    return emissions.new_zeros(G, L, V).index_add_(2, tok, xi)


def response_machine(world: ToyWorld, prompt_text: str) -> Pfsa:
    """The response automaton a toy prompt (`write about the ocean .`, `summarize : <document>`) stands for."""
    text = " ".join(prompt_text.split())
    if text.startswith(W.SUMMARY_PREFIX + " "):
        return summary_machine(world, text[len(W.SUMMARY_PREFIX) + 1:])
    for prompt, topic in open_prompts(world):
        if prompt == text:
            return world.machine(topic)
    raise ValueError(f"the toy oracle knows no task for the prompt {prompt_text!r}: expected one of the world's "
                     f"open-ended prompts (e.g. {open_prompts(world)[0][0]!r}) or '{W.SUMMARY_PREFIX} <document>'")


class ToyOracle(Backbone):
    """The Bayes-optimal denoiser of the toy world, as a backbone (see the module docstring).

    Input: (B, T, V + 1) embeddings whose first rows are the clean one-hot chat prompt (left padding before its BOS is
    skipped) and whose rows after the prompt's `assistant <|end_header_id|>` are the response positions.
    Output: (B, K, V) log posterior marginals for the K selected positions (prompt positions: their own token).
    """

    family = ORACLE_FAMILY

    def __init__(self, world: ToyWorld, special: SpecialTokens):
        super().__init__()
        self.world = world
        self.special = special
        V = world.vocab_size
        special.validate(V)
        self.wte = nn.Embedding(V, V + 1)
        with torch.no_grad():
            self.wte.weight.copy_(torch.eye(V, V + 1))
        self.wte.weight.requires_grad_(False)
        t = world.token_to_id
        self._prompt_end = (t["assistant"], t[W.END_HEADER])
        self._chains: dict[tuple[int, ...], tuple[ResponseChain, list[int]]] = {}
        self._machines: dict[tuple[int, ...], Pfsa] = {}

    @property
    def vocab_size(self) -> int:
        return self.world.vocab_size

    @property
    def hidden_size(self) -> int:
        return self.world.vocab_size + 1

    def input_embeddings(self) -> nn.Embedding:
        return self.wte

    def output_embeddings(self) -> nn.Module:
        raise NotImplementedError("the toy oracle has no output head: its logits are computed exactly")

    def config_dict(self) -> dict[str, Any]:
        return {"model_type": ORACLE_FAMILY, "vocab_size": self.vocab_size, "world": self.world.config.to_dict()}

    # -- reading the input -------------------------------------------------------------------------------------
    def _union(self, machines: list[Pfsa]) -> tuple[ResponseChain, list[int]]:
        """The chain of one group of rows: one automaton, or several small ones side by side (cached)."""
        key = tuple(id(m) for m in machines)
        if key not in self._chains:
            self._chains[key] = ResponseChain.union([ResponseChain.build(m, self.special.pad_id) for m in machines])
        return self._chains[key]

    def _split(self, ids: list[int]) -> tuple[int, Pfsa]:
        """(response start, automaton) of one row from its clean prompt ids (left padding before BOS is skipped)."""
        a, b = self._prompt_end
        start = next((i + 2 for i in range(len(ids) - 1) if ids[i] == a and ids[i + 1] == b), None)
        if start is None:
            raise ValueError("the toy oracle needs a chat-templated toy prompt ending in 'assistant <|end_header_id|>' "
                             "(toy.render_prompt); none was found in the input")
        bos = self.special.bos
        lo = ids.index(bos) if bos is not None and bos in ids[:start] else 0
        key = tuple(ids[lo:start])
        if key not in self._machines:
            words = [self.world.tokens[i] for i in key]
            try:
                text = " ".join(words[words.index(W.END_HEADER) + 1: len(words) - 1 - words[::-1].index(W.EOT)])
            except ValueError:
                text = " ".join(words)
            self._machines[key] = response_machine(self.world, text)
        return start, self._machines[key]

    def emissions(self, h: torch.Tensor) -> torch.Tensor:
        """(..., V + 1) input rows -> (..., V) float64 emission terms: the token mass plus the 'no information' mass
        (mask slot and [MASK] token) on every token."""
        h = h.to(torch.float64)
        V, m = self.vocab_size, self.special.mask
        flat = h[..., V] + h[..., m]
        out = h[..., :V] + flat[..., None]
        out[..., m] = 0.0
        return out.clamp_min(0.0)

    # -- the forward --------------------------------------------------------------------------------------------
    def forward(self, inputs_embeds: torch.Tensor, attention_mask: torch.Tensor | None = None, *,
                positions: Positions = None) -> torch.Tensor:
        B, T, H = inputs_embeds.shape
        if H != self.hidden_size:
            raise ValueError(f"the toy oracle reads (batch, length, {self.hidden_size}) inputs, got {tuple(inputs_embeds.shape)}")
        ids = inputs_embeds.argmax(-1)
        out = torch.full((B, T, self.vocab_size), -math.inf, dtype=torch.float64, device=inputs_embeds.device)
        out.scatter_(2, ids.clamp_max(self.vocab_size - 1)[..., None], 0.0)  # prompt positions: their own token
        groups: dict[tuple[int, int], tuple[list[Pfsa], list[int]]] = {}
        for b, row in enumerate(ids.tolist()):
            start, machine = self._split(row)
            key = (start, id(machine) if len(machine.src) >= UNION_BELOW_ARCS else -1)
            group = groups.setdefault(key, ([], []))
            group[0].append(machine)
            group[1].append(b)
        for (start, _), (machines, rows) in groups.items():
            if start >= T:
                raise ValueError(f"the toy oracle found no response positions after the prompt (length {T})")
            distinct = list({id(m): m for m in machines}.values())
            chain, offsets = self._union(distinct)
            where = {id(m): o for m, o in zip(distinct, offsets)}
            first = torch.as_tensor([where[id(m)] + m.start for m in machines])
            last = torch.as_tensor([where[id(m)] + m.final for m in machines])
            idx = torch.as_tensor(rows, device=inputs_embeds.device)
            marg = posterior_marginals(chain, self.emissions(inputs_embeds[idx, start:]), first, last)
            out[idx, start:] = marg.log()
        return select_positions(out.to(torch.float32), positions)


def oracle_dsl_model(world: ToyWorld, special: SpecialTokens, noise_table: torch.Tensor) -> DSLModel:
    """A `DSLModel` around `ToyOracle` whose converter turns a noisy state into the exact DSL likelihood.

    `noise_table` (V, d) is the noise embedding whose channel the oracle inverts, e.g. a trained model's
    `unit_noise()` (its rows are re-normalised, as every DSL forward does). The oracle's trained β is 1: samplers
    that use β_inf = β (`SDEConfig(beta_scale=1.0)`) read the exact likelihood.
    """
    V = world.vocab_size
    if noise_table.dim() != 2 or noise_table.shape[0] != V:
        raise ValueError(f"noise_table must be ({V}, d) for this world, got {tuple(noise_table.shape)}")
    cfg = DSLConfig(converter=ConverterConfig(noise_dim=int(noise_table.shape[1]), beta_init=1.0,
                                              trainable_noise_embed=False))
    model = DSLModel(ToyOracle(world, special), cfg)
    with torch.no_grad():
        model.noise_embed.weight.copy_(noise_table.detach().float())
        model.converter.backbone_embedding.weight.copy_(torch.eye(V + 1))
        assert model.converter.backbone_embedding.bias is not None  # the released layout has the value bias c
        model.converter.backbone_embedding.bias.zero_()
        model.converter.logit_bias.zero_()
        model.converter.logit_bias[V] = MASKED_BIAS
        model.converter.logit_bias[special.mask] = MASKED_BIAS
        model.converter.beta.fill_(1.0)
    return model.requires_grad_(False).eval()


def oracle_models(world: ToyWorld, special: SpecialTokens, dsl: DSLModel) -> dict[str, DSLModel | Backbone]:
    """The demo's oracle entries: 'oracle' (the masked-observation oracle, for the discrete samplers) and
    'oracle-dsl' (the DSL-observation oracle over the trained DSL model's own noise table)."""
    return {"oracle": ToyOracle(world, special).eval(),
            "oracle-dsl": oracle_dsl_model(world, special, dsl.unit_noise().detach().float().cpu())}
