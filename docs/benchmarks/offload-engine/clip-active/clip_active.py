"""How often gradient clipping changed the update in the committed GPU runs: the rate design section 2.7 left open.

    python3 docs/benchmarks/offload-engine/clip-active/clip_active.py [--clip-grad 1.0] > clip-active.md

Reads every docs/benchmarks/**/metrics.rank0.jsonl (one line per step, with the step's gradient norm before
clipping, `grad_norm`) and counts the steps whose norm exceeds the clip threshold, per benchmark folder. Every recipe
here keeps Megatron's `optimizer.clip_grad=1.0`. A step counts as clip-active when its norm is above the threshold:
its update then differs from the one an Adam step on the unclipped gradient would make, so a speculative update
started before the norm is known (section 2.6) would have to be undone.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass, field
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parents[2]


@dataclass
class Folder:
    runs: int = 0
    norms: list[float] = field(default_factory=list)


def norms_of(metrics: Path) -> list[float]:
    norms = []
    for line in metrics.read_text().splitlines():
        try:
            step = json.loads(line)
        except json.JSONDecodeError:  # a run cut mid-write leaves a partial last line
            continue
        if isinstance(step, dict) and isinstance(step.get("grad_norm"), (int, float)):
            norms.append(float(step["grad_norm"]))
    return norms


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clip-grad", type=float, default=1.0)
    args = parser.parse_args()
    folders: dict[str, Folder] = {}
    for metrics in sorted(BENCHMARKS.glob("**/metrics.rank0.jsonl")):
        norms = norms_of(metrics)
        if not norms:
            continue
        parts = metrics.relative_to(BENCHMARKS).parts
        name = "/".join(parts[:2]) if parts[0] == "offload-engine" else parts[0]
        folder = folders.setdefault(name, Folder())
        folder.runs += 1
        folder.norms += norms
    print(f"| folder | runs | steps | clip-active (norm > {args.clip_grad:g}) | smallest norm |")
    print("|---|---|---|---|---|")
    steps = active = 0
    for name, folder in folders.items():
        n, a = len(folder.norms), sum(x > args.clip_grad for x in folder.norms)
        steps, active = steps + n, active + a
        print(f"| {name} | {folder.runs} | {n} | {a} ({a / n:.1%}) | {min(folder.norms):.3f} |")
    print(f"| all | {sum(f.runs for f in folders.values())} | {steps} | {active} ({active / steps:.1%}) | "
          f"{min(min(f.norms) for f in folders.values()):.3f} |")


if __name__ == "__main__":
    main()
