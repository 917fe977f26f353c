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
                             "(a job that appends to it across restarts) gets one report per run. A LOG that cannot "
                             "be read (empty, missing, not text) is named in one line on stderr and the others are "
                             "diagnosed; it exits 2 only when none can be read")
    parser.add_argument("--json", action="store_true",
                        help='print the findings as JSON (a list, one report per LOG, or per run of a LOG that '
                             'holds several: "run_in_log" says which; "notes": what reading it had to tell, e.g. a '
                             '.gz cut short; a LOG that cannot be read: "unreadable" says why, with no findings); '
                             'when it exits 2 (no LOG could be read), '
                             '{"ok": false, "refused": true, "error": ..., "problems": []} (several LOGs: a problem '
                             'each, "value" its path and "rule" why)')
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
    missing = [(path, f"no such file: {path}") for path in args.logs if str(path) != "-" and not path.exists()]
    if len(missing) == len(args.logs):  # before the engine is imported: nothing to read
        return _refuse_unreadable(parser, missing)

    from mbridge_offload.diagnosis import UnreadableLog, diagnose_each, format_diagnosis
    from mbridge_offload.facts.import_notices import quiet_import_notices

    quiet_import_notices()
    reports = diagnose_each(args.logs, build_config=not args.no_build)
    unreadable = [(r.log, r.reason) for r in reports if isinstance(r, UnreadableLog)]
    if len(unreadable) == len(reports):
        return _refuse_unreadable(parser, unreadable)
    for _, reason in unreadable:  # each on its own line, beside the reports of the LOGs that were read
        print(f"diagnose.py: {reason}", file=sys.stderr, flush=True)
    if args.json:
        print(json.dumps([r.to_json() for r in reports], indent=2))
    else:
        print("\n\n".join(format_diagnosis(r) for r in reports if not isinstance(r, UnreadableLog)))
    return EXIT_OK


def _refuse_unreadable(parser: RefusalParser, unreadable: list[tuple[Path, str]]) -> int:
    """No LOG could be read: exit 2. One LOG: its reason is the refusal, as ever. Several: each named on a line of its
    own, then the refusal; in JSON a problem each."""
    if len(unreadable) == 1:
        reason = unreadable[0][1]
        return parser.refuse(reason, code=EXIT_UNREADABLE, said=f"diagnose.py: {reason}")
    summary = f"none of the {len(unreadable)} LOGs could be read"
    said = "\n".join([*(f"diagnose.py: {reason}" for _, reason in unreadable), f"diagnose.py: {summary}"])
    problems = [{"id": "log/unreadable", "key": "LOG", "value": str(path), "rule": reason,
                 "fix": "give the run's printed output (the file torchrun's or srun's stdout/stderr went to), or "
                        "leave this LOG out", "severity": "error"} for path, reason in unreadable]
    return parser.refuse(summary, problems, code=EXIT_UNREADABLE, said=said)


if __name__ == "__main__":
    sys.exit(main())
