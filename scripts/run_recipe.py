#!/usr/bin/env python3
"""Load a recipe, apply overrides, validate every offload constraint, and only then launch training.

    uv run scripts/run_recipe.py --list
    uv run scripts/run_recipe.py --recipe qwen3_30b_a3b_pretrain_config --dry-run \\
        optimizer.optimizer_offload_fraction=0.75 train.train_iters=20
    torchrun --nproc-per-node 8 scripts/run_recipe.py --recipe qwen3_8b_optimizer_offload_config -gb 64

Exit codes: 0 success (or a valid dry run), 2 invalid arguments, overrides or config (with a report),
1 a valid config that could not be launched here (no CUDA device, training failed).
The command is mbridge_offload/cli/run_recipe.py, also run as ``python -m mbridge_offload.cli.run_recipe``.
"""

import sys

from mbridge_offload.cli.run_recipe import main

if __name__ == "__main__":
    sys.exit(main())
