"""The memory planner against measurements: planned vs measured peak GPU and host memory of every run
of sweep_offload.py folders (plan_offload.py --compare; docs/benchmarks/planner-accuracy.md)."""

from __future__ import annotations

import json
from pathlib import Path


def compare_rows(sweep_dir: Path) -> list[dict]:
    """Planned vs measured peak GPU memory for every run of a sweep folder (same overrides)."""
    from overrides import apply_overrides
    from recipes import registry
    from mbridge_offload.planning import GIB, plan

    sweep = json.loads((sweep_dir / "sweep.json").read_text())
    cfg = apply_overrides(registry.get(sweep["recipe"]).build(), sweep["overrides"])
    rows = []
    for row in sweep["rows"]:
        planned = plan(cfg, 1, fraction=row["fraction"])
        measured, host = row["peak_allocated_gib"], row.get("peak_host_rss_gib")
        rows.append({"recipe": sweep["recipe"], "fraction": row["fraction"], "measured_gib": measured,
                     "planned_gib": planned.total_bytes_gpu / GIB, "planned_state_gib": planned.state_bytes_gpu / GIB,
                     "error": None if measured is None else planned.total_bytes_gpu / GIB / measured - 1,
                     "measured_host_rss_gib": host, "planned_host_gib": planned.host_bytes_per_node / GIB,
                     "host_error": None if host is None else planned.host_bytes_per_node / GIB / host - 1,
                     "planned_host_peak_gib": planned.host_peak_bytes_per_node / GIB,
                     "measured_node_peak_gib": row.get("peak_node_host_used_gib")})
    return rows


def _cell(value: float | None, fmt: str = ".2f") -> str:
    return "-" if value is None else format(value, fmt)


def compare_markdown(sweep_dirs: list[Path]) -> str:
    lines = ["| recipe | fraction | measured peak allocated (GiB) | planned total (GiB) | error |",
             "|---|---|---|---|---|"]
    for sweep_dir in sweep_dirs:
        for r in compare_rows(sweep_dir):
            measured = "-" if r["measured_gib"] is None else f"{r['measured_gib']:.2f}"
            error = "-" if r["error"] is None else f"{r['error']:+.1%}"
            lines.append(f"| {r['recipe']} | {r['fraction']:g} | {measured} | {r['planned_gib']:.2f} | {error} |")
    return "\n".join(lines)


def compare_host_markdown(sweep_dirs: list[Path]) -> str:
    """Planned vs measured host memory of the same runs (one rank per node)."""
    lines = ["| recipe | fraction | measured host RSS at step ends (GiB) | planned between steps (GiB) | error "
             "| planned peak in the first optimizer step (GiB) | measured node peak (GiB) |",
             "|---|---|---|---|---|---|---|"]
    for sweep_dir in sweep_dirs:
        for r in compare_rows(sweep_dir):
            lines.append(f"| {r['recipe']} | {r['fraction']:g} | {_cell(r['measured_host_rss_gib'])} "
                         f"| {r['planned_host_gib']:.2f} | {_cell(r['host_error'], '+.1%')} "
                         f"| {r['planned_host_peak_gib']:.2f} | {_cell(r['measured_node_peak_gib'])} |")
    return "\n".join(lines)
