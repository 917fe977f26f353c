"""A GPU-side pause of a given length: ``torch.cuda._sleep`` spins for a number of clock cycles, so the cycles per
millisecond are measured once on the GPU at hand. The engine's copy threads space their pieces with it
(copy_pieces.py, MBRIDGE_OFFLOAD_COPY_PIECE_PAUSE_US); the plain-torch copy benchmarks under
docs/benchmarks/offload-engine/ gate or space their copies with it. Beside kernels that fill every SM a pause may
start late and run longer than asked: time it where that matters."""

from __future__ import annotations


def sleep_cycles_per_ms() -> float:
    """``torch.cuda._sleep``'s cycles per millisecond on the current GPU, measured over one 10M-cycle pause."""
    import torch

    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda._sleep(1_000_000)  # warm-up
    start.record()
    torch.cuda._sleep(10_000_000)
    end.record()
    end.synchronize()
    return 10_000_000 / start.elapsed_time(end)
