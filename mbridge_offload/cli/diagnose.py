"""Troubleshoot a run from its output: each failure it recognises, the evidence lines, how to confirm it,
and the fix to paste.

Usage, examples and exit codes: scripts/diagnose.py; the engine: mbridge_offload/diagnosis/.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from mbridge_offload.cli.parsing import RefusalParser

EXIT_OK, EXIT_UNREADABLE = 0, 2


def build_parser() -> argparse.ArgumentParser:
    parser = RefusalParser(prog="diagnose.py", description=__doc__.split("\n\n")[0], json_flag="--json",
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("logs", nargs="*", type=Path, metavar="LOG",
                        help="a rank's log, torchrun/Slurm output (plain, .gz, .bz2 or .xz), a failure.json, a run "
                             "folder (DIR with log.txt / failure.json / summary.json), or - for a log pasted on "
                             "standard input; several: one report each, and a run without offload among them is "
                             "the baseline of the slowdown check. A log that holds several runs one after another "
                             "(a job that appends to it across restarts) gets one report per run")
    parser.add_argument("--json", action="store_true",
                        help='print the findings as JSON (a list, one report per LOG, or per run of a LOG that '
                             'holds several: "run_in_log" says which); when it exits 2, '
                             '{"ok": false, "refused": true, "error": ..., "problems": []}')
    parser.add_argument("--no-build", action="store_true",
                        help="never build the recipe of the log's command (no Megatron import): fixes then come "
                             "from a saved run_config.yaml or stay generic")
    parser.add_argument("--list", action="store_true", help="list the failures it recognises and exit")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.list:
        from mbridge_offload.validation.registry import RULES

        for rule in RULES:
            if rule.log_signatures:
                print(f"{rule.id}: {rule.text}")
        print("and every configuration rule whose error upstream validate() raises (run_recipe.py --rules)")
        return EXIT_OK
    if not args.logs:
        parser.error("give at least one LOG (or --list)")
    for path in args.logs:  # before anything is read: one clear line for a missing file
        if str(path) != "-" and not path.exists():
            return parser.refuse(f"no such file: {path}", code=EXIT_UNREADABLE,
                                 said=f"diagnose.py: no such file: {path}")

    from mbridge_offload.diagnosis import LogError, diagnose, format_diagnosis
    from mbridge_offload.facts.import_notices import quiet_import_notices

    quiet_import_notices()
    try:
        diagnoses = diagnose(args.logs, build_config=not args.no_build)
    except LogError as error:
        return parser.refuse(str(error), code=EXIT_UNREADABLE, said=f"diagnose.py: {error}")
    if args.json:
        print(json.dumps([d.to_json() for d in diagnoses], indent=2))
    else:
        print("\n\n".join(format_diagnosis(d) for d in diagnoses))
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
