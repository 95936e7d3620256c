"""lm-evaluation-harness adapter: `--model dsl-llada` (needs the `[lmeval]` extra: `pip install lm-eval`).

- `generate_until`: any of this project's samplers, batched; the prompt goes through the tokenizer's chat template
  when it has one (`chat_template=False` to turn that off); stop strings are applied after decoding. The sampler's
  `gen_length` is the one of the configured sampler (a request's `max_gen_toks` only shortens the decoded text).
- `loglikelihood`: the masked-diffusion Monte Carlo bound of `dsl_llada.eval.likelihood` (exact for one-token
  continuations); `is_greedy` from one pass with the whole continuation masked.
- `loglikelihood_rolling`: the same bound summed over rolling windows, so perplexity tasks work.
Requests longer than the context are truncated from the left (the harness's convention), with one warning.
Under `accelerate launch` each process takes its share of the requests (lm-eval splits them by rank).
"""

from __future__ import annotations

import logging
from typing import Any


from ..core.loading import encode_prompt, open_model
from ..core.model_source import ModelSource
from ..sampling.batches import run_batches
from ..sampling.registry import SamplerConfig, sampler_config
from .likelihood import LikelihoodRequest, greedy_match, mc_loglikelihood, rolling_windows

log = logging.getLogger(__name__)

try:
    from lm_eval.api.model import LM
    from lm_eval.api.registry import register_model
except ImportError as e:  # pragma: no cover - exercised only without the extra
    raise ImportError("the lm-evaluation-harness adapter needs `pip install 'dsl-llada[lmeval]'` (lm-eval)") from e


def sampler_settings(sampler: str, **fields: Any) -> SamplerConfig:
    """The sampler config from `--model_args`'s loose key=value settings (text values parsed as the fields' types),
    through the registry's parser: an unknown key is an error naming the valid ones."""
    return sampler_config(sampler, fields, text=True)


def _flag(name: str, value: bool | str) -> bool:
    """A boolean model_arg: a bool, or the text true/false (any case)."""
    if isinstance(value, bool):
        return value
    if str(value).strip().lower() in ("true", "false"):
        return str(value).strip().lower() == "true"
    raise ValueError(f"model_args {name}={value!r} must be true or false")


@register_model("dsl-llada")
class DSLLadaLM(LM):
    """A DSL checkpoint or a masked-diffusion backbone folder as an lm-eval model.

    The model is either `model_dir` with the loose model_args settings `tokenizer`, `device` (default cpu), `dtype`,
    `quantize` and `assume_released` (lm-eval's `--model_args`), or a whole `source` (a `ModelSource`, as
    `lmeval_command.run_lm_eval` passes it), not both."""

    def __init__(self, model_dir: str | None = None, tokenizer: str | None = None, sampler: str = "sde",
                 batch_size: int | str = 8, mc_samples: int = 128, mc_batch_size: int = 32, seed: int = 42,
                 device: str | None = None, dtype: str | None = None, chat_template: bool | str = True,
                 max_length: int | None = None, rolling_context: int | None = None, quantize: str | None = None,
                 assume_released: bool | str | None = None, *, source: ModelSource | None = None,
                 **sampler_fields: Any):
        super().__init__()
        self.config = sampler_settings(sampler, **sampler_fields)
        loose = {"model_dir": model_dir, "tokenizer": tokenizer, "device": device, "dtype": dtype,
                 "quantize": quantize, "assume_released": assume_released}
        if source is None:
            if model_dir is None:
                raise ValueError("model_args needs model_dir=FOLDER")
            source = ModelSource.from_dict({"path": model_dir, "tokenizer": tokenizer, "device": device or "cpu",
                                            "dtype": dtype or "auto", "quantize": quantize or "none",
                                            "assume_released": _flag("assume_released", assume_released or False)})
        elif given := sorted(k for k, v in loose.items() if v is not None):
            raise ValueError(f"give the model either as source=ModelSource(...) or as model_dir and its settings, "
                             f"not both (also given: {', '.join(given)})")
        handle = open_model(source)
        self.model, self.tok = handle.model, handle.tokenizer
        self.batch_size = int(batch_size) if str(batch_size) != "auto" else 8
        self.mc_samples, self.mc_batch_size, self.seed = int(mc_samples), int(mc_batch_size), int(seed)
        self.chat_template = _flag("chat_template", chat_template)
        self.max_length = int(max_length or handle.context or 4096)
        self.rolling_context = int(rolling_context) if rolling_context is not None else self.max_length // 2
        self._device = handle.device
        self._warned = False
        self._rank, self._world_size, self._state = 0, 1, None
        try:
            from accelerate import PartialState

            state = PartialState()
            if state.num_processes > 1:
                self._rank, self._world_size, self._state = state.process_index, state.num_processes, state
        except (ImportError, RuntimeError):
            pass

    @classmethod
    def create_from_arg_string(cls, arg_string: str, additional_config: dict | None = None) -> "DSLLadaLM":
        kw: dict[str, Any] = {}
        for part in filter(None, (p.strip() for p in arg_string.split(","))):
            if "=" not in part:
                raise ValueError(f"model_args item {part!r} is not key=value")
            k, v = part.split("=", 1)
            kw[k.strip()] = v.strip()
        for k, v in (additional_config or {}).items():
            if v is not None and k in ("batch_size", "device"):
                kw.setdefault(k, v)
        if "model_dir" not in kw:
            raise ValueError("model_args needs model_dir=FOLDER")
        ints = ("mc_samples", "mc_batch_size", "seed", "max_length", "rolling_context")
        args: dict[str, Any] = {k: int(v) if k in ints else v for k, v in kw.items()}
        return cls(**args)

    # -- distributed hooks used by lm-eval's evaluator ----------------------------------------------------------
    def all_gather(self, tensor):
        if self._state is None:
            return tensor
        from accelerate.utils import gather

        return gather(tensor.reshape(1) if tensor.dim() == 0 else tensor)

    def gather_object(self, obj, dst=0):
        if self._state is None:
            return [obj]
        import torch.distributed as dist

        out = [None] * self._world_size if self._rank == dst else None
        dist.gather_object(obj, out, dst=dst)
        return out

    def barrier(self) -> None:
        if self._state is not None:
            self._state.wait_for_everyone()

    @property
    def tokenizer_name(self) -> str:
        return str(getattr(self.tok, "name_or_path", "dsl-llada")).replace("/", "__")

    # -- helpers ------------------------------------------------------------------------------------------------
    def _encode(self, text: str) -> list[int]:
        return list(self.tok(text, add_special_tokens=False)["input_ids"])

    def _fit(self, req: LikelihoodRequest) -> LikelihoodRequest:
        over = len(req.context) + len(req.target) - self.max_length
        if over <= 0:
            return req
        if not self._warned:
            log.warning("a request is longer than the context (%d tokens): truncating from the left, as the "
                        "harness expects (said once)", self.max_length)
            self._warned = True
        keep_ctx = req.context[over:] if over <= len(req.context) else ()
        target = req.target if over <= len(req.context) else req.target[over - len(req.context):]
        return LikelihoodRequest(tuple(keep_ctx), tuple(target))

    def _split(self, context: str, continuation: str) -> LikelihoodRequest:
        """Trailing spaces of the context move to the continuation (so 'Q: x A:' + ' y' tokenises naturally)."""
        n = len(context) - len(context.rstrip())
        if n:
            context, continuation = context[:-n], context[-n:] + continuation
        whole, ctx = self._encode(context + continuation), self._encode(context)
        if whole[:len(ctx)] != ctx:  # the boundary merged into one token: encode the parts separately
            return LikelihoodRequest(tuple(ctx), tuple(self._encode(continuation)))
        return LikelihoodRequest(tuple(ctx), tuple(whole[len(ctx):]))

    # -- the three request types --------------------------------------------------------------------------------
    def loglikelihood(self, requests, disable_tqdm: bool = False) -> list[tuple[float, bool]]:
        reqs = [self._fit(self._split(*r.args[:2])) for r in requests]
        scores = mc_loglikelihood(self.model, reqs, mc_samples=self.mc_samples, batch_size=self.mc_batch_size,
                                  seed=self.seed)
        greedy = greedy_match(self.model, reqs, batch_size=self.mc_batch_size)
        return list(zip(scores, greedy))

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
        bos = self.model.special.bos
        prefix = () if bos is None else (bos,)
        out = []
        for r in requests:
            windows = rolling_windows(self._encode(r.args[0]), max_length=self.max_length,
                                      context_len=self.rolling_context, prefix=prefix)
            out.append(float(sum(mc_loglikelihood(self.model, windows, mc_samples=self.mc_samples,
                                                  batch_size=self.mc_batch_size, seed=self.seed))))
        return out

    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        gen_length = self.config.gen_length
        prompts = []
        for r in requests:
            ids = encode_prompt(self.tok, r.args[0], chat_template=self.chat_template)
            if len(ids) + gen_length > self.max_length:
                self._fit(LikelihoodRequest(tuple(ids), (0,) * gen_length))  # says so once
                ids = ids[len(ids) + gen_length - self.max_length:]
            prompts.append(ids)
        out: list[str] = []
        for rows in run_batches(self.model, prompts, self.config, batch_size=self.batch_size, retry=False,
                                seed_of=lambda i: self.seed + i):
            for row in rows:
                r, response = requests[row.index], row.response or []
                kw = r.args[1] if len(r.args) > 1 and isinstance(r.args[1], dict) else {}
                max_toks = kw.get("max_gen_toks")
                text = self.tok.decode(response[:max_toks] if max_toks else response, skip_special_tokens=True)
                until = kw.get("until") or []
                for stop in [until] if isinstance(until, str) else until:
                    if stop and stop in text:
                        text = text[:text.index(stop)]
                out.append(text)
        return out
