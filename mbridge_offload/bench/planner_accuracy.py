"""The memory planner against measurements: planned vs measured peak GPU and host memory of the runs under
benchmark folders (plan_offload.py --compare; docs/benchmarks/planner-accuracy.md).

A run folder is one training of run_recipe.py: its command (the first line of log.txt, as the sweep and the
checks write it) says the recipe and overrides, its summary.json what it used. The calibration folders
(CALIBRATION) set the planner's fitted constants or were used to check its activation model; the held-out ones
(HELDOUT) were measured after the planner was fixed and set nothing.
"""

from __future__ import annotations

import functools
import json
import re
import shlex
from pathlib import Path

# folders under docs/benchmarks/: the seventh session's held-out runs are calibration for the eleventh session's
# activation model, which was checked against them
CALIBRATION = ("dense-1b-sweep", "moe-proxy-sweep", "moe-proxy-sweep-deep", "oom-8b", "planner-heldout", "planner-auto",
               "alloc-conf/calibration")
HELDOUT = ("planner-heldout-2", "planner-auto-2", "planner-auto-3", "alloc-conf/heldout", "alloc-conf/shell-env",
           "alloc-conf/recipe-env", "planner-heldout-3", "planner-heldout-4", "planner-auto-4", "planner-auto-5",
           "smallest-trains", "planner-auto-moe", "planner-auto-7", "planner-auto-8", "planner-auto-moe-2")
REPEAT = re.compile(r"-repeat\d+$")  # a sweep's identical baseline runs after the first


def run_dirs(folder: Path) -> list[Path]:
    """The run folders under ``folder`` (a sweep's fraction-F, a check's auto and fraction-F), repeats left out."""
    found = {p.parent for p in folder.rglob("log.txt")}
    return sorted((d for d in found if not REPEAT.search(d.name)), key=str)


def run_command(run_dir: Path) -> tuple[str, list[str]]:
    """(recipe, overrides) of the run_recipe.py command at the top of the run's log.txt; for a sweep's run whose
    log does not start with it, the sweep's recipe and overrides with the fraction of the run's folder."""
    from mbridge_offload.bench.sweep import fraction_overrides

    lines = (run_dir / "log.txt").read_text(errors="replace").splitlines()
    words = shlex.split(lines[0]) if lines else []
    if "--recipe" in words:
        return words[words.index("--recipe") + 1], [w for w in words if "=" in w and not w.startswith("-")]
    sweep = json.loads((run_dir.parent / "sweep.json").read_text())
    return sweep["recipe"], [*sweep["overrides"], *fraction_overrides(float(run_dir.name.removeprefix("fraction-")))]


def _fraction(overrides: list[str], summary: dict | None) -> tuple[float | None, list[str]]:
    """The fraction the run trained at (auto resolved from its summary) and the overrides without auto."""
    from overrides.grammar import key_of
    from mbridge_offload.facts.key_ranges import OFFLOAD_FRACTION_KEY as FRACTION_KEY

    given = [o.split("=", 1)[1] for o in overrides if key_of(o) == FRACTION_KEY]
    rest = [o for o in overrides if key_of(o) != FRACTION_KEY]
    if summary is not None and summary.get("optimizer_offload_fraction") is not None:
        return (summary["optimizer_offload_fraction"] if summary.get("optimizer_cpu_offload") else 0.0), rest
    if given and given[-1] != "auto":
        return float(given[-1]), rest
    return None, rest


def _ratio(planned: float, measured: float | None) -> float | None:
    return None if measured is None else planned / measured - 1


@functools.cache
def _recipe(name: str):
    """The recipe as built, once per name (apply_overrides returns a new config and leaves it as it is)."""
    from recipes import registry

    return registry.get(name).build()


def ran_with_expandable_segments(run_dir: Path) -> bool:
    """Whether the run's allocator had expandable segments, as its metrics recorded at step 1. Runs older than that
    record ran without them, whatever their recipe asked: the recipe's setting took effect only from the twelfth
    session (docs/benchmarks/alloc-conf/)."""
    from mbridge_offload.facts.run_records import recorded_expandable_segments

    return recorded_expandable_segments(run_dir) is True


def compare_run(run_dir: Path) -> dict | None:
    """Planned vs measured of one run folder (None when the fraction it ran at is unknown)."""
    from overrides import apply_overrides
    from mbridge_offload.planning import GIB, plan

    recipe, overrides = run_command(run_dir)
    summary_path = run_dir / "summary.json"
    summary = json.loads(summary_path.read_text()) if summary_path.exists() else None
    fraction, rest = _fraction(overrides, summary)
    if fraction is None:
        return None
    cfg = apply_overrides(_recipe(recipe), rest)
    expandable = ran_with_expandable_segments(run_dir)
    planned = plan(cfg, 1, fraction=fraction, expandable=expandable)
    s = summary or {}
    measured, host, device = s.get("peak_allocated_gib"), s.get("peak_host_rss_gib"), s.get("peak_device_process_used_gib")
    return {"run": str(run_dir), "recipe": recipe, "overrides": rest, "fraction": fraction,
            "measured_gib": measured, "planned_gib": planned.allocated_bytes_gpu / GIB,
            "error": _ratio(planned.allocated_bytes_gpu / GIB, measured),
            "measured_device_gib": device, "planned_device_gib": planned.total_bytes_gpu / GIB,
            "device_error": _ratio(planned.total_bytes_gpu / GIB, device),
            "measured_outside_pytorch_gib": s.get("device_outside_pytorch_gib") if device is not None else None,
            "planned_reserve_gib": planned.allocator_reserve_bytes_gpu / GIB,
            "planned_outside_pytorch_gib": planned.outside_pytorch_bytes_gpu / GIB,
            "planned_state_gib": planned.state_bytes_gpu / GIB,
            "measured_host_rss_gib": host, "planned_host_gib": planned.host_bytes_per_node / GIB,
            "host_error": _ratio(planned.host_bytes_per_node / GIB, host),
            "planned_host_peak_gib": planned.host_peak_bytes_per_node / GIB,
            "measured_host_high_water_gib": s.get("peak_host_rss_high_water_gib"),
            "measured_node_peak_gib": s.get("peak_node_host_used_gib"),
            "overlap": s.get("overlap_cpu_optimizer_d2h_h2d") if fraction else None, "expandable_segments": expandable}


def compare_rows(folder: Path) -> list[dict]:
    """compare_run for every run folder under ``folder``, in order of the fraction."""
    rows = [r for r in (compare_run(d) for d in run_dirs(folder)) if r is not None]
    return sorted(rows, key=lambda r: (r["run"].rsplit("/", 1)[0], r["fraction"]))


def largest_underprediction(rows: list[dict]) -> float:
    """The largest share by which a run's whole-device use exceeded its plan (0 when none did)."""
    return max([0.0] + [-r["device_error"] / (1 + r["device_error"]) for r in rows if r["device_error"] is not None])


def _all_rows(folders: list[Path]) -> list[dict]:
    return [r for folder in folders for r in compare_rows(folder)]


def _cell(value: float | None, fmt: str = ".2f") -> str:
    return "-" if value is None else format(value, fmt)


def compare_markdown(folders: list[Path]) -> str:
    lines = ["| recipe | fraction | measured peak allocated (GiB) | planned allocated (GiB) | error |",
             "|---|---|---|---|---|"]
    for r in _all_rows(folders):
        lines.append(f"| {r['recipe']} | {r['fraction']:g} | {_cell(r['measured_gib'])} | {r['planned_gib']:.2f} "
                     f"| {_cell(r['error'], '+.1%')} |")
    return "\n".join(lines)


def heldout_markdown(folders: list[Path]) -> str:
    """Held-out runs: PyTorch's peak and the whole device (NVML, this process), planned and measured."""
    lines = ["| run | recipe | overrides | fraction | peak allocated: measured / planned (GiB) | error "
             "| whole device: measured / planned (GiB) | error | outside PyTorch, measured (GiB) | expandable segments |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in _all_rows(folders):
        if r["measured_gib"] is None:
            continue
        run = Path(r["run"])
        shown = [o for o in r["overrides"] if not o.startswith(("train.train_iters", "optimizer.optimizer_cpu_offload"))]
        lines.append(f"| {run.parent.name}/{run.name} | {r['recipe']} | {' '.join(shown)} | {r['fraction']:g} "
                     f"| {r['measured_gib']:.2f} / {r['planned_gib']:.2f} | {_cell(r['error'], '+.1%')} "
                     f"| {_cell(r['measured_device_gib'])} / {r['planned_device_gib']:.2f} "
                     f"| {_cell(r['device_error'], '+.1%')} | {_cell(r['measured_outside_pytorch_gib'])} "
                     f"| {'yes' if r['expandable_segments'] else 'no'} |")
    return "\n".join(lines)


def compare_host_markdown(folders: list[Path]) -> str:
    """Planned vs measured host memory of the same runs (one rank per node)."""
    lines = ["| recipe | fraction | overlap | measured host RSS at step ends (GiB) | planned between steps (GiB) | error "
             "| planned peak in the first optimizer step (GiB) | measured process peak (GiB) | measured node peak (GiB) |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in _all_rows(folders):
        overlap = "-" if r["overlap"] is None else ("on" if r["overlap"] else "off")
        lines.append(f"| {r['recipe']} | {r['fraction']:g} | {overlap} | {_cell(r['measured_host_rss_gib'])} "
                     f"| {r['planned_host_gib']:.2f} | {_cell(r['host_error'], '+.1%')} "
                     f"| {r['planned_host_peak_gib']:.2f} | {_cell(r['measured_host_high_water_gib'])} "
                     f"| {_cell(r['measured_node_peak_gib'])} |")
    return "\n".join(lines)
