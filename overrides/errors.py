"""Override errors: each names the override as typed, the key, what is wrong and what would work."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# An override can be as long as the user's shell allows: the report shows its start and end, so a
# 100,000-character value does not bury the other errors of the command.
SHOWN_CHARS = 240


def shown(text: str, limit: int = SHOWN_CHARS) -> str:
    """``text`` for a report: control and other unprintable characters escaped (a NUL or newline would
    hide or break the line), and the middle of a very long text left out with its length said."""
    text = "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in str(text))
    if len(text) <= limit:
        return text
    keep = (limit - 30) // 2
    return f"{text[:keep]}...({len(text)} characters)...{text[-keep:]}"


@dataclass(frozen=True)
class OverrideError:
    text: str  # the override as the user typed it
    key: str
    message: str
    fix: str = ""
    index: int = 0  # the override's position in the command (the report follows the command's order)

    def format(self) -> str:
        text = str(self.text)
        # spaces at either end (or nothing at all) are shown in quotes, so they are seen
        lines = [shown(text) if text and text == text.strip() else repr(shown(text)),
                 f"    {shown(self.key, 120) or '(no key)'}: {shown(self.message, 600)}"]
        if self.fix:
            lines.append(f"    fix: {shown(self.fix, 600)}")
        return "\n".join(lines)


class OverrideErrors(ValueError):
    """All the override errors of one command, reported together. ``applied``: a copy of the config with
    every other override of the command applied (None where there is none), for validating the rest."""

    def __init__(self, errors: list[OverrideError], applied: Any = None):
        super().__init__(f"{len(errors)} invalid override{'s' if len(errors) != 1 else ''}")
        self.errors = list(errors)
        self.applied = applied

    def format(self) -> str:
        head = f"Invalid override{'s' if len(self.errors) != 1 else ''} ({len(self.errors)}):"
        return "\n".join([head] + ["  " + e.format().replace("\n", "\n  ") for e in self.errors])

    def __str__(self) -> str:
        return self.format()
