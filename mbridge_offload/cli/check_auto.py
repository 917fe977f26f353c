"""Check that optimizer.optimizer_offload_fraction=auto trains on a GPU of a given size, and is not more
than needed: a run at auto's fraction and one at the next 0.05 below, each beside a device ballast that
leaves exactly --device-gib free (run alone on the GPU).

    uv run scripts/check_auto.py --recipe qwen3_1p7b_pretrain_config --device-gib 32 --out runs/auto-1p7b \\
        model.seq_length=2048 dataset.seq_length=2048

The run at auto's fraction must train; the run below must run out of memory or leave less free than the
margin auto stated. When the run below trained, a third run 0.10 below says whether auto is at most one step
above the smallest fraction that trains (the row's goal). Rows of DIR/auto_check.json and .md. Exit 0 when the
row is ok, 1 if not.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from mbridge_offload.bench.auto_check import check_auto, markdown, write_results
from mbridge_offload.bench.device_ballast import BallastError
from mbridge_offload.cli.parsing import (CommandParser, at_least_one, parse_single_fraction_command, positive_seconds,
                                         refuse)
from mbridge_offload.planning.arguments import GIB_ABOVE_0


def build_parser() -> argparse.ArgumentParser:
    parser = CommandParser(prog="check_auto.py", description=__doc__.split("\n\n")[0],
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--recipe", required=True, metavar="NAME")
    parser.add_argument("--out", required=True, type=Path, metavar="DIR")
    parser.add_argument("--device-gib", required=True, type=GIB_ABOVE_0, metavar="G",
                        help="the GPU size to check auto for: the planner is given it, and a ballast process leaves "
                             "exactly that much free on this GPU")
    parser.add_argument("--steps", type=at_least_one("step"), default=3, metavar="N",
                        help="training steps per run (default 3: the peak is reached once the optimizer state exists)")
    parser.add_argument("--timeout", type=positive_seconds, default=None, metavar="S", help="per-run time limit in seconds")
    parser.add_argument("overrides", nargs="*", metavar="key=value")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, overrides = parse_single_fraction_command(
        parser, argv, "the fraction is auto's to choose: drop optimizer.optimizer_offload_fraction")
    try:
        row = check_auto(args.recipe, args.device_gib, args.out, overrides, args.steps, args.timeout)
    except BallastError as error:  # a shared or smaller GPU: nothing was measured
        return refuse(f"{parser.prog}: error: --device-gib {args.device_gib:g}: {error}")
    write_results(args.out, [row])
    print(markdown([row]))
    return 0 if row["ok"] else 1
