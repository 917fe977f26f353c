"""Which lines of a log a regular expression matches, without searching every line with it: a log of a long run
holds hundreds of thousands of iteration lines, and each pattern of the rule table searched on each line took
~18 s for 200,000 lines. Each pattern is searched only on the lines that hold a string every match of it contains
(read from the pattern's own parse, so no pattern needs writing twice); a pattern where no such string can be
told is searched on every line, as before."""

from __future__ import annotations

import re
from bisect import bisect_right
from collections.abc import Sequence
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


class LineSearch:
    """The lines of one log, and the line indexes where a pattern matches."""

    def __init__(self, texts: Sequence[str]):
        self.texts = texts
        self.searches = 0  # regular-expression searches made on single lines, all patterns together
        self.joined = "\n".join(texts)
        self.starts, at = [], 0
        for text in texts:
            self.starts.append(at)
            at += len(text) + 1

    def candidates(self, pattern: str) -> list[int] | range:
        """Indexes of the lines that may match ``pattern``: those holding one of its required strings, ascending."""
        strings = required_strings(pattern)
        if not strings:
            return range(len(self.texts))
        found: set[int] = set()
        for string in strings:
            at = self.joined.find(string)
            while at >= 0:
                line = bisect_right(self.starts, at) - 1
                found.add(line)
                # the next occurrence on a later line: this line is a candidate already
                next_line_at = self.starts[line + 1] if line + 1 < len(self.starts) else len(self.joined)
                at = self.joined.find(string, max(at + 1, next_line_at))
        return sorted(found)

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
