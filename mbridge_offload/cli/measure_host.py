"""Measure what bounds optimizer offload on this host: pinned D2H/H2D copy bandwidth, GPU and host
memory bandwidth, and the speed of the CPU Adam at several thread counts.

Usage: scripts/measure_host.py; the measurements: mbridge_offload/bench/host_measure.py.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from mbridge_offload.cli.parsing import CommandParser, at_least_one, check_writable


def _threads(text: str) -> list[int]:
    """--threads: thread counts, each at least 1."""
    try:
        counts = [int(t) for t in text.split(",") if t.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expects thread counts separated by commas, got {text!r}") from None
    if not counts or min(counts) < 1 or max(counts) > 4096:
        raise argparse.ArgumentTypeError(f"expects thread counts from 1 to 4096, got {text!r}")
    return counts


def main(argv: list[str] | None = None) -> int:
    parser = CommandParser(prog="measure_host.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", type=Path, metavar="FILE", help="also write the numbers to FILE")
    parser.add_argument("--size-mib", type=at_least_one("MiB"), default=1024, metavar="MIB",
                        help="size of each test buffer (default 1024; large enough to leave the caches)")
    parser.add_argument("--threads", type=_threads, default=None, metavar="N,N,...",
                        help="thread counts for the CPU measurements (default 1,2,4,8 and all cores)")
    args = parser.parse_args(argv)
    threads = args.threads
    check_writable(parser, "--json", args.json, kind="file")
    if args.size_mib > 1 << 20:
        parser.error(f"--size-mib expects at most {1 << 20} MiB, got {args.size_mib}")

    from mbridge_offload.bench.host_measure import measure_host

    host = measure_host(threads, args.size_mib)
    text = json.dumps(host, indent=2)
    print(text)
    if args.json:
        try:
            args.json.parent.mkdir(parents=True, exist_ok=True)
            args.json.write_text(text + "\n")
        except OSError as error:
            parser.error(f"--json {args.json}: cannot write it ({error.strerror or error})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
