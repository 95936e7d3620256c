"""Everything between files on disk and a ready sampler input: the model (DSL checkpoint or bare backbone), its
tokenizer, dtype/device names, prompt files, prompt encoding and the checks that a prompt fits the model.

Every command loads through here (`generate`, `eval`, `serve`, `ui`, `lm-eval`, the trainer's tokenizer); the
samplers never load anything, and `generation.py` only generates.
"""

from __future__ import annotations

import contextlib
import json
import secrets
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, BinaryIO, cast

import torch

from .backbones import load_backbone
from .backbones.base import END_OF_TURN_SPELLINGS, Backbone, CheckpointError, SpecialTokens, context_limit
from .checkpoint import CheckpointFolder, opened
from ..runtime.environment import has_native_bf16
from .model import DSL_PREFIXES, DSLModel
from .model_source import DTYPE_NAMES, ModelSource
from .text import not_text

__all__ = ["DTYPES", "DTYPE_CHOICES", "ModelHandle", "ModelSource", "ResolvedSource", "auto_dtype", "check_device",
           "check_tokenizer_files", "check_prompt_lengths", "check_prompt_texts", "check_vocabulary", "context_limit",
           "default_device", "encode_messages", "encode_prompt", "is_dsl_checkpoint", "load_model", "load_tokenizer",
           "open_model", "parse_dtype", "read_prompts", "resolve", "resolve_dtype", "resolve_source", "special_spellings",
           "tokenizer_special_ids"]

DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
          "float16": torch.float16, "fp16": torch.float16}


DTYPE_CHOICES = DTYPE_NAMES
"""What a `--dtype` option accepts: 'auto' (`auto_dtype`) or an explicit name."""


def parse_dtype(name: str) -> torch.dtype:
    if name not in DTYPES:
        raise ValueError(f"dtype={name!r} is not valid; expected one of {sorted(DTYPES)}")
    return DTYPES[name]


def auto_dtype(device: str | torch.device) -> torch.dtype:
    """The backbone dtype of the paper's precision recipe on this hardware: bf16 on a GPU and on a CPU that computes
    bf16 natively (AMX-BF16 / AVX512-BF16 / arm bf16, read from the CPU flags), fp32 elsewhere (an AVX2-only CPU
    emulates bf16 hundreds of times slower). The converter softmax, posterior mean and SDE state stay fp32 in any
    case (converter.py, sampling/sde.py)."""
    kind = torch.device(device).type
    if kind == "cuda" or (kind == "cpu" and has_native_bf16()):
        return torch.bfloat16
    return torch.float32


def resolve_dtype(name: str | None, device: str | torch.device) -> torch.dtype:
    """A `--dtype` value to a torch dtype: None or 'auto' -> `auto_dtype(device)`, else `parse_dtype`."""
    if name is None or name == "auto":
        return auto_dtype(device)
    if name not in DTYPES:
        raise ValueError(f"dtype={name!r} is not valid; expected one of {list(DTYPE_CHOICES)}")
    return DTYPES[name]


def default_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def check_device(name: str | torch.device) -> str:
    """`name` if this machine has that device, else one ValueError saying what is valid (so `--device bogus` or
    `--device cuda` without a GPU is never reported as a damaged weights file)."""
    try:
        dev = torch.device(name)
    except (RuntimeError, TypeError, ValueError):
        raise ValueError(f"--device {str(name)!r} is not a device name; expected cpu, cuda or cuda:N "
                         f"(default: {default_device()})") from None
    if dev.type == "cpu":
        return str(name)
    if dev.type == "cuda":
        n = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if n == 0:
            raise ValueError(f"--device {str(name)!r}: no CUDA GPU is available on this machine; use --device cpu")
        if dev.index is not None and dev.index >= n:
            raise ValueError(f"--device {str(name)!r}: this machine has {n} CUDA device(s) (cuda:0..cuda:{n - 1})")
        return str(name)
    if dev.type == "mps" and getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
        return str(name)
    raise ValueError(f"--device {str(name)!r} is not available here; expected cpu or cuda (default: {default_device()})")


def is_dsl_checkpoint(path: str | Path | CheckpointFolder) -> bool:
    """Whether a model folder holds a DSL checkpoint (it has the noise embedding, `noise_embed.weight`), read from
    its weight files' headers; anything else is a bare backbone."""
    with opened(path) as ckpt:
        return "noise_embed.weight" in ckpt.files


def load_model(path: str | Path | CheckpointFolder, *, dtype: torch.dtype = torch.float32, device: str = "cpu",
               assume_released: bool = False, special: SpecialTokens | None = None,
               backbone_only: bool = False) -> DSLModel | Backbone:
    """A DSL checkpoint (`is_dsl_checkpoint`) loads as DSLModel; anything else as a bare backbone.
    `assume_released`: a DSL checkpoint without dsl_config.json is the released layout (else refused).
    `special`: the model's special token ids (default: read from the folder's config and tokenizer files).
    `backbone_only`: a DSL checkpoint's backbone alone (its converter and noise table are not read).
    Commands open models with `open_model` (this plus the tokenizer, device, dtype and checks); only the trainer's
    starting point loads with this directly (its tokenizer is a setting of its own, see
    `train.components.load_training_model`)."""
    check_device(device)
    with opened(path) as ckpt:
        return _load_checked(ckpt, dtype=dtype, device=device, assume_released=assume_released, special=special,
                             backbone_only=backbone_only)


def _load_checked(ckpt: CheckpointFolder, *, dtype: torch.dtype, device: str, assume_released: bool,
                  special: SpecialTokens | None, backbone_only: bool) -> DSLModel | Backbone:
    """`load_model` with the device already checked, from a folder opened once (each file read once)."""
    dsl = is_dsl_checkpoint(ckpt)
    if dsl and not backbone_only:
        return DSLModel.from_pretrained(ckpt, dtype=dtype, device=device, special=special,
                                        assume_released=assume_released).eval()
    return load_backbone(ckpt, dtype=dtype, device=device, special=special,
                         extra_keys_ok=DSL_PREFIXES if dsl else ()).eval()


TOKENIZER_JSON_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
                        "vocab.json", "generation_config.json")
VOCABULARY_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json")


def check_tokenizer_files(path: str | Path | CheckpointFolder) -> list[str]:
    """Parse the tokenizer files of folder `path` before anything uses (or copies) them: every JSON file must be
    valid UTF-8 JSON and `tokenizer.json` must load. Raises CheckpointError naming the file; returns the
    vocabulary files found (none: the folder has no tokenizer). Each file is read once (`path` may be a
    `CheckpointFolder` whose files the model loading then reads from memory)."""
    with opened(path) as files:
        return _check_tokenizer_files(files)


def _check_tokenizer_files(files: CheckpointFolder) -> list[str]:
    folder = files.path
    texts: dict[str, str] = {}
    for name in TOKENIZER_JSON_FILES:
        f = folder / name
        raw = files.raw(name)
        if raw is not None:
            try:
                texts[name] = raw.decode("utf-8")
                json.loads(texts[name])
            except (json.JSONDecodeError, UnicodeDecodeError) as e:
                raise CheckpointError(f"tokenizer file {str(f)!r} is not valid JSON ({e}); it is damaged — copy it "
                                      f"again from the model it came with") from None
    if "tokenizer.json" in texts:
        from tokenizers import Tokenizer

        try:
            Tokenizer.from_str(texts["tokenizer.json"])
        except Exception as e:  # noqa: BLE001  (the Rust library raises a bare Exception)
            raise CheckpointError(f"tokenizer file {str(folder / 'tokenizer.json')!r} cannot be read as a tokenizer "
                                  f"({str(e).splitlines()[0] if str(e) else type(e).__name__}); it is damaged") from None
    return [n for n in VOCABULARY_FILES if (folder / n).is_file()]


def _check_chat_template(tokenizer: Any, path: Path) -> None:
    """Render the chat template once (sandboxed) so a template that fails or is blocked is one error up front."""
    if not getattr(tokenizer, "chat_template", None):
        return
    where = path / "chat_template.jinja" if (path / "chat_template.jinja").is_file() else path / "tokenizer_config.json"
    try:
        tokenizer.apply_chat_template([{"role": "user", "content": "hello"}], tokenize=False, add_generation_prompt=True)
    except Exception as e:  # noqa: BLE001  (jinja2's SecurityError, TemplateError, ...: all one refusal)
        first = str(e).splitlines()[0] if str(e) else ""
        raise CheckpointError(f"the chat template in {str(where)!r} cannot be rendered ({type(e).__name__}: {first}); "
                              f"fix it, or pass --no-chat-template to encode prompts without it") from None


def load_tokenizer(path: str | Path | CheckpointFolder, *, chat_template: bool = True) -> Any:
    """A Hugging Face tokenizer from a local folder (never the hub; no remote code). Its files are parsed first
    (`check_tokenizer_files`) and, when `chat_template`, its chat template is rendered once."""
    with opened(path) as files:
        return _load_tokenizer(files, _check_tokenizer_files(files) if files.path.is_dir() else None,
                               chat_template=chat_template)


def _load_tokenizer(files: CheckpointFolder, vocabulary: list[str] | None, *, chat_template: bool) -> Any:
    """`load_tokenizer` of a folder whose files were checked already (`vocabulary`: the vocabulary files found,
    None when `files` is not a folder)."""
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    path = files.path
    if vocabulary == []:
        raise CheckpointError(f"no tokenizer in {str(path)!r} (none of {', '.join(VOCABULARY_FILES)}); pass "
                              f"--tokenizer FOLDER with the model's tokenizer files")
    try:
        if (path / "tokenizer.json").exists():  # a fast tokenizer file: no need to read the model's config
            tok = PreTrainedTokenizerFast.from_pretrained(str(path), local_files_only=True)
        else:
            tok = AutoTokenizer.from_pretrained(str(path), local_files_only=True, trust_remote_code=False)
    except (OSError, ValueError) as e:
        raise CheckpointError(f"could not load a tokenizer from {str(path)!r}: {e}") from None
    if chat_template:
        _check_chat_template(tok, path)
    return tok


ROLE_NAMES = {"mask": "mask", "eos": "eos", "eot": "end-of-turn", "pad": "pad"}
"""The special-token roles a tokenizer must agree with its model on, as error messages name them."""


def tokenizer_special_ids(tokenizer: Any) -> dict[str, int | None]:
    """The tokenizer's own ids for the roles in `ROLE_NAMES`: its declared mask, eos and pad tokens, and its
    end-of-turn token (the first of `END_OF_TURN_SPELLINGS` its vocabulary holds); None for a role it does not
    name."""
    try:
        vocab = tokenizer.get_vocab()
    except (AttributeError, TypeError, NotImplementedError):
        vocab = {}
    eot = next((vocab[s] for s in END_OF_TURN_SPELLINGS if s in vocab), None)
    return {"mask": tokenizer.mask_token_id, "eos": tokenizer.eos_token_id, "eot": eot, "pad": tokenizer.pad_token_id}


def check_vocabulary(tokenizer: Any, model: DSLModel | Backbone, *, tokenizer_path: str | Path,
                     model_path: str | Path) -> None:
    """Refuse a tokenizer that is certainly not the model's, naming both values:

    - it has more tokens (added ones included) than the model's vocabulary: such an id would be read as another
      token, or fail deep inside the model;
    - a special-token role that both name (mask, eos, end of turn, pad; see `tokenizer_special_ids`) has a
      different id in each: prompts would carry the wrong control tokens and responses stop at the wrong ids;
    - one of the model's special ids (mask, eos, end of turn, pad) is past the tokenizer's last token: the tokenizer
      cannot spell it, so it is another model's.

    A tokenizer with fewer tokens than the model's vocabulary is otherwise normal: models pad their embedding table
    past their tokenizer (LLaDA-8B has 126,464 rows, Dream-7B 152,064 for 151,667 tokens). The beginning-of-text id
    is not compared (Dream's config and tokenizer name different ones)."""
    n, vocab = len(tokenizer), int(model.vocab_size)
    if n > vocab:
        ids = f"id {vocab}" if n == vocab + 1 else f"ids {vocab}..{n - 1}"
        raise CheckpointError(f"the tokenizer in {str(tokenizer_path)!r} has {n} tokens but the model in "
                              f"{str(model_path)!r} has a vocabulary of {vocab}: its {ids} would reach the model as "
                              f"tokens it does not have; use the model's own tokenizer (--tokenizer)")
    theirs = tokenizer_special_ids(tokenizer)
    ours = {role: getattr(model.special, role) for role in ROLE_NAMES}
    differ = [f"tokenizer {ROLE_NAMES[r]} id {theirs[r]} != model {ROLE_NAMES[r]} id {ours[r]}" for r in ROLE_NAMES
              if theirs[r] is not None and ours[r] is not None and theirs[r] != ours[r]]
    if differ:
        raise CheckpointError(f"the tokenizer in {str(tokenizer_path)!r} does not match the model in "
                              f"{str(model_path)!r}: {', '.join(differ)}; use the model's own tokenizer (--tokenizer)")
    missing = [f"{ROLE_NAMES[r]} id {ours[r]}" for r in ROLE_NAMES if ours[r] is not None and ours[r] >= n]
    if missing:
        raise CheckpointError(f"the tokenizer in {str(tokenizer_path)!r} does not match the model in "
                              f"{str(model_path)!r}: the model's {', '.join(missing)} "
                              f"{'is not a token' if len(missing) == 1 else 'are not tokens'} of the tokenizer "
                              f"({n} tokens); use the model's own tokenizer (--tokenizer)")


@dataclass(frozen=True)
class ModelHandle:
    """A loaded model with everything a command needs next to it (`open_model`)."""

    source: ModelSource
    """What was opened, resolved: the local folder, the device checked, the dtype's name."""
    model: DSLModel | Backbone
    tokenizer: Any
    special: SpecialTokens
    """The model's special token ids (mask, EOS, padding, ...)."""
    context: int | None
    """Longest prompt + response the model accepts (None: unbounded)."""
    device: torch.device
    dtype: torch.dtype

    @property
    def path(self) -> Path:
        """The model's local folder."""
        return Path(cast(str, self.source.path))


@dataclass(frozen=True)
class ResolvedSource:
    """A `ModelSource` with what can be checked before loading settled (`resolve`): `open_model` takes it as it is,
    so a command that needs the resolved settings before loading (to lock its output) resolves only once."""

    source: ModelSource
    """The source with the device checked, the dtype's name ('auto' resolved) and the local model folder."""
    dtype: torch.dtype
    """The torch dtype `source.dtype` names."""


def resolve(source: ModelSource | ResolvedSource) -> ResolvedSource:
    """`source` with what can be checked before loading settled: the device (it exists here), the dtype ('auto'
    resolved) and the model folder (a hub id downloaded only with `allow_download`). A `ResolvedSource` is
    returned as it is."""
    if isinstance(source, ResolvedSource):
        return source
    resolved, dtype = _resolve(source)
    return ResolvedSource(resolved, dtype)


def resolve_source(source: ModelSource | ResolvedSource) -> ModelSource:
    """`resolve(source).source`: the settled `ModelSource`. Idempotent."""
    return resolve(source).source


def _resolve(source: ModelSource) -> tuple[ModelSource, torch.dtype]:
    from .backbones import resolve_model_path

    if source.path is None:
        raise ValueError("no model: pass --model FOLDER (a DSL checkpoint or a backbone folder)")
    device = check_device(source.device or default_device())
    dtype = resolve_dtype(source.dtype, device)
    path = str(resolve_model_path(source.path, allow_download=source.allow_download))
    return source.replace(path=path, device=device, dtype=str(dtype).removeprefix("torch.")), dtype


def open_model(source: ModelSource | ResolvedSource, *, chat_template: bool = True, backbone_only: bool = False,
               special: SpecialTokens | None = None, tokenizer_optional: bool = False) -> ModelHandle:
    """Open a model as every command does: resolve the source (`resolve`; a `ResolvedSource` is used as it is),
    set the thread count when given, read and check the tokenizer (its chat template rendered once when
    `chat_template`), load the model (a DSL checkpoint, the released layout only with `assume_released`, or a bare
    backbone), refuse a tokenizer that is not the model's (`check_vocabulary`: more tokens than the model has, or
    special ids that differ), and quantize it when asked. Each file of the model folder is read once
    (`checkpoint.CheckpointFolder`), and device and dtype are resolved once; the handle carries what every consumer
    reuses (the context limit included).

    `backbone_only`: a DSL checkpoint's backbone alone (`load_model`). `special`: the model's special token ids when
    the caller knows them (default: read from the folder). `tokenizer_optional`: a tokenizer folder without
    vocabulary files is allowed, and the handle's `tokenizer` is then None (`convert` copies whatever tokenizer files
    a backbone has; the toy world's shipped model has its tokenizer built from the world)."""
    resolved = resolve(source)
    source, dtype = resolved.source, resolved.dtype
    if source.threads is not None and source.threads != torch.get_num_threads():  # the CLI's main set it already
        from ..runtime.environment import set_threads

        set_threads(source.threads)
    path = cast(str, source.path)
    tokenizer_path = source.tokenizer or path
    with CheckpointFolder(path) as ckpt, opened(ckpt if tokenizer_path == path else tokenizer_path) as tok_files:
        vocabulary = _check_tokenizer_files(tok_files) if tok_files.path.is_dir() else None
        tokenizer = None if tokenizer_optional and vocabulary == [] else \
            _load_tokenizer(tok_files, vocabulary, chat_template=chat_template)
        model = _load_checked(ckpt, dtype=dtype, device=cast(str, source.device), special=special,
                              assume_released=source.assume_released, backbone_only=backbone_only)
    if tokenizer is not None:
        check_vocabulary(tokenizer, model, tokenizer_path=tokenizer_path, model_path=path)
    if source.quantize != "none":
        from .quantize import quantize_backbone

        quantize_backbone(model, source.quantize)
    return ModelHandle(source=source, model=model, tokenizer=tokenizer, special=model.special,
                       context=context_limit(model), device=torch.device(cast(str, source.device)), dtype=dtype)


def special_spellings(tokenizer: Any) -> list[str]:
    """The text spellings of the tokenizer's special and added tokens, longest first (what a tokenizer would turn
    into control tokens if it met them in text)."""
    found = set(getattr(tokenizer, "all_special_tokens", None) or [])
    with contextlib.suppress(AttributeError, TypeError):
        found |= set(tokenizer.get_added_vocab())
    return sorted((t for t in found if isinstance(t, str) and t), key=len, reverse=True)


def _encode_text(tokenizer: Any, text: str, *, allow_special_tokens: bool) -> list[int]:
    """`text` as ids without added BOS/EOS; special-token spellings inside it stay text unless allowed."""
    if allow_special_tokens:
        return list(tokenizer(text, add_special_tokens=False)["input_ids"])
    ids = list(tokenizer(text, add_special_tokens=False, split_special_tokens=True)["input_ids"])
    control = set(getattr(tokenizer, "all_special_ids", None) or [])
    if control.intersection(ids):  # a vocabulary (word-level) that maps the spelling itself to the control token
        unk = getattr(tokenizer, "unk_token_id", None)
        if unk is None:
            names = tokenizer.convert_ids_to_tokens(sorted(control.intersection(ids)))
            raise ValueError(f"the prompt text spells special tokens {names} that this tokenizer's vocabulary cannot "
                             f"encode as text; remove them or allow special tokens")
        ids = [unk if i in control else i for i in ids]
    return ids


def encode_messages(tokenizer: Any, messages: Sequence[dict[str, str]], *, chat_template: bool = True,
                    allow_special_tokens: bool = False) -> list[int]:
    """Chat messages (`[{"role", "content"}, ...]`) as prompt ids, ending with the assistant's generation prompt.

    With a chat template, the template's own markers (BOS, role headers, end-of-turn) are control tokens, and the
    message contents are encoded as text: a special-token spelling inside a content (a forged role marker, a
    `<|mask|>`) stays text unless `allow_special_tokens`. Contents without such spellings encode exactly as the
    template rendered and tokenised in one piece. Without a template (or `chat_template=False`) there must be one
    message, encoded as plain text."""
    if not messages:
        raise ValueError("messages is empty; expected at least one {'role', 'content'} message")
    contents: list[Any] = [m.get("content") for m in messages]  # all str after the check below
    if not all(isinstance(c, str) for c in contents):
        raise ValueError("every message needs a string 'content'")
    if not (chat_template and getattr(tokenizer, "chat_template", None)):
        if len(messages) != 1:
            raise ValueError(f"{len(messages)} messages need a chat template, and this tokenizer has none "
                             f"(or it was turned off); send one message")
        return _encode_text(tokenizer, contents[0], allow_special_tokens=allow_special_tokens)
    render = partial(tokenizer.apply_chat_template, add_generation_prompt=True, tokenize=False)
    spellings = special_spellings(tokenizer)
    if allow_special_tokens or not any(sp in c for c in contents for sp in spellings):
        return list(tokenizer(render(list(messages)), add_special_tokens=False)["input_ids"])
    # Render with a neutral placeholder per content, then encode the template's pieces with their control tokens
    # and each content as text. Templates may trim contents: match the real rendering to find which form was used.
    nonce = secrets.token_hex(8)
    marks = [f"DSLLLADACONTENT{i}X{nonce}" for i in range(len(messages))]
    neutral = render([{**m, "content": mk} for m, mk in zip(messages, marks, strict=True)])
    real = render(list(messages))
    pieces: list[tuple[str, bool]] = []  # (text, is_content)
    rest = neutral
    for mk, c in zip(marks, contents, strict=True):
        if rest.count(mk) != 1:
            raise ValueError("the chat template repeats or drops a message's content; cannot encode it safely "
                             "(pass allow_special_tokens to encode the spellings as control tokens)")
        head, _, rest = rest.partition(mk)
        pieces.append((head, False))
        pieces.append((c, True))
    pieces.append((rest, False))
    for form in (lambda c: c, str.strip):
        if "".join(form(t) if is_c else t for t, is_c in pieces) == real:
            pieces = [(form(t) if is_c else t, is_c) for t, is_c in pieces]
            break
    else:
        raise ValueError("the chat template transforms message contents in a way that cannot be undone; cannot "
                         "encode special-token spellings in them as text (pass allow_special_tokens to allow them)")
    ids: list[int] = []
    for text, is_content in pieces:
        if text:
            ids += _encode_text(tokenizer, text, allow_special_tokens=not is_content)
    return ids


def encode_prompt(tokenizer: Any, text: str, *, chat_template: bool = True, allow_special_tokens: bool = False) -> list[int]:
    """One prompt as a single user turn of the chat template (when the tokenizer has one and `chat_template`),
    encoded without adding special tokens again (the template already holds BOS), as LLaDA-Instruct's evaluation.
    Special-token spellings in the prompt stay text unless `allow_special_tokens` (see `encode_messages`)."""
    return encode_messages(tokenizer, [{"role": "user", "content": text}], chat_template=chat_template,
                           allow_special_tokens=allow_special_tokens)



def check_prompt_texts(prompts: Sequence[str]) -> None:
    """Refuse empty (or whitespace-only) prompts up front, naming the first few, and a prompt that is not text
    (a lone surrogate: an invalid UTF-8 byte on the command line, or a ``\\ud800`` escape)."""
    empty = [i for i, p in enumerate(prompts) if not isinstance(p, str) or not p.strip()]
    if empty:
        which = f"prompt {empty[0]} is" if len(empty) == 1 else \
            f"prompts {', '.join(map(str, empty[:5]))}{' ...' if len(empty) > 5 else ''} are"
        raise ValueError(f"{which} empty (counting from 0 in the order given); every prompt needs some text")
    for i, p in enumerate(prompts):
        bad = not_text(p)
        if bad:
            raise ValueError(f"prompt {i} (counting from 0 in the order given) is not valid text: {bad}")



def check_prompt_lengths(encoded: Sequence[Sequence[int]], *, context: int | None, gen_length: int) -> None:
    """Before any sampling: every encoded prompt + gen_length must fit the context; name the prompt and by how much
    it is too long."""
    if context is None:
        return
    too_long = [(i, len(e)) for i, e in enumerate(encoded) if len(e) + gen_length > context]
    if not too_long:
        return
    i, n = max(too_long, key=lambda t: t[1])
    others = f" ({len(too_long)} prompts are too long; this is the longest)" if len(too_long) > 1 else ""
    fix = f"shorten it by at least {n + gen_length - context} tokens"
    if n < context:
        fix += f", or reduce --gen-length to at most {context - n}"
    raise ValueError(f"prompt {i} is too long: {n} tokens as encoded (chat template included) + gen_length "
                     f"{gen_length} = {n + gen_length} tokens exceeds the model's context of {context} by "
                     f"{n + gen_length - context}{others}; {fix}")



def longest_token_chars(tokenizer: Any) -> int | None:
    """The most characters of text one token of `tokenizer` can stand for: the longest spelling in its vocabulary
    (added tokens included); None when the tokenizer exposes no vocabulary."""
    try:
        vocab = tokenizer.get_vocab()
    except (AttributeError, TypeError, NotImplementedError):
        return None
    return max((len(t) for t in vocab if isinstance(t, str)), default=0) or None


def check_prompt_chars(prompts: Sequence[str], tokenizer: Any, *, context: int | None, gen_length: int) -> None:
    """Before tokenising: refuse a prompt that cannot fit the context whatever its tokens, because even if every
    token were the longest of the vocabulary (`longest_token_chars`) it would need more than the context leaves
    after gen_length (a multi-megabyte line is refused at once instead of after a long, memory-hungry encode).
    Assumes the tokenizer drops no characters; `check_prompt_lengths` still checks the exact count."""
    chars = longest_token_chars(tokenizer)
    if context is None or chars is None:
        return
    room = context - gen_length
    if room < 1:
        raise ValueError(f"gen_length {gen_length} exceeds the model's context of {context}, which leaves no room for "
                         f"a prompt; reduce --gen-length to at most {context - 1}")
    for i, p in enumerate(prompts):
        least = -(-len(p) // chars)
        if least > room:
            raise ValueError(f"prompt {i} is too long: its {len(p):,} characters are at least {least:,} tokens (no "
                             f"token of this tokenizer spells more than {chars} characters), and the model's context "
                             f"of {context} leaves {room} tokens after gen_length {gen_length}; shorten it")


def _prompt_of(obj: Any, field: str, where: str) -> str:
    if isinstance(obj, str):
        text, what = obj, "the string"
    elif isinstance(obj, dict) and isinstance(obj.get(field), str):
        text, what = cast(str, obj[field]), f"field {field!r}"
    else:
        raise ValueError(f"{where}: expected a JSON object with a string field {field!r} (see --prompt-field)")
    bad = not_text(text)
    if bad:
        raise ValueError(f"{where}: {what} is not valid text: {bad}")
    return text


MAX_PROMPT_LINE_BYTES = 4 << 20
"""Longest line of a prompts file (4 MiB): a prompt must fit a model's context, and the longest supported context
(131,072 tokens, `config.MAX_GEN_LENGTH`) at 32 bytes per token is this much; a longer line cannot be a prompt."""
MAX_PROMPTS = 1_000_000
"""Most prompts (and, x10, most lines) one prompts file may hold; split a larger job into several files."""
MAX_JSON_PROMPTS_BYTES = 256 << 20
"""Largest .json prompts file (read whole, as one JSON array); use .jsonl (read line by line) for more."""


def _lines(f: BinaryIO, path: Path) -> Iterator[tuple[int, str]]:
    """(line number, text) of a binary file, read line by line; refuses a line longer than MAX_PROMPT_LINE_BYTES
    (a file without newlines, such as /dev/zero, is refused after that many bytes) and more than 10 x MAX_PROMPTS
    lines, and names a line that is not UTF-8."""
    for n in range(1, 10 * MAX_PROMPTS + 2):
        raw = f.readline(MAX_PROMPT_LINE_BYTES + 1)
        if not raw:
            return
        if n > 10 * MAX_PROMPTS:
            raise ValueError(f"--prompts-file {str(path)!r} has more than {10 * MAX_PROMPTS:,} lines; split it into "
                             f"several files")
        if len(raw) > MAX_PROMPT_LINE_BYTES and not raw.endswith(b"\n"):
            raise ValueError(f"{path}:{n}: line longer than {MAX_PROMPT_LINE_BYTES:,} bytes (no prompt that long fits "
                             f"any model's context); is {str(path)!r} a prompts file?")
        try:
            yield n, raw.decode("utf-8").rstrip("\r\n")
        except UnicodeDecodeError as e:
            raise ValueError(f"{path}:{n}: not UTF-8 text ({e}); expected a .jsonl, .json or .txt prompts file") from None


def read_prompts(path: str | Path, field: str = "prompt") -> list[str]:
    """Prompts from a file, by suffix: `.jsonl` (one JSON object per line with a string `field`, or a JSON
    string), `.json` (a JSON array of strings or of such objects), anything else plain text (one per line;
    blank lines skipped). Read line by line with bounded lines and counts (`MAX_PROMPT_LINE_BYTES`,
    `MAX_PROMPTS`; a .json file at most `MAX_JSON_PROMPTS_BYTES`). Errors name the file and line."""
    path = Path(path)
    if path.is_dir():
        raise ValueError(f"--prompts-file {str(path)!r} is a folder; expected a .jsonl, .json or .txt file")
    with open(path, "rb") as f:
        if path.suffix == ".json":
            return _read_json_prompts(f, path, field)
        out: list[str] = []
        for n, ln in _lines(f, path):
            if not ln.strip():
                continue
            if path.suffix == ".jsonl":
                try:
                    obj = json.loads(ln)
                except json.JSONDecodeError as e:
                    raise ValueError(f"{path}:{n}: not valid JSON ({e.msg}, column {e.colno}); a .jsonl prompts file "
                                     f"holds one JSON object per line") from None
                ln = _prompt_of(obj, field, f"{path}:{n}")
            out.append(ln)
            if len(out) > MAX_PROMPTS:
                raise ValueError(f"--prompts-file {str(path)!r} holds more than {MAX_PROMPTS:,} prompts; split it "
                                 f"into several files")
        return out


def _read_json_prompts(f: BinaryIO, path: Path, field: str) -> list[str]:
    data = f.read(MAX_JSON_PROMPTS_BYTES + 1)
    if len(data) > MAX_JSON_PROMPTS_BYTES:
        raise ValueError(f"--prompts-file {str(path)!r} is larger than {MAX_JSON_PROMPTS_BYTES >> 20} MiB; a .json "
                         f"file is read whole, so use .jsonl (one prompt object per line) for a file this large")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"--prompts-file {str(path)!r} is not UTF-8 text ({e}); expected .jsonl, .json or .txt") from None
    try:
        items = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}:{e.lineno}: not valid JSON ({e.msg}, column {e.colno}); a .json prompts file "
                         f"holds one JSON array of strings or of objects with a {field!r} field") from None
    if not isinstance(items, list):
        raise ValueError(f"{path}: a .json prompts file must hold a JSON array (of strings or of objects with a "
                         f"{field!r} field), got a {type(items).__name__}; or use .jsonl (one object per line) "
                         f"or .txt (one prompt per line)")
    if len(items) > MAX_PROMPTS:
        raise ValueError(f"--prompts-file {str(path)!r} holds more than {MAX_PROMPTS:,} prompts; split it")
    return [_prompt_of(x, field, f"{path}: item {n}") for n, x in enumerate(items)]
