"""The diagnosis tests' shared fixture: a log written from lines into the test's own folder, and diagnose's answer
for one LOG argument, without Megatron unless a test asks for it (build_config=True)."""

from __future__ import annotations

from pathlib import Path

import pytest

from mbridge_offload.diagnosis import Diagnosis, Finding, diagnose


class LogDiagnoser:
    """write(lines) -> a log file; the instance called on a path -> its Diagnosis; findings / ids / only on top."""

    def __init__(self, folder: Path):
        self.folder = folder

    def write(self, lines: list[str], name: str = "log.txt") -> Path:
        """The lines as a log file named ``name`` in the test's folder, newline-terminated (written over)."""
        path = self.folder / name
        path.write_text("\n".join(lines) + "\n")
        return path

    def __call__(self, path: Path, build_config: bool = False) -> Diagnosis:
        [diagnosis] = self.runs(path, build_config)
        return diagnosis

    def runs(self, path: Path, build_config: bool = False) -> list[Diagnosis]:
        """One Diagnosis per run the log holds (a log appended to across restarts holds several)."""
        return diagnose([path], build_config=build_config)

    def findings(self, path: Path, build_config: bool = False) -> list[Finding]:
        return self(path, build_config).findings

    def ids(self, path: Path, build_config: bool = False) -> list[str]:
        return [finding.rule_id for finding in self.findings(path, build_config)]

    def only(self, path: Path, rule_id: str, build_config: bool = False) -> Finding:
        """The one finding of ``path``, which must be ``rule_id``."""
        found = self.findings(path, build_config)
        assert [finding.rule_id for finding in found] == [rule_id]
        return found[0]


@pytest.fixture
def diag(tmp_path) -> LogDiagnoser:
    return LogDiagnoser(tmp_path)
