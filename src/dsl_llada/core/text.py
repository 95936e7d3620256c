"""Whether a string is text: a prompt with a lone surrogate (an invalid byte of the command line) is refused."""

from __future__ import annotations


def not_text(text: str) -> str | None:
    """Why `text` cannot be encoded as UTF-8 (it holds a lone surrogate), or None. A surrogate U+DC80..U+DCFF is
    how Python spells an invalid byte of the command line."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        code = ord(text[e.start])
        origin = (f"the invalid UTF-8 byte 0x{code - 0xDC00:02X}" if 0xDC80 <= code <= 0xDCFF
                  else f"a \\u{code:04x} escape")
        return (f"character {e.start} is the lone surrogate U+{code:04X} ({origin}), which is not text; "
                f"give the prompt as UTF-8 text")
    return None
