"""Reading Linux /proc files."""

from __future__ import annotations

from pathlib import Path


def proc_kib(field: str, path: str = "/proc/self/status") -> int | None:
    """A ``Field:  N kB`` line of a Linux /proc file (this process's status by default), or None."""
    try:
        for line in Path(path).read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except OSError:
        pass
    return None
