"""Loss parity of the streaming offload engine's modes, from run folders that trained the same steps.

Each comparison names a reference run and a candidate run (run_recipe.py folders, deterministic mode for
exactness claims) and reports, over every iteration the candidate ran: the largest |loss difference|,
whether every loss and grad norm is bit-identical, and the first iteration that differs. Usage:

    python -m mbridge_offload.bench.engine_parity --out DIR  NAME=REFERENCE_DIR:CANDIDATE_DIR ...

writes DIR/engine_parity.json and DIR/engine_parity.md.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from mbridge_offload.bench.resume_parity import compare, steps_by_iteration
from mbridge_offload.facts.determinism import SEED_PARITY


def parity(name: str, reference: Path, candidate: Path) -> dict:
    ref, cand = steps_by_iteration(reference), steps_by_iteration(candidate)
    loss_delta, loss_equal = compare(ref, cand, "loss")
    norm_delta, norm_equal = compare(ref, cand, "grad_norm")
    differing = [i for i in sorted(cand) if i in ref and cand[i].get("loss") != ref[i].get("loss")]
    return {"name": name, "reference": str(reference), "candidate": str(candidate), "iterations": len(cand),
            "reference_iterations": len(ref), "max_abs_loss_delta": loss_delta, "max_abs_grad_norm_delta": norm_delta,
            "bit_identical": bool(cand) and len(cand) == len(ref) and loss_equal and norm_equal,
            "first_differing_iteration": differing[0] if differing else None,
            "within_seed_parity": loss_delta is not None and loss_delta <= SEED_PARITY}


def markdown(rows: list[dict]) -> str:
    lines = ["| comparison | iterations | max abs loss delta | max abs grad-norm delta | bit-identical | "
             f"first differing iteration | within {SEED_PARITY} |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        def f(x):
            return "-" if x is None else f"{x:.6g}"
        lines.append(f"| {r['name']} | {r['iterations']} (reference {r['reference_iterations']}) | "
                     f"{f(r['max_abs_loss_delta'])} | {f(r['max_abs_grad_norm_delta'])} | "
                     f"{'yes' if r['bit_identical'] else 'no'} | {r['first_differing_iteration'] or '-'} | "
                     f"{'yes' if r['within_seed_parity'] else 'no'} |")
    return "\n".join(lines) + "\n"


def _comparison(text: str) -> tuple[str, Path, Path]:
    name, sep, dirs = text.partition("=")
    reference, sep2, candidate = dirs.partition(":")
    if not (sep and sep2 and name and reference and candidate):
        raise argparse.ArgumentTypeError(f"expected NAME=REFERENCE_DIR:CANDIDATE_DIR, got {text!r}")
    return name, Path(reference), Path(candidate)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mbridge_offload.bench.engine_parity",
                                     description="Loss parity between run folders (streaming offload engine).")
    parser.add_argument("--out", type=Path, required=True, metavar="DIR")
    parser.add_argument("comparisons", nargs="+", type=_comparison, metavar="NAME=REFERENCE_DIR:CANDIDATE_DIR")
    args = parser.parse_args(argv)
    rows = [parity(*comparison) for comparison in args.comparisons]
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "engine_parity.json").write_text(json.dumps(rows, indent=2) + "\n")
    table = markdown(rows)
    (args.out / "engine_parity.md").write_text(table)
    print(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
