"""Measure what bounds optimizer offload on this host: pinned D2H/H2D copy bandwidth, GPU and host
memory bandwidth, and the speed of the CPU Adam at several thread counts.

Usage: scripts/measure_host.py; the measurements: mbridge_offload/bench/host_measure.py.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="measure_host.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", type=Path, metavar="FILE", help="also write the numbers to FILE")
    parser.add_argument("--size-mib", type=int, default=1024, metavar="MIB",
                        help="size of each test buffer (default 1024; large enough to leave the caches)")
    parser.add_argument("--threads", default=None, metavar="N,N,...",
                        help="thread counts for the CPU measurements (default 1,2,4,8 and all cores)")
    args = parser.parse_args(argv)
    threads = [int(t) for t in args.threads.split(",")] if args.threads else None

    from mbridge_offload.bench.host_measure import measure_host

    host = measure_host(threads, args.size_mib)
    text = json.dumps(host, indent=2)
    print(text)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
