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
direction on a stream of its own every ``--every-ms`` ms. CUDA events on that stream time each small copy from the
moment it could start on the GPU to its end, and events on the copy stream the large copy.

The small copy is gated: a sleep kernel of ``--gate-ms`` ms on its stream comes first, and the start event, the copy
and the end event are enqueued while it runs. Without the gate the events would also time the main thread's waits for
the interpreter's lock between the three launches (the thirty-fourth session's run of this script without it measured
15-26 ms for a 4 KiB copy with no other copy running). A sample whose three launches took longer than the gate is
dropped and counted (``late``).

A third thread stands for the training thread (``--busy``):
- ``launches`` (the default): it launches small kernels on a stream of its own, with ``--busy-python-us`` µs of pure
  Python between two launches. PyTorch lets go of the interpreter's lock while it dispatches an op, so the copy
  thread gets the lock within about one such stretch, as it does in training;
- ``python``: pure Python that lets go of the lock only at the switch interval's hand-overs (5 ms), a worst case
  that training does not reach (the thirty-fourth session's run measured this one: the 4.47 GB took 5 s at once and
  20 s in pieces);
- ``none``.

- ``alone``: no large copy (the small copy's own latency);
- ``at-once``: the large copy enqueued at once (the library's way);
- ``window-1``, ``window-2``: copy_in_pieces with pieces of ``--piece-mb`` MiB, one or two in flight;
- ``spaced-US``: copy_in_pieces with every piece enqueued at once and the engine's GPU-side pause of about US
  microseconds between two (copy_pieces.gpu_pause: MBRIDGE_OFFLOAD_COPY_PIECE_PAUSE_US).

    python copy_window.py --gb 4.47 --tensors 300 --piece-mb 128 --every-ms 5 --gate-ms 3 --out results.json \
        [--scenarios alone,at-once,window-1,window-2,spaced-20]
"""
from __future__ import annotations

import argparse
import collections
import json
import statistics
import threading
import time

import torch

from mbridge_offload.runtime.copy_pieces import copy_in_pieces, gpu_pause
from mbridge_offload.runtime.gpu_sleep import sleep_cycles_per_ms


def parse():
    p = argparse.ArgumentParser()
    p.add_argument("--gb", type=float, default=4.47)
    p.add_argument("--tensors", type=int, default=300)
    p.add_argument("--piece-mb", type=float, default=128.0)
    p.add_argument("--every-ms", type=float, default=5.0)
    p.add_argument("--gate-ms", type=float, default=3.0)
    p.add_argument("--busy", choices=("launches", "python", "none"), default="launches")
    p.add_argument("--busy-python-us", type=float, default=50.0)
    p.add_argument("--scenarios", default="alone,at-once,window-1,window-2")
    p.add_argument("--out", default=None)
    return p.parse_args()


def large_copy(pairs, stream, scenario: str, piece_bytes: int, timing: list, pauses: dict) -> None:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    with torch.cuda.stream(stream):
        start.record()
        if scenario == "at-once":
            for destination, source in pairs:
                destination.copy_(source, non_blocking=True)
        elif scenario.startswith("spaced-"):
            copy_in_pieces(pairs, stream=stream, piece_bytes=piece_bytes, in_flight=collections.deque(),
                           pause=pauses[scenario])
        else:
            copy_in_pieces(pairs, stream=stream, piece_bytes=piece_bytes, in_flight=collections.deque(),
                           window=int(scenario.split("-")[1]))
        end.record()
    stream.synchronize()
    timing.append(start.elapsed_time(end))


def busy(kind: str, python_us: float, stop: threading.Event) -> None:
    """The training thread's share of the interpreter's lock: see the module's docstring."""
    if kind == "python":
        while not stop.is_set():
            sum(range(2000))
        return
    work, stream = torch.ones(1024, device="cuda"), torch.cuda.Stream()
    with torch.cuda.stream(stream):
        while not stop.is_set():
            until = time.perf_counter() + python_us / 1e6
            while time.perf_counter() < until:
                pass
            work.mul_(1.0)  # a few microseconds on the GPU: its launch queue stays short


def one(scenario: str, direction: str, device_side, host_side, small_device, small_host, args) -> dict:
    pairs = list(zip(host_side, device_side)) if direction == "D2H" else list(zip(device_side, host_side))
    small = (small_host, small_device) if direction == "D2H" else (small_device, small_host)
    copy_stream, small_stream = torch.cuda.Stream(), torch.cuda.Stream()
    torch.cuda.synchronize()
    started = time.perf_counter()
    thread, large_ms, stop = None, [], threading.Event()
    if args.busy != "none":
        threading.Thread(target=busy, args=(args.busy, args.busy_python_us, stop), daemon=True).start()
    if scenario != "alone":
        thread = threading.Thread(target=large_copy,
                                  args=(pairs, copy_stream, scenario, int(args.piece_mb * 2**20), large_ms,
                                        args.pauses))
        thread.start()
    waits, late, gate_cycles = [], 0, int(args.gate_ms * args.cycles_per_ms)
    horizon = started + 0.25  # alone: as many small copies as a quarter second holds
    while (thread is not None and thread.is_alive()) or (thread is None and time.perf_counter() < horizon):
        issued = time.perf_counter()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        with torch.cuda.stream(small_stream):
            launched = time.perf_counter()  # before the gate starts, so a launch time under it is covered by it
            torch.cuda._sleep(gate_cycles)
            start.record()
            small[0].copy_(small[1], non_blocking=True)
            end.record()
            launched = time.perf_counter() - launched
        end.synchronize()
        if launched * 1000 < args.gate_ms:
            waits.append(start.elapsed_time(end))
        else:
            late += 1
        time.sleep(max(0.0, args.every_ms / 1000 - (time.perf_counter() - issued)))
    if thread is not None:
        thread.join()
    stop.set()
    if not waits:
        raise SystemExit(f"{direction} {scenario}: every small copy's launch took longer than the {args.gate_ms} ms "
                         f"gate ({late} late): raise --gate-ms")
    return {"small_copies": len(waits), "late": late, "small_wait_ms_median": statistics.median(waits),
            "small_wait_ms_max": max(waits), "small_wait_ms_p90": sorted(waits)[int(0.9 * (len(waits) - 1))],
            "large_copy_ms": large_ms[0] if large_ms else None}


def main() -> None:
    args = parse()
    numel = int(args.gb * 1e9 / 4 / args.tensors)
    device_side = [torch.randn(numel, device="cuda") for _ in range(args.tensors)]
    host_side = [torch.empty(numel, pin_memory=True) for _ in range(args.tensors)]
    small_device, small_host = torch.ones(1024, device="cuda"), torch.empty(1024, pin_memory=True)
    args.cycles_per_ms = sleep_cycles_per_ms()
    scenarios = args.scenarios.split(",")
    unknown = [name for name in scenarios if name not in ("alone", "at-once", "window-1", "window-2")
               and not (name.startswith("spaced-") and name[len("spaced-"):].isdigit())]
    if unknown:
        raise SystemExit(f"--scenarios: unknown {unknown}; the scenarios are alone, at-once, window-1, window-2 and "
                         "spaced-US (US a whole number of microseconds)")
    args.pauses = {name: gpu_pause(int(name.split("-")[1])) for name in scenarios if name.startswith("spaced-")}
    results = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
               "args": {k: v for k, v in vars(args).items() if k != "pauses"}, "runs": {}}
    for direction in ("D2H", "H2D"):
        for scenario in scenarios:
            one(scenario, direction, device_side, host_side, small_device, small_host, args)  # warm-up
            runs = [one(scenario, direction, device_side, host_side, small_device, small_host, args)
                    for _ in range(3)]
            results["runs"][f"{direction} {scenario}"] = runs
            print(f"{direction} {scenario:9s}: small copy waited median "
                  f"{statistics.median(r['small_wait_ms_median'] for r in runs):7.2f} ms, p90 "
                  f"{statistics.median(r['small_wait_ms_p90'] for r in runs):7.2f} ms, max "
                  f"{max(r['small_wait_ms_max'] for r in runs):7.2f} ms over "
                  f"{sum(r['small_copies'] for r in runs)} copies ({sum(r['late'] for r in runs)} late); large copy "
                  f"{statistics.median((r['large_copy_ms'] or 0) for r in runs):7.1f} ms", flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
