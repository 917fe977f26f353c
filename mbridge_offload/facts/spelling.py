"""Did-you-mean: the words of a list closest to a mistyped one, for the override layer (keys) and the validator
(the fixed words a key admits)."""

from __future__ import annotations

import difflib
from typing import Iterable

# difflib is quadratic: a word longer than this is not compared letter by letter (nobody mistypes 200 letters)
LONGEST_COMPARED = 200


def close_words(word: str, choices: Iterable[str], n: int = 1, cutoff: float = 0.6) -> list[str]:
    """Up to ``n`` of ``choices`` closest to ``word`` (difflib's ratio at least ``cutoff``), best first; none for a
    word longer than LONGEST_COMPARED."""
    if len(word) > LONGEST_COMPARED:
        return []
    return difflib.get_close_matches(word, list(choices), n=n, cutoff=cutoff)
