"""Supervised fine-tuning (SFT) examples for LLaDA-Instruct-style training.

One conversation becomes one fixed-length block (no packing)::

    [prompt ids][response ids][EOS, EOS, ..., EOS]   # length == block_size

with ``prompt_length = len(prompt ids)``.  As in LLaDA-Instruct SFT the trailing
EOS tokens are ordinary targets, so the model learns to end (and the length of)
its answer; at least one EOS is always kept.

Records are either ``{"prompt": str, "response": str}`` or
``{"messages": [{"role": ..., "content": ...}, ...]}`` whose *last* message is
the assistant reply being trained on (earlier turns are context only).

The prompt is rendered to text by the caller's ``render_prompt(messages)`` if
given, else by the tokenizer's chat template
(``apply_chat_template(..., tokenize=False, add_generation_prompt=True)``), and
both prompt and response are encoded with ``add_special_tokens=False`` (a chat
template already contains its own BOS/role markers).  Prompt and response are
encoded separately, so a tokenizer that merges across that boundary can differ
slightly from encoding the joined string — harmless for templates that end in
whitespace or a special token.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

Message = dict[str, str]
RenderPrompt = Callable[[list[Message]], str]
Encode = Callable[[list[str]], list[list[int]]]

__all__ = ["Message", "RenderPrompt", "normalize_sft_record", "render_prompt_text", "build_sft_example"]


def normalize_sft_record(record: Any, where: str) -> tuple[list[Message], str]:
    """Split a record into (prompt messages, response text); raise naming ``where``."""
    if not isinstance(record, Mapping):
        raise ValueError(f"{where}: an SFT record must be a dict with 'prompt'/'response' or 'messages', "
                         f"got {type(record).__name__}")
    if "messages" in record and record["messages"] is not None:
        messages = record["messages"]
        if not isinstance(messages, Sequence) or len(messages) < 2:
            raise ValueError(f"{where}: 'messages' must be a list of at least 2 {{role, content}} dicts "
                             f"(context then the assistant reply), got {messages!r:.200}")
        for m in messages:
            if not isinstance(m, Mapping) or "role" not in m or "content" not in m:
                raise ValueError(f"{where}: every message needs 'role' and 'content' keys, got {m!r:.200}")
        if messages[-1]["role"] != "assistant":
            raise ValueError(f"{where}: the last message must have role 'assistant' (the trained reply), "
                             f"got role {messages[-1]['role']!r}")
        return [dict(m) for m in messages[:-1]], str(messages[-1]["content"])
    missing = [k for k in ("prompt", "response") if not isinstance(record.get(k), str)]
    if missing:
        raise ValueError(f"{where}: SFT record needs string fields 'prompt' and 'response' (missing/non-string: "
                         f"{missing}) or a 'messages' list; keys present: {sorted(record)}")
    return [{"role": "user", "content": record["prompt"]}], record["response"]


def render_prompt_text(messages: list[Message], tokenizer: Any, render_prompt: RenderPrompt | None) -> str:
    """Prompt text: ``render_prompt`` if given, else the tokenizer's chat template."""
    if render_prompt is not None:
        return render_prompt(messages)
    if getattr(tokenizer, "chat_template", None) and hasattr(tokenizer, "apply_chat_template"):
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    raise ValueError("format='sft' needs a prompt renderer: the tokenizer has no chat_template; "
                     "pass render_prompt=callable(messages) -> str")


def build_sft_example(
    messages: list[Message],
    response: str,
    where: str,
    *,
    encode: Encode,
    tokenizer: Any,
    render_prompt: RenderPrompt | None,
    block_size: int,
    eos_id: int,
    overflow: str = "error",
    response_suffix: str = "",
) -> tuple[np.ndarray, int]:
    """Return ``(ids[block_size], prompt_length)`` for one conversation.

    ``overflow="error"`` raises when the response (plus one EOS) does not fit
    after the prompt; ``"truncate"`` cuts the response to fit.  A prompt that
    leaves no room for even one response token and the EOS always raises.
    """
    prompt_text = render_prompt_text(messages, tokenizer, render_prompt)
    prompt_ids, resp_ids = encode([prompt_text, response + response_suffix])
    p, r = len(prompt_ids), len(resp_ids)
    room = block_size - p - 1  # response tokens that fit while keeping >= 1 EOS
    if room < 1:
        raise ValueError(f"{where}: prompt has {p} tokens but block_size={block_size} leaves no room for a "
                         f"response and an EOS (need prompt <= block_size - 2); raise block_size or filter it")
    if r > room:
        if overflow != "truncate":
            raise ValueError(f"{where}: response has {r} tokens but block_size={block_size} minus prompt {p} "
                             f"minus 1 EOS leaves room for {room}; raise block_size, filter the data, or set "
                             f"DataConfig(sft_overflow='truncate')")
        resp_ids = resp_ids[:room]
    out = np.full(block_size, eos_id, dtype=np.int64)
    out[:p] = prompt_ids
    out[p:p + len(resp_ids)] = resp_ids
    return out, p
