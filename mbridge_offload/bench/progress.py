"""Where a long sweep or benchmark is: one line per run, "run i of n", the run's name, and an estimate of the
time left from the runs already finished (their median wall time times the runs left). Runs kept from an
earlier invocation (--resume) count as done and take no time."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field


def _duration(seconds: float) -> str:
    seconds = round(seconds)
    if seconds < 60:
        return f"{seconds} s"
    minutes, seconds = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes} min {seconds:02d} s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes:02d} min"


@dataclass
class RunProgress:
    """Prints ``label run i/n: name ...`` before a run and the outcome with the time left after it."""

    label: str  # "[sweep]", "[bench]"
    total: int
    done: int = 0
    walls: list[float] = field(default_factory=list)  # seconds of the runs this invocation trained

    def time_left(self) -> str:
        left = self.total - self.done
        if left <= 0:
            return "all runs done"
        if not self.walls:
            return f"{left} run{'s' * (left > 1)} left, time left known after the first run"
        return f"{left} run{'s' * (left > 1)} left, about {_duration(statistics.median(self.walls) * left)}"

    def starting(self, name: str) -> None:
        print(f"{self.label} run {self.done + 1}/{self.total}: {name} ...", flush=True)

    def finished(self, name: str, status: str, wall_s: float) -> None:
        self.done += 1
        self.walls.append(wall_s)
        print(f"{self.label} run {self.done}/{self.total}: {name}: {status} ({wall_s:.0f} s; {self.time_left()})",
              flush=True)

    def skipped(self, name: str, why: str) -> None:
        self.done += 1
        print(f"{self.label} run {self.done}/{self.total}: {name}: not run, {why} ({self.time_left()})", flush=True)

    def kept(self, name: str) -> None:
        self.done += 1
        print(f"{self.label} run {self.done}/{self.total}: {name}: kept from an earlier run ({self.time_left()})",
              flush=True)
