#!/usr/bin/env python3
"""Sweep the optimizer offload fraction: one training per fraction, each in a fresh process with the
same seeds and data, then speed, memory and loss parity against the fraction-0 baseline.

    uv run scripts/sweep_offload.py --recipe qwen3_1b_proxy_pretrain_config --fractions 0,0.25,0.5,0.75,1 \\
        --out runs/sweep-1b train.train_iters=20
    uv run scripts/sweep_offload.py --recipe qwen3_1b_proxy_pretrain_config --out runs/s \\
        optimizer.optimizer_offload_fraction=0,0.5,1          # Hydra multirun syntax works too

The baseline runs twice (``--baseline-runs``, default 2) so that loss parity is judged against the
measured noise floor of two identical runs, next to the seed's criterion (max |delta| < 0.001).
Writes DIR/sweep.json, sweep.csv, sweep.md and sweep.png. A failed run (OOM, crash) is a row with
``ok: false`` and the reason; the sweep goes on.
The command is mbridge_offload/cli/sweep_offload.py, also run as ``python -m mbridge_offload.cli.sweep_offload``.
"""

import sys

from mbridge_offload.cli.sweep_offload import main

if __name__ == "__main__":
    sys.exit(main())
