"""Does a small device-to-host read on the training stream wait behind a large D2H on another stream? Plain torch (no
Megatron), issue #16: the delayed mode's profile (../delayed-profile/) shows the training stream idle for about the
whole of the gradients' 4.47 GB copy to the host at each step's end, two of its three gaps ending with a small DtoH on
the training stream. If the copy engine serves same-direction copies in the order they were issued, a step-end
``.item()`` issued after the gradients' copies waits for all of them, and the D2H runs serially with compute. Issuing
the copies in pieces, each after the previous one finished, would bound that wait to one piece.

Each scenario, ``--repeats`` times: enqueue ``--compute-ms`` of matmuls on the training stream, then (except in
``none``) the D2H of ``--gb`` GB of fp32 "gradients" (``--tensors`` tensors) into pinned host memory on a copy stream
that waits for the compute, then one small kernel and ``.item()`` on the training stream, as a step's end does. The
time of ``.item()`` from the moment the compute finished, and the D2H's own time, are recorded.

- ``none``: no D2H (the read's own latency).
- ``all-at-once``: every tensor's copy enqueued at once, as the engine's step does today.
- ``pieces``: a helper thread enqueues the copies in pieces of ``--piece-mb`` MiB, each after the previous piece
  finished.

    python d2h_queue.py --gb 4.47 --tensors 300 --compute-ms 150 --piece-mb 256 --repeats 5 --out results.json
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import threading
import time

import torch


def parse():
    p = argparse.ArgumentParser()
    p.add_argument("--gb", type=float, default=4.47, help="GB of fp32 gradients copied to the host")
    p.add_argument("--tensors", type=int, default=300, help="how many tensors they are split into")
    p.add_argument("--compute-ms", type=float, default=150.0, help="training-stream work before the step's end")
    p.add_argument("--piece-mb", type=float, default=256.0, help="the pieces scenario's piece size")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--out", default=None)
    return p.parse_args()


def calibrate(a: torch.Tensor, out: torch.Tensor) -> float:
    """The milliseconds of one ``a @ a`` on the GPU."""
    for _ in range(3):
        torch.mm(a, a, out=out)
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(20):
        torch.mm(a, a, out=out)
    torch.cuda.synchronize()
    return (time.perf_counter() - start) * 1000 / 20


def copy_to_host(grads, host, copy_stream, piece_bytes: float, d2h_start, d2h_end) -> None:
    """Enqueue every gradient's copy on ``copy_stream``; after each ``piece_bytes`` wait until the piece is done
    (``piece_bytes`` infinite: all at once)."""
    with torch.cuda.stream(copy_stream):
        d2h_start.record()
        issued = 0
        for g, h in zip(grads, host):
            h.copy_(g, non_blocking=True)
            issued += g.numel() * g.element_size()
            if issued >= piece_bytes:
                copy_stream.synchronize()  # the next piece waits until this one is done
                issued = 0
        d2h_end.record()


def one_step(scenario: str, args, grads, host, a, out, matmuls: int, copy_stream) -> dict:
    train = torch.cuda.current_stream()
    for _ in range(matmuls):
        torch.mm(a, a, out=out)
    compute_done = torch.cuda.Event()
    compute_done.record(train)
    d2h_start = torch.cuda.Event(enable_timing=True)
    d2h_end = torch.cuda.Event(enable_timing=True)
    copies_done = threading.Event()
    failures: list[BaseException] = []
    if scenario != "none":
        copy_stream.wait_stream(train)
    if scenario == "all-at-once":
        copy_to_host(grads, host, copy_stream, float("inf"), d2h_start, d2h_end)
        copies_done.set()
    elif scenario == "pieces":
        def issue():
            try:
                copy_to_host(grads, host, copy_stream, args.piece_mb * 2**20, d2h_start, d2h_end)
            except BaseException as error:  # noqa: BLE001  (raised in the main thread below)
                failures.append(error)
            finally:
                copies_done.set()

        threading.Thread(target=issue, daemon=True).start()
    else:
        copies_done.set()
    # the step's end: a small kernel and a read of its result on the host
    value = a[0, :8].float().sum()
    compute_done.synchronize()
    read_start = time.perf_counter()
    value.item()
    read_s = time.perf_counter() - read_start
    if not copies_done.wait(timeout=120):
        raise RuntimeError("the pieces' thread did not finish in 120 s")
    if failures:
        raise failures[0]
    torch.cuda.synchronize()
    d2h_ms = d2h_start.elapsed_time(d2h_end) if scenario != "none" else 0.0
    return {"read_ms": read_s * 1000, "d2h_ms": d2h_ms}


def main() -> None:
    args = parse()
    dev = torch.device("cuda")
    a = torch.randn(4096, 4096, device=dev, dtype=torch.bfloat16)
    out = torch.empty_like(a)
    matmul_ms = calibrate(a, out)
    matmuls = max(1, round(args.compute_ms / matmul_ms))
    numel = int(args.gb * 1e9 / 4 / args.tensors)
    grads = [torch.randn(numel, device=dev) for _ in range(args.tensors)]
    host = [torch.empty(numel, pin_memory=True) for _ in range(args.tensors)]
    copy_stream = torch.cuda.Stream()
    # whether copies of two streams can queue behind each other depends on the hardware queues the process has
    results = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
               "CUDA_DEVICE_MAX_CONNECTIONS": os.environ.get("CUDA_DEVICE_MAX_CONNECTIONS"), "args": vars(args),
               "matmul_ms": matmul_ms, "scenarios": {}}
    for scenario in ("none", "all-at-once", "pieces"):
        step = (scenario, args, grads, host, a, out, matmuls, copy_stream)
        one_step(*step)  # warm-up
        runs = [one_step(*step) for _ in range(args.repeats)]
        summary = {key: statistics.median(r[key] for r in runs) for key in ("read_ms", "d2h_ms")}
        summary["runs"] = runs
        results["scenarios"][scenario] = summary
        print(f"{scenario:12s} step-end read waited {summary['read_ms']:8.2f} ms (median of {args.repeats}); "
              f"the D2H took {summary['d2h_ms']:8.2f} ms", flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
