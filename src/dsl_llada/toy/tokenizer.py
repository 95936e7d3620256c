"""Word-level Hugging Face tokenizer for the toy world.

A ``tokenizers`` WordLevel model with a whitespace-split pre-tokenizer, wrapped
in :class:`transformers.PreTrainedTokenizerFast`.  Token ids equal
``world.token_to_id`` (words first, special tokens last).  No BOS/EOS is added
automatically; prompts are rendered explicitly (:func:`dsl_llada.toy.tasks.render_prompt`).
Decoding joins tokens with single spaces.  It saves with ``save_pretrained``
and reloads offline with ``PreTrainedTokenizerFast.from_pretrained(dir)`` or
``AutoTokenizer.from_pretrained(dir)``.
"""

from __future__ import annotations

from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from ..core.backbones.base import SpecialTokens
from . import words as W
from .tasks import CHAT_TEMPLATE
from .world import ToyWorld


def build_tokenizer(world: ToyWorld) -> PreTrainedTokenizerFast:
    """Build the world's word-level tokenizer (ids identical to ``world.token_to_id``)."""
    tk = Tokenizer(models.WordLevel(vocab=dict(world.token_to_id), unk_token=W.UNK))
    tk.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    # no decoder: `tokenizers` then joins decoded tokens with single spaces
    tok = PreTrainedTokenizerFast(
        tokenizer_object=tk,
        bos_token=W.BOS,
        eos_token=W.EOS,
        pad_token=W.EOS,
        unk_token=W.UNK,
        mask_token=W.MASK,
        additional_special_tokens=[W.EOT, W.START_HEADER, W.END_HEADER],
        clean_up_tokenization_spaces=False,
        model_max_length=1024,
        padding_side="right",
    )
    tok.chat_template = CHAT_TEMPLATE
    return tok


def special_ids(tokenizer: PreTrainedTokenizerFast) -> dict[str, int]:
    """Special token ids by role: mask, eos, eot, pad, bos, start_header, end_header, unk."""
    get = tokenizer.convert_tokens_to_ids
    return {"mask": get(W.MASK), "eos": get(W.EOS), "eot": get(W.EOT), "pad": tokenizer.pad_token_id,
            "bos": get(W.BOS), "start_header": get(W.START_HEADER), "end_header": get(W.END_HEADER),
            "unk": get(W.UNK)}


def special_tokens(tokenizer: PreTrainedTokenizerFast) -> SpecialTokens:
    """The `SpecialTokens` of a model of this world (mask, eos, eot, pad, bos from the tokenizer, by name)."""
    s = special_ids(tokenizer)
    return SpecialTokens(mask=s["mask"], eos=s["eos"], eot=s["eot"], pad=s["pad"], bos=s["bos"])
