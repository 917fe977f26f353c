"""The planning tests' shared fixture: the auto checks committed under docs/benchmarks/ (scripts/check_auto.py's
auto_check.json of each case), read one way for every test that replays them."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "docs" / "benchmarks"


@dataclass(frozen=True)
class AutoCheck:
    """One case of an auto check: its folder, the check's record, and its runs by fraction (at auto, one step below
    and, where that trained, two below: outcome, NVML's used, run_dir, as they ran)."""

    case_dir: Path
    check: dict
    runs: dict[float, dict]

    def cfg(self, built):
        """The case's config: its recipe with its overrides."""
        from overrides import apply_overrides

        return apply_overrides(built(self.check["recipe"]), self.check["overrides"])

    def run_folder(self, run: dict) -> Path:
        """Where one of the check's runs is committed: its folder under the case's, named as it ran (run_dir)."""
        return self.case_dir / Path(run["run_dir"]).name


def _read_auto_checks(folder_glob: str) -> list[AutoCheck]:
    return [AutoCheck(case_dir=path.parent, check=check,
                      runs={check[k]["fraction"]: check[k] for k in ("at_auto", "below", "two_below") if check.get(k)})
            for path in sorted(BENCHMARKS.glob(f"{folder_glob}/*/auto_check.json"))
            for check in json.loads(path.read_text())]


@pytest.fixture
def auto_checks():
    """auto_checks(folder_glob) -> every AutoCheck under docs/benchmarks/<folder_glob>/*/auto_check.json, in order."""
    return _read_auto_checks
