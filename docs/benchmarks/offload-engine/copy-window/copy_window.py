"""How long does a small copy of another stream wait behind the engine's copies in pieces, with one or two pieces in
flight? Plain torch and the plugin's own loop (mbridge_offload/runtime/copy_pieces.py), no Megatron: issue #16.

copy-pieces/'s profile of the delayed mode (both copies in 128 MiB pieces, two in flight) still showed the training
stream idle 8-32 ms at a time with only the engine's copy stream busy, each gap ending with the training stream's own
small copy in the same direction. The reading to test: while the copy thread keeps a piece queued behind the running
one, the copy engine goes on serving that stream and a small copy of another stream waits until the thread's queue
runs dry (the end of a chunk, or of the step's copy), not for one piece. With one piece in flight the queue is empty
for a moment after each piece (the thread's wake-up), and the small copy gets in.

Each scenario, in each direction (D2H: gradients to the host; H2D: weights back): a thread copies ``--gb`` GB of fp32
(``--tensors`` tensors) between the GPU and pinned host memory, while the main thread issues a small copy in the same
direction on a stream of its own every ``--every-ms`` ms. CUDA events on that stream time each small copy from its
issue to its end, and events on the copy stream the large copy. A third thread keeps the interpreter's lock busy, as
the training thread does while it launches kernels (``--no-busy-thread``: not), so the copy thread's wake-ups after
each piece cost what they cost in training.

- ``alone``: no large copy (the small copy's own latency);
- ``at-once``: the large copy enqueued at once (the library's way);
- ``window-1``, ``window-2``: copy_in_pieces with pieces of ``--piece-mb`` MiB, one or two in flight.

    python copy_window.py --gb 4.47 --tensors 300 --piece-mb 128 --every-ms 5 --out results.json
"""
from __future__ import annotations

import argparse
import collections
import json
import statistics
import threading
import time

import torch

from mbridge_offload.runtime.copy_pieces import copy_in_pieces


def parse():
    p = argparse.ArgumentParser()
    p.add_argument("--gb", type=float, default=4.47)
    p.add_argument("--tensors", type=int, default=300)
    p.add_argument("--piece-mb", type=float, default=128.0)
    p.add_argument("--every-ms", type=float, default=5.0)
    p.add_argument("--no-busy-thread", action="store_true")
    p.add_argument("--out", default=None)
    return p.parse_args()


def large_copy(pairs, stream, scenario: str, piece_bytes: int, timing: list) -> None:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    with torch.cuda.stream(stream):
        start.record()
        if scenario == "at-once":
            for destination, source in pairs:
                destination.copy_(source, non_blocking=True)
        else:
            copy_in_pieces(pairs, stream=stream, piece_bytes=piece_bytes, in_flight=collections.deque(),
                           window=int(scenario.split("-")[1]))
        end.record()
    stream.synchronize()
    timing.append(start.elapsed_time(end))


def busy(stop: threading.Event) -> None:
    """Pure Python, holding the interpreter's lock but for the switch interval's hand-overs."""
    while not stop.is_set():
        sum(range(2000))


def one(scenario: str, direction: str, device_side, host_side, small_device, small_host, args) -> dict:
    pairs = list(zip(host_side, device_side)) if direction == "D2H" else list(zip(device_side, host_side))
    small = (small_host, small_device) if direction == "D2H" else (small_device, small_host)
    copy_stream, small_stream = torch.cuda.Stream(), torch.cuda.Stream()
    torch.cuda.synchronize()
    started = time.perf_counter()
    thread, large_ms, stop = None, [], threading.Event()
    if not args.no_busy_thread:
        threading.Thread(target=busy, args=(stop,), daemon=True).start()
    if scenario != "alone":
        thread = threading.Thread(target=large_copy,
                                  args=(pairs, copy_stream, scenario, int(args.piece_mb * 2**20), large_ms))
        thread.start()
    waits = []
    horizon = started + 0.25  # alone: as many small copies as a quarter second holds
    while (thread is not None and thread.is_alive()) or (thread is None and time.perf_counter() < horizon):
        issued = time.perf_counter()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        with torch.cuda.stream(small_stream):
            start.record()
            small[0].copy_(small[1], non_blocking=True)
            end.record()
        end.synchronize()
        waits.append(start.elapsed_time(end))
        time.sleep(max(0.0, args.every_ms / 1000 - (time.perf_counter() - issued)))
    if thread is not None:
        thread.join()
    stop.set()
    return {"small_copies": len(waits), "small_wait_ms_median": statistics.median(waits),
            "small_wait_ms_max": max(waits), "small_wait_ms_p90": sorted(waits)[int(0.9 * (len(waits) - 1))],
            "large_copy_ms": large_ms[0] if large_ms else None}


def main() -> None:
    args = parse()
    numel = int(args.gb * 1e9 / 4 / args.tensors)
    device_side = [torch.randn(numel, device="cuda") for _ in range(args.tensors)]
    host_side = [torch.empty(numel, pin_memory=True) for _ in range(args.tensors)]
    small_device, small_host = torch.ones(1024, device="cuda"), torch.empty(1024, pin_memory=True)
    results = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "args": vars(args), "runs": {}}
    for direction in ("D2H", "H2D"):
        for scenario in ("alone", "at-once", "window-1", "window-2"):
            one(scenario, direction, device_side, host_side, small_device, small_host, args)  # warm-up
            runs = [one(scenario, direction, device_side, host_side, small_device, small_host, args)
                    for _ in range(3)]
            results["runs"][f"{direction} {scenario}"] = runs
            print(f"{direction} {scenario:9s}: small copy waited median "
                  f"{statistics.median(r['small_wait_ms_median'] for r in runs):7.2f} ms, p90 "
                  f"{statistics.median(r['small_wait_ms_p90'] for r in runs):7.2f} ms, max "
                  f"{max(r['small_wait_ms_max'] for r in runs):7.2f} ms over "
                  f"{sum(r['small_copies'] for r in runs)} copies; large copy "
                  f"{statistics.median((r['large_copy_ms'] or 0) for r in runs):7.1f} ms", flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
