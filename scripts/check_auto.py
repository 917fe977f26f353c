#!/usr/bin/env python3
"""Check that optimizer.optimizer_offload_fraction=auto trains on a GPU of a given size and is not more than
needed. See mbridge_offload/cli/check_auto.py.

    uv run scripts/check_auto.py --recipe qwen3_1p7b_pretrain_config --device-gib 32 --out runs/auto-1p7b \\
        model.seq_length=2048 dataset.seq_length=2048
"""

import sys

from mbridge_offload.cli.check_auto import main

if __name__ == "__main__":
    sys.exit(main())
