"""Does a large gradient copy to the host hold a training stream's small reads, and does a copy by a kernel (SM
writes into pinned host memory, through no copy engine) free them? Plain torch + Triton on one GPU (no Megatron).

A stand-in step: STEP_GEMMS bf16 8192^3 GEMMs on the default stream with a scalar read (``.item()``, a small D2H
through the copy engine) every GEMMS_PER_READ, as Megatron's loop reads its loss and norms. At each step's start a
thread copies 4.47 GB of fp32 (the dense proxy's gradients) to pinned host memory on a side stream, as the engine's
gradient copy thread does, in one of these ways:

    none         no copy (the baseline)
    ce-whole     one cudaMemcpyAsync (copy engine)
    ce-pieces-2  128 MiB pieces, two in flight (the engine's default)
    ce-pieces-1  128 MiB pieces, one in flight
    sm-CTAS      a Triton kernel of CTAS blocks that loads the GPU buffer and stores it into the pinned host buffer
    ce-spaced-US 128 MiB pieces all enqueued at once, a GPU-side pause of about US microseconds between two
                 (torch.cuda._sleep on the copy's stream): no thread between the pieces, and (the reading to test)
                 the copy engine has no copy of that stream ready while a pause runs, so another stream's copy may
                 get in. A pause is a kernel: beside GEMMs that fill the SMs it may start late; each line says how
                 long the pauses ran

--busy-launches K adds K one-element kernels after each GEMM, so that the step's thread spends more of the step in
launches (holding the interpreter's lock between ops, as Megatron's training thread does) and less asleep in its
reads; each line gives the thread's time outside its reads, to see how busy it was.

Prints one line per mode: the step's median over the measured steps, the copy's own time and rate, the reads' median
and longest wait. Usage: python3 d2h_by_kernel.py [--steps 6] [--modes M,...] [--busy-launches K] [--out FILE.json]"""

import argparse
import collections
import json
import statistics
import threading
import time

import torch
import triton
import triton.language as tl

from mbridge_offload.runtime.gpu_sleep import sleep_cycles_per_ms

GRAD_BYTES = 4.47e9
PIECE_BYTES = 128 * 2**20
STEP_GEMMS = 160
GEMMS_PER_READ = 20


@triton.jit
def _copy_kernel(src, dst, n, BLOCK: tl.constexpr, CTAS: tl.constexpr):
    start = tl.program_id(0) * BLOCK
    for offset in range(start, n, CTAS * BLOCK):
        index = offset + tl.arange(0, BLOCK)
        mask = index < n
        tl.store(dst + index, tl.load(src + index, mask=mask), mask=mask)


def copy(mode: str, source, destination, stream, cycles_per_us: float) -> dict:
    """The whole copy enqueued on ``stream`` (from the calling thread): its GPU time in s (``s``) and, with pauses,
    the median pause as it ran on the GPU in ms (``pause_ms``: a pause is a kernel, and beside kernels that fill every
    SM it may start late and run longer than asked)."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    pauses = []
    with torch.cuda.stream(stream):
        start.record()
        if mode == "ce-whole":
            destination.copy_(source, non_blocking=True)
        elif mode.startswith("ce-pieces-"):
            window, in_flight = int(mode.rsplit("-", 1)[1]), collections.deque()
            step = PIECE_BYTES // 4
            for first in range(0, source.numel(), step):
                while len(in_flight) >= window:
                    in_flight.popleft().synchronize()
                destination[first:first + step].copy_(source[first:first + step], non_blocking=True)
                in_flight.append(stream.record_event(torch.cuda.Event(blocking=True)))
        elif mode.startswith("ce-spaced-"):
            pause = int(float(mode.rsplit("-", 1)[1]) * cycles_per_us)
            step = PIECE_BYTES // 4
            for first in range(0, source.numel(), step):
                if first:
                    timed = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    timed[0].record()
                    torch.cuda._sleep(pause)
                    timed[1].record()
                    pauses.append(timed)
                destination[first:first + step].copy_(source[first:first + step], non_blocking=True)
        elif mode.startswith("sm-"):
            ctas = int(mode.split("-")[1])
            _copy_kernel[(ctas,)](source, destination, source.numel(), BLOCK=4096, CTAS=ctas)
        end.record()
    end.synchronize()
    return {"s": start.elapsed_time(end) / 1000,
            "pause_ms": statistics.median(a.elapsed_time(b) for a, b in pauses) if pauses else None}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--modes", default="none,ce-whole,ce-pieces-2,ce-pieces-1,sm-8,sm-16,sm-32,none")
    parser.add_argument("--busy-launches", type=int, default=0)
    parser.add_argument("--out")
    args = parser.parse_args()
    cycles_per_us = sleep_cycles_per_ms() / 1000
    grad = torch.randn(int(GRAD_BYTES / 4), device="cuda")
    host = torch.empty_like(grad, device="cpu").pin_memory()
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn_like(a)
    tiny = torch.zeros(1, device="cuda")
    side = torch.cuda.Stream()
    sm = copy("sm-16", grad, host, side, cycles_per_us)  # compiles the kernel; checks it copied
    assert torch.equal(host[:1000].cuda(), grad[:1000]) and torch.equal(host[-1000:].cuda(), grad[-1000:])
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, triton {triton.__version__}; "
          f"--busy-launches {args.busy_launches}; _sleep: {cycles_per_us:.0f} cycles/us", flush=True)
    rows = []
    for mode in args.modes.split(","):
        steps, copies, waits, launching, pauses = [], [], [], [], []
        for index in range(args.steps + 1):
            torch.cuda.synchronize()
            started = time.perf_counter()
            result = {}
            thread = None
            if mode != "none":
                thread = threading.Thread(target=lambda: result.update(copy(mode, grad, host, side, cycles_per_us)))
                thread.start()
            in_reads = 0.0
            for gemm in range(STEP_GEMMS):
                c = a @ b
                for _ in range(args.busy_launches):
                    tiny.add_(1)
                if (gemm + 1) % GEMMS_PER_READ == 0:
                    read = time.perf_counter()
                    c[0, 0].item()
                    in_reads += time.perf_counter() - read
                    if index:
                        waits.append(time.perf_counter() - read)
            launched = time.perf_counter() - started - in_reads  # the thread's time outside its reads
            torch.cuda.synchronize()
            if thread is not None:
                thread.join()
            if index:  # the first is a warm-up
                steps.append(time.perf_counter() - started)
                launching.append(launched)
                if "s" in result:
                    copies.append(result["s"])
                if result.get("pause_ms") is not None:
                    pauses.append(result["pause_ms"])
        row = {"mode": mode, "busy_launches": args.busy_launches, "step_s": statistics.median(steps), "steps_s": steps,
               "copy_s": statistics.median(copies) if copies else None,
               "pause_ms_median": statistics.median(pauses) if pauses else None,
               "launching_s": statistics.median(launching),
               "read_wait_median_ms": 1000 * statistics.median(waits), "read_wait_max_ms": 1000 * max(waits)}
        rows.append(row)
        rate = f"{GRAD_BYTES / row['copy_s'] / 1e9:.1f} GB/s" if copies else "-"
        print(f"{mode:12s} step {row['step_s']:.4f} s (min {min(steps):.4f} max {max(steps):.4f}); copy "
              f"{1000 * row['copy_s'] if copies else 0:.1f} ms, {rate}; reads wait median "
              f"{row['read_wait_median_ms']:.2f} ms, longest {row['read_wait_max_ms']:.2f} ms; thread outside its "
              f"reads {1000 * row['launching_s']:.1f} ms"
              + (f"; pauses ran {row['pause_ms_median']:.3f} ms (median)" if pauses else ""), flush=True)
    if args.out:
        with open(args.out, "w") as file:
            json.dump(rows, file, indent=1)


if __name__ == "__main__":
    main()
