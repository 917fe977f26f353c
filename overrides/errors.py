"""Override errors: each names the override as typed, the key, what is wrong and what would work."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class OverrideError:
    text: str  # the override as the user typed it
    key: str
    message: str
    fix: str = ""

    def format(self) -> str:
        lines = [f"{self.text}", f"    {self.key}: {self.message}"]
        if self.fix:
            lines.append(f"    fix: {self.fix}")
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
