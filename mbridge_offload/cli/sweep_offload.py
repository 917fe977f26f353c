"""Sweep the optimizer offload fraction: one training per fraction, each in a fresh process with the
same seeds and data, then speed, memory and loss parity against the fraction-0 baseline.

Usage and what it writes: scripts/sweep_offload.py; the sweep itself: mbridge_offload/bench/sweep.py.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from mbridge_offload.cli.parsing import (CommandParser, at_least_one, check_writable, make_dir, not_negative,
                                         parse_command, positive_seconds, refuse_bad_overrides,
                                         split_fraction_overrides)
from mbridge_offload.bench.sweep import FRACTION_KEY, build_rows, parse_fractions, run_sweep, write_sweep


def build_parser() -> argparse.ArgumentParser:
    parser = CommandParser(prog="sweep_offload.py", description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--recipe", required=True, metavar="NAME")
    parser.add_argument("--fractions", type=parse_fractions, metavar="F,F,...",
                        help="optimizer offload fractions (default 0,0.25,0.5,0.75,1)")
    parser.add_argument("--out", required=True, type=Path, metavar="DIR")
    parser.add_argument("--num-gpus", type=at_least_one("GPU"), metavar="N")
    parser.add_argument("--baseline-runs", type=not_negative("run"), default=2, metavar="K",
                        help="identical fraction-0 runs for the noise floor (default 2)")
    parser.add_argument("--timeout", type=positive_seconds, default=None, metavar="S", help="per-run time limit in seconds")
    parser.add_argument("--resume", action="store_true",
                        help="keep runs that already finished in DIR (summary.json, or failure.json for a "
                             "failed run, killed and timed-out runs included): an interrupted sweep goes on where "
                             "it stopped; delete a run's folder to run it again")
    parser.add_argument("--deterministic", action="store_true",
                        help="every run with run_recipe.py --deterministic; parity is then judged at the seed's "
                             "0.001 exactly, with the max delta per fraction")
    parser.add_argument("overrides", nargs="*", metavar="key=value")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parse_command(parser, argv)
    check_writable(parser, "--out", args.out, resume=args.resume)
    multirun, overrides = split_fraction_overrides(parser, args.overrides)
    if multirun and args.fractions and multirun != args.fractions:
        parser.error(f"--fractions and {FRACTION_KEY}=... disagree; give one")
    fractions = multirun or args.fractions or [0.0, 0.25, 0.5, 0.75, 1.0]
    if 0.0 not in fractions:
        fractions = [0.0, *fractions]  # parity and savings are measured against the baseline
    extra = (["--num-gpus", str(args.num_gpus)] if args.num_gpus else []) + (["--deterministic"] if args.deterministic
                                                                             else [])
    refuse_bad_overrides(parser, args.recipe, overrides)
    make_dir(parser, "--out", args.out, resume=args.resume)

    results, baselines = run_sweep(args.recipe, fractions, args.out, overrides, extra, args.baseline_runs,
                                   args.timeout, args.resume)
    rows, parity = build_rows(results, baselines, args.deterministic)
    command = "uv run scripts/sweep_offload.py " + " ".join(argv if argv is not None else sys.argv[1:])
    print(write_sweep(args.out, args.recipe, command, fractions, overrides, rows, parity))
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
