"""Fixtures of tests/runtime/."""

from __future__ import annotations

import itertools
import subprocess
import sys
from pathlib import Path

import pytest

STREAM_CPU_CHECK = Path(__file__).with_name("stream_cpu_check.py")


class StreamScenarios:
    """stream_cpu_check.py's scenarios (the stream engine on a CPU stand-in for the GPU), run once per kind (ranks,
    resume) in a process of their own, and what each printed."""

    def __init__(self) -> None:
        self._done: dict[str, subprocess.CompletedProcess] = {}

    def run(self, kind: str) -> subprocess.CompletedProcess:
        if kind not in self._done:
            self._done[kind] = subprocess.run([sys.executable, str(STREAM_CPU_CHECK), kind], capture_output=True,
                                              text=True, timeout=900)
        return self._done[kind]

    def line(self, kind: str, label: str) -> str:
        """The one line the run printed for the scenario ``label``."""
        done = self.run(kind)
        lines = [line for line in done.stdout.splitlines() if f"] {label}: " in line]
        assert len(lines) == 1, done.stdout[-4000:] + done.stderr[-4000:]
        return lines[0]

    def assert_passed(self, kind: str, label: str) -> None:
        line = self.line(kind, label)
        assert line.startswith("OK ") and line.endswith(": passed"), line

    def assert_caught(self, kind: str, label: str, check: str) -> str:
        """A broken scenario ended as it should, failed by ``check``; returns its line."""
        line = self.line(kind, label)
        assert line.startswith("OK ") and f"check: {check}:" in line, line
        return line

    def assert_engine_resumes(self, kind: str, label: str) -> None:
        """One of stream_cpu_scenarios.py's ENGINE_RESUME_SCENARIOS in ``kind``'s run: a correct one passed, the
        load that does nothing was caught at the first forward after it."""
        if "broken" in label:
            line = self.assert_caught(kind, label, "resume-forward-weights")
            assert "forward 1 after the load" in line, line
        else:
            self.assert_passed(kind, label)

    def assert_all_ok(self, kind: str) -> None:
        done = self.run(kind)
        assert done.returncode == 0 and done.stdout.rstrip().endswith("ALL OK"), \
            done.stdout[-4000:] + done.stderr[-4000:]


# the labels of stream_cpu_scenarios.py's ENGINE_RESUME_SCENARIOS (the exact and the delayed engine's), which this
# process does not import: importing it installs the CPU stand-in for the GPU
ENGINE_RESUMES = ["2 ranks, fraction 1, Megatron's load into a new model and optimizer",
                  "2 ranks, fraction 1, Megatron's load into the running optimizer",
                  "2 ranks, fraction 1, Megatron's load into the running optimizer, an update pending",
                  "2 ranks, broken: no-load"]


def pytest_generate_tests(metafunc):
    if "engine_resume_label" in metafunc.fixturenames:  # a test of each of ENGINE_RESUMES
        metafunc.parametrize("engine_resume_label", ENGINE_RESUMES)


@pytest.fixture(scope="session")
def stream_scenarios() -> StreamScenarios:
    return StreamScenarios()


# A stand-in CUDA stream for the copy threads' tests (test_gradient_copies.py, test_weight_copies.py): it numbers each
# event it records and logs what was recorded and waited for, in order. A copy on the host has finished when ``copy_``
# returns, so the log says what a GPU would have had enqueued and waited for, and when.
class LoggedEvent:
    def __init__(self, log: list, number: int) -> None:
        self.log, self.number = log, number

    def synchronize(self) -> None:
        self.log.append(("wait", self.number))


class LoggedStream:
    def __init__(self) -> None:
        self.log: list = []
        self._numbers = itertools.count()

    def record_event(self, event=None) -> LoggedEvent:
        recorded = LoggedEvent(self.log, next(self._numbers))
        self.log.append(("record", recorded.number))
        return recorded


@pytest.fixture
def logged_stream() -> LoggedStream:
    return LoggedStream()
