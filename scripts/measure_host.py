#!/usr/bin/env python3
"""Measure what bounds optimizer offload on this host: pinned D2H/H2D copy bandwidth, GPU and host
memory bandwidth, and the speed of the CPU Adam at several thread counts.

    uv run scripts/measure_host.py --json host.json

The floor model (mbridge_offload/planning/cost_model.py) prices each offloaded step with these numbers;
scripts/bench_offload.py runs this first. Without a GPU only the CPU side is measured.
The command is mbridge_offload/cli/measure_host.py, also run as ``python -m mbridge_offload.cli.measure_host``.
"""

import sys

from mbridge_offload.cli.measure_host import main

if __name__ == "__main__":
    sys.exit(main())
