"""A smaller GPU on a larger one: a separate process holds device memory so that exactly the asked amount
is left free, as a device of that size with nothing else on it would offer a training process.

    python -m mbridge_offload.bench.device_ballast --leave-gib 40      (prints one line, then holds until killed)

It allocates through PyTorch in 1 GiB blocks and a last partial block, then reads ``mem_get_info`` again;
the line it prints says what is free (``free_gib``) and what it holds itself (``held_gib``, its CUDA context
included, from NVML where NVML sees the process). Used by check_auto.py (bench/auto_check.py).
"""

from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from mbridge_offload.facts.units import GIB

READY = "ballast ready "


class BallastError(RuntimeError):
    """The GPU cannot be made the asked size: it is shared, smaller than asked, or the ballast did not start."""
BLOCK = GIB
ROUNDING = 2 << 20  # the caching allocator rounds large blocks to 2 MiB
TOLERANCE_GIB = 0.01  # what is left free may differ from the asked amount by those blocks


def device_processes(index: int = 0) -> dict[int, float] | None:
    """GiB of device memory per process on GPU ``index``, from NVML (no CUDA context is made); None where NVML is
    missing."""
    try:
        import pynvml

        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        return {p.pid: (p.usedGpuMemory or 0) / GIB for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle)}
    except Exception:  # noqa: BLE001  (no NVML: the caller says it could not check)
        return None


def hold(leave_bytes: int) -> dict:
    """Allocate until ``leave_bytes`` are free on device 0; what is then free and held."""
    import torch

    torch.cuda.init()
    free, total = torch.cuda.mem_get_info()
    blocks = []
    to_take = free - leave_bytes
    while to_take >= ROUNDING:
        size = min(BLOCK, to_take // ROUNDING * ROUNDING)
        blocks.append(torch.empty(size, dtype=torch.uint8, device="cuda"))
        free, total = torch.cuda.mem_get_info()
        to_take = free - leave_bytes
    hold.blocks = blocks  # kept alive until the process ends
    return {"free_gib": free / GIB, "total_gib": total / GIB, "held_gib": (total - free) / GIB,
            "leave_gib": leave_bytes / GIB}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="device_ballast", description=__doc__.split("\n\n")[0])
    parser.add_argument("--leave-gib", type=float, required=True, metavar="G")
    args = parser.parse_args(argv)
    state = hold(int(args.leave_gib * GIB))
    print(READY + json.dumps(state), flush=True)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    while True:
        time.sleep(3600)


@dataclass
class Ballast:
    """The ballast process, started and stopped around the runs it shapes (a context manager)."""

    leave_gib: float
    log_path: Path
    state: dict | None = None
    process: subprocess.Popen | None = None

    def __enter__(self) -> "Ballast":
        others = device_processes()
        if others:
            raise BallastError("the GPU is not free: " + ", ".join(f"process {pid} holds {gib:.2f} GiB"
                                                               for pid, gib in sorted(others.items()))
                               + "; the device's size cannot be set beside them")
        self.log = self.log_path.open("w")
        self.process = subprocess.Popen([sys.executable, "-m", "mbridge_offload.bench.device_ballast", "--leave-gib",
                                         str(self.leave_gib)], stdout=subprocess.PIPE, stderr=self.log, text=True)
        line = self.process.stdout.readline()
        if not line.startswith(READY):
            self.__exit__()
            raise BallastError(f"the device ballast did not start (see {self.log_path}): {line.strip()!r}")
        self.state = {**json.loads(line[len(READY):]), "pid": self.process.pid}
        self.log.write(READY + json.dumps(self.state) + "\n")
        self.log.flush()
        if abs(self.state["free_gib"] - self.leave_gib) > TOLERANCE_GIB:
            self.__exit__()
            raise BallastError(f"the device has {self.state['free_gib']:.2f} GiB free, not the {self.leave_gib:g} "
                               "GiB asked: something else holds the GPU, or it is smaller than asked")
        return self

    def strangers(self) -> dict[int, float]:
        """Processes other than the ballast on the GPU now (None from NVML counts as none seen)."""
        return {pid: gib for pid, gib in (device_processes() or {}).items() if pid != self.process.pid}

    def __exit__(self, *exc) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(timeout=60)
        self.log.close()


if __name__ == "__main__":
    sys.exit(main())
