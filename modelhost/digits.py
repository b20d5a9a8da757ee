"""Whether a text is a number written in ASCII digits: what version numbers, counts and ids are here.

str.isdigit() also accepts '²' (which int() refuses: a ValueError where a 400 was meant) and '٣' (which int()
reads as 3: a version no client or Triton layout means); a name or a header decoded as latin-1 can hold either.
And int() refuses a text of more than 4,300 digits (CPython's guard against quadratic conversion): past 19 digits
(int64's width) no number here means anything, so a longer text is not one.
"""

from __future__ import annotations

MAX_DIGITS = 19


def is_digits(text: str) -> bool:
    """A run of 1 to MAX_DIGITS of 0-9 and nothing else."""
    return 0 < len(text) <= MAX_DIGITS and text.isascii() and text.isdigit()
