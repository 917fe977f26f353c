#!/usr/bin/env python3
"""Plan GPU and host memory of a recipe before queueing it, and pick the offload fraction.

    uv run scripts/plan_offload.py --recipe qwen3_30b_a3b_pretrain_config --num-gpus 16 --gpu-memory-gib 80
    uv run scripts/plan_offload.py --recipe qwen3_8b_pretrain_config --num-gpus 1 -tp 1 --json \\
        optimizer.optimizer_offload_fraction=auto

Exit codes: 0 the plan fits; 2 invalid arguments or overrides, no fraction fits (auto), or the plan
does not fit (GPU, host memory, or the --step-time-budget-s offload-time gate).
With --json stdout is always one JSON object: the plan with "ok" and "refused" (true with exit 2) and its
"problems", or, when no plan is made (a bad argument, recipe or override, auto where nothing fits),
{"ok": false, "refused": true, "error": "...", "problems": [{"id", "key", "value", "rule", "fix", "severity"}]};
the words on stderr are the same as without --json.
The command is mbridge_offload/cli/plan_offload.py, also run as ``python -m mbridge_offload.cli.plan_offload``.
"""

import sys

from mbridge_offload.cli.plan_offload import main

if __name__ == "__main__":
    sys.exit(main())
