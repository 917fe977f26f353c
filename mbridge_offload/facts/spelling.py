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


# Characters that look like ASCII ones but are not, as text pasted from a document, a chat or a web page brings them:
# dashes and minus signs, typographic quotes, dots, spaces that are not spaces, and the Cyrillic and Greek letters
# drawn like Latin ones. Invisible ones (zero-width, byte-order mark, direction marks) stand for nothing.
_LOOKALIKES = {
    **dict.fromkeys("\u2010\u2011\u2012\u2013\u2014\u2015\u2212\ufe58\ufe63\uff0d", "-"),
    **dict.fromkeys("\u2018\u2019\u201a\u201b\u2032\u02bc\uff07", "'"),
    **dict.fromkeys("\u201c\u201d\u201e\u201f\u2033\u00ab\u00bb\uff02", '"'),
    **dict.fromkeys("\u00a0\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a\u202f\u205f\u3000",
                    " "),
    **dict.fromkeys("\u200b\u200c\u200d\u2060\ufeff\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068"
                    "\u2069", ""),
    **dict.fromkeys("\u2024\u2027\u00b7\uff0e\u3002", "."),
    **dict.fromkeys("\u2550\uff1d", "="),
    **dict(zip("\u0430\u0435\u043e\u0440\u0441\u0443\u0445\u0456\u0458\u0455\u0410\u0412\u0415\u041a\u041c\u041d"
               "\u041e\u0420\u0421\u0422\u0425\u0406\u0408\u0405",
               "aeopcyxijsABEKMHOPCTXIJS")),
    **dict(zip("\u03bf\u039f\u0399\u0391\u0392\u0395\u0396\u0397\u039a\u039c\u039d\u03a1\u03a4\u03a7\u03a5",
               "oOIABEZHKMNPTXY")),
}


def ascii_lookalike(char: str) -> str | None:
    """The ASCII text ``char`` is drawn like ('' for an invisible one), or None where it stands for nothing ASCII
    (a letter of its own, such as é)."""
    import unicodedata

    if char in _LOOKALIKES:
        return _LOOKALIKES[char]
    folded = unicodedata.normalize("NFKC", char)  # fullwidth forms: ５ -> 5, ｔ -> t
    return folded if folded != char and folded.isascii() and folded.isprintable() else None


def describe_char(char: str) -> str:
    """``'–' (U+2013 EN DASH)``: a character a report can name even where it cannot be told by eye."""
    import unicodedata

    shown = char if char.isprintable() and not char.isspace() else char.encode("unicode_escape").decode("ascii")
    return f"'{shown}' (U+{ord(char):04X} {unicodedata.name(char, 'unnamed')})"
