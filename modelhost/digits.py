"""Whether a text is a number written in ASCII digits: what version numbers, counts and ids are here.

str.isdigit() also accepts '²' (which int() refuses: a ValueError where a 400 was meant) and '٣' (which int()
reads as 3: a version no client or Triton layout means); a name or a header decoded as latin-1 can hold either.
"""

from __future__ import annotations


def is_digits(text: str) -> bool:
    """A non-empty run of 0-9 and nothing else."""
    return text.isascii() and text.isdigit()
