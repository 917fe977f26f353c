#!/usr/bin/env python3
"""Check that an offloaded run stopped at step k and resumed continues the uninterrupted run (loss and
learning rate step by step; bit for bit with --deterministic). See mbridge_offload/cli/check_resume.py.

    uv run scripts/check_resume.py --recipe qwen3_1b_proxy_pretrain_config --fractions 0.5,1 --save-at 5 \\
        --deterministic --out runs/resume model.num_layers=4
"""

import sys

from mbridge_offload.cli.check_resume import main

if __name__ == "__main__":
    sys.exit(main())
