"""Which lines of a log a regular expression matches, without searching every line with it: a log of a long run
holds hundreds of thousands of iteration lines, and each pattern of the rule table searched on each line took
~18 s for 200,000 lines. Each pattern is searched only on the lines that hold a string every match of it contains
(read from the pattern's own parse, so no pattern needs writing twice); a pattern where no such string can be
told is searched on every line, as before."""

from __future__ import annotations

import re
from bisect import bisect_right
from collections import Counter
from collections.abc import Iterable, Sequence
from functools import lru_cache

try:
    from re import _constants as _c, _parser as _p  # Python 3.11+
except ImportError:  # pragma: no cover
    import sre_constants as _c  # type: ignore[no-redef]
    import sre_parse as _p  # type: ignore[no-redef]


def _required(items) -> tuple[str, ...]:
    """Strings one of which every match of the parsed sequence ``items`` contains; () where none can be told."""
    candidates: list[tuple[str, ...]] = []
    run = ""
    for op, av in items:
        if op is _c.LITERAL:
            run += chr(av)
            continue
        if run:
            candidates.append((run,))
            run = ""
        if op is _c.SUBPATTERN and not (av[1] & re.IGNORECASE):
            candidates.append(_required(av[3]))
        elif op in (_c.MAX_REPEAT, _c.MIN_REPEAT) and av[0] >= 1:
            candidates.append(_required(av[2]))
        elif op is _c.BRANCH:
            branches = [_required(branch) for branch in av[1]]
            if all(branches):
                candidates.append(tuple(s for branch in branches for s in branch))
    if run:
        candidates.append((run,))
    candidates = [c for c in candidates if c]
    return max(candidates, key=lambda c: min(map(len, c)), default=())


@lru_cache(maxsize=None)
def required_strings(pattern: str) -> tuple[str, ...]:
    """Strings one of which every match of ``pattern`` contains (searched without flags); () where none can be
    told (a pattern that ignores case, or one made of classes and repeats only)."""
    try:
        parsed = _p.parse(pattern)
    except (re.error, AttributeError, TypeError):  # pragma: no cover
        return ()
    if parsed.state.flags & re.IGNORECASE:
        return ()
    return _required(parsed)


# Digits are read as 0 while finding the lines that hold a required string: the lines of a long run differ in their
# numbers only (an iteration line per step), so they become a few distinct lines, each searched once; a required
# string is read the same way, so its lines are found among them (with the few whose digits differ, which the
# pattern's own search then leaves out)
_DIGITS = str.maketrans("123456789", "000000000")
_DIGIT_BYTES = bytes.maketrans(b"123456789", b"000000000")


def _digits_as_0(text: str) -> str:
    """``text`` with its digits read as 0, through its bytes: str.translate of a text holding any non-ASCII
    character (a progress bar's block, a box drawing) takes ~100 times as long."""
    return text.encode("utf-8", "surrogatepass").translate(_DIGIT_BYTES).decode("utf-8", "surrogatepass")


ANCHOR_CHARS = 4  # the shortest anchor (below): shorter ones stop the pass at too many places
_SAMPLES, _SAMPLE_CHARS = 64, 4096  # where a log's characters are counted: evenly spaced slices of its distinct lines


def _char_counts(text: str) -> Counter[str]:
    """How often each character stands in ``text``, counted on evenly spaced slices of it (a long log's whole text
    would take longer to count than to search)."""
    if len(text) <= _SAMPLES * _SAMPLE_CHARS:
        return Counter(text)
    step = len(text) // _SAMPLES
    return Counter("".join(text[i: i + _SAMPLE_CHARS] for i in range(0, len(text), step)))


def _anchor(string: str, counts: Counter[str]) -> str:
    """The part of ``string`` a log is searched for: from its rarest character in that log (the first of equals)
    to its end, at least ANCHOR_CHARS long. The search stops at each place the anchor's first character stands,
    so the rarer that character, the fewer stops."""
    last = max(0, len(string) - ANCHOR_CHARS)
    start = min(range(last + 1), key=lambda k: counts[string[k]])
    return string[start:]


def _trie(strings: Iterable[str]) -> str:
    """One regular expression matching any of ``strings``: a tree of their characters, so each position of the text
    is tried character by character rather than string by string; at a position it matches the longest of them
    that starts there."""
    root: dict[str, dict] = {}
    for string in strings:
        node = root
        for char in string:
            node = node.setdefault(char, {})
        node[""] = {}

    def branch(node: dict[str, dict]) -> str:
        alternatives = [re.escape(char) + branch(child) for char, child in sorted(node.items()) if char]
        if not alternatives:
            return ""
        if "" in node:
            return "(?:" + "|".join(alternatives) + ")?"
        return alternatives[0] if len(alternatives) == 1 else "(?:" + "|".join(alternatives) + ")"

    return branch(root)


class LineSearch:
    """The lines of one log, and the line indexes where a pattern matches. The lines that hold each required string
    of the patterns given up front are found in one pass over the log's distinct lines (digits read as 0): a single
    regular expression of all those strings. A pattern not given up front costs a pass of its own."""

    def __init__(self, texts: Sequence[str], patterns: Iterable[str] = ()):
        self.texts = texts
        self.searches = 0  # regular-expression searches made on single lines, all patterns together
        self.passes = 0  # passes that find the lines holding required strings (each reads every distinct line)
        # each distinct line (digits as 0) once, and the indexes of the lines that read as it
        forms: dict[str, int] = {}
        self._form_lines: list[list[int]] = []
        for i, form in enumerate(_digits_as_0("\n".join(texts)).split("\n") if texts else ()):
            at = forms.setdefault(form, len(forms))
            if at == len(self._form_lines):
                self._form_lines.append([])
            self._form_lines[at].append(i)
        self._form_texts = list(forms)
        self._forms = "\n".join(self._form_texts)
        self._form_starts, at = [], 0
        for form in self._form_texts:
            self._form_starts.append(at)
            at += len(form) + 1
        self._rarity = _char_counts(self._forms)
        self._holding: dict[str, set[int]] = {}  # a required string (digits as 0): the distinct lines that hold it
        self._index({s.translate(_DIGITS) for pattern in patterns for s in required_strings(pattern)})

    def _index(self, strings: set[str]) -> None:
        """Which distinct lines hold each of ``strings`` (not indexed yet), in one pass. Each string is looked for by
        its anchor, its part from its rarest character on (as counted in this log), so that the pass stops only at
        the few places where a rare character stands; the lines holding an anchor that is not the whole string
        are then checked for the string itself. The anchors' tree is searched again from one character past each
        match's start, so overlapping occurrences are found too. A match is the longest anchor starting at its
        position; every anchor inside it is on that line as well (one that starts there and is shorter is its
        prefix)."""
        strings = {s for s in strings if s not in self._holding}
        if not strings:
            return
        self.passes += 1
        anchors = {s: _anchor(s, self._rarity) for s in strings}
        inside = {a: [b for b in set(anchors.values()) if b in a] for a in set(anchors.values())}
        holding: dict[str, set[int]] = {a: set() for a in inside}
        regex, text, starts, at = re.compile(_trie(inside)), self._forms, self._form_starts, 0
        while match := regex.search(text, at):
            form = bisect_right(starts, match.start()) - 1
            for a in inside[match.group()]:
                holding[a].add(form)
            at = match.start() + 1
        for s, a in anchors.items():
            self._holding[s] = holding[a] if a == s else {f for f in holding[a] if s in self._form_texts[f]}

    def candidates(self, pattern: str) -> list[int] | range:
        """Indexes of the lines that may match ``pattern``: those holding one of its required strings, ascending."""
        strings = {s.translate(_DIGITS) for s in required_strings(pattern)}
        if not strings:
            return range(len(self.texts))
        self._index(strings)
        forms = set().union(*(self._holding[s] for s in strings))
        if len(forms) == 1:
            return self._form_lines[forms.pop()]
        return sorted(i for form in forms for i in self._form_lines[form])

    def matches(self, pattern: str, regex: re.Pattern[str] | None = None) -> list[tuple[int, re.Match[str]]]:
        """(index, match) of each line ``pattern`` matches (re.search on each line alone), ascending."""
        regex = regex or re.compile(pattern)
        found = []
        for i in self.candidates(pattern):
            self.searches += 1
            if match := regex.search(self.texts[i]):
                found.append((i, match))
        return found

    def matching(self, pattern: str, regex: re.Pattern[str] | None = None) -> list[int]:
        """Indexes of the lines ``pattern`` matches, ascending."""
        return [i for i, _ in self.matches(pattern, regex)]
