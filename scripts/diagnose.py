#!/usr/bin/env python3
"""Troubleshoot a run from its output: each failure it recognises, the evidence lines, how to confirm it,
and the fix to paste (computed by the planner when the run's config is found).

    uv run scripts/diagnose.py runs/qwen3_8b/log.txt
    uv run scripts/diagnose.py slurm-1234.out --json          # interleaved ranks: [rank3]: or 3: prefixes
    uv run scripts/diagnose.py runs/sweep/fraction-0/failure.json
    uv run scripts/diagnose.py runs/sweep/fraction-0 runs/sweep/fraction-1   # folders; the first is the baseline
    uv run scripts/diagnose.py slurm-1234.out.gz                             # .gz, .bz2, .xz are read as they are
    xclip -o | uv run scripts/diagnose.py -                                  # a log pasted on standard input

The run's config comes from run_config.yaml in the run folder (or a checkpoint's iter_* folder beside the
log), else from the run_recipe.py command the log starts with; without either the fix is the generic one.

Exit codes: 0 it ran, whatever it found (it says so plainly when it recognises nothing); 2 a LOG is missing,
unreadable, empty or not text (one line names it and the problem), or invalid arguments.
With --json: a JSON list, one report per LOG; with exit 2, {"ok": false, "refused": true, "error": "...",
"problems": []} on stdout as well as the words on stderr.
The command is mbridge_offload/cli/diagnose.py, also run as ``python -m mbridge_offload.cli.diagnose``.
"""

import sys

from mbridge_offload.cli.diagnose import main

if __name__ == "__main__":
    sys.exit(main())
