"""Hugging Face tokenizer files for the trainer's file-less tokenizers ('bytes', 'ids'), so that every checkpoint a
run writes (and its `final/` folder) loads in `dsl-llada generate` like any other model folder.

- 'bytes': UTF-8 bytes are ids 0..255 (a byte-level BPE with no merges: every byte is one token); ids >= 256 are
  the model's special tokens (EOS, [MASK], ...) and named placeholders.
- 'ids': a document is whitespace-separated integer ids; the word-level vocabulary maps "i" to id i.

Both encode exactly as the trainer's own encoders (`components.resolve_tokenizer`), which a test checks.
"""

from __future__ import annotations

from ..core.backbones.base import SpecialTokens

__all__ = ["builtin_tokenizer"]


def _byte_chars() -> list[str]:
    """The printable stand-in character of each byte, as byte-level BPE tokenizers use (GPT-2's table)."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    table, extra = {}, 0
    for b in range(256):
        if b in printable:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return [table[b] for b in range(256)]


def _special_names(special: SpecialTokens) -> dict[int, str]:
    names = {special.mask: "<|mask|>", special.eos: "<|endoftext|>"}
    for role in ("eot", "bos", "pad"):
        i = getattr(special, role)
        if i is not None and i not in names:
            names[i] = f"<|{role}|>"
    return names


def builtin_tokenizer(kind: str, vocab_size: int, special: SpecialTokens):
    """A `PreTrainedTokenizerFast` equivalent to the trainer's 'bytes' or 'ids' encoder for a model of `vocab_size`."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    names = _special_names(special)
    if kind == "bytes":
        low = [i for i in names if i < 256]
        if low:
            raise ValueError(f"tokenizer='bytes' needs special ids >= 256 (bytes are 0..255); got {sorted(low)}")
        vocab = {c: b for b, c in enumerate(_byte_chars())}
        vocab.update({names.get(i, f"<|id_{i}|>"): i for i in range(256, vocab_size)})
        tk = Tokenizer(models.BPE(vocab=vocab, merges=[]))
        tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
        tk.decoder = decoders.ByteLevel()
    elif kind == "ids":
        vocab = {str(i): i for i in range(vocab_size)}
        tk = Tokenizer(models.WordLevel(vocab=vocab, unk_token=None))
        tk.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
        names = {i: str(i) for i in names}
    else:
        raise ValueError(f"builtin tokenizer {kind!r} is not valid; expected 'bytes' or 'ids'")
    roles = {"eos_token": names[special.eos], "mask_token": names[special.mask]}
    for role in ("bos", "pad"):
        i = getattr(special, role)
        if i is not None:
            roles[f"{role}_token"] = names[i]
    extra = [names[special.eot]] if special.eot is not None and special.eot not in (special.eos, special.mask) else []
    return PreTrainedTokenizerFast(tokenizer_object=tk, additional_special_tokens=extra,
                                   clean_up_tokenization_spaces=False, **roles)
