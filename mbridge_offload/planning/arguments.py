"""The planner's command-line options, shared by plan_offload.py and run_recipe.py, and the plan()
keyword arguments they give. Light on purpose: scripts import it to build their parser before the
slow Megatron import."""

from __future__ import annotations

import argparse
import math
from typing import Any

from mbridge_offload.planning.capacity import H100_80GB_GIB, gpu_memory_gib_here, host_memory_available_gib
from mbridge_offload.planning.cost_model import H200_HOST_MEMORY_GBPS, H200_HOST_MEMORY_TOTAL_GBPS
from mbridge_offload.planning.memory_plan import (DEFAULT_HOST_LINK_GBPS, DEFAULT_HOST_MARGIN_GIB,
                                                  FULL_DEVICE_MARGIN_SHARE, HELDOUT_UNDERPREDICTION_SHARE,
                                                  HOST_MEMORY_AVAILABLE_NOW, HOST_MEMORY_GIVEN)


def _number(low: float, inclusive: bool, what: str):
    """An argparse type: a finite number above ``low`` (or at least ``low`` when ``inclusive``)."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expects {what} (a number), got {text!r}") from None
        if not math.isfinite(value) or value < low or (value == low and not inclusive):
            bound = f"{'at least' if inclusive else 'above'} {low:g}"
            raise argparse.ArgumentTypeError(f"expects {what} {bound}, got {text!r}")
        return value

    parse.__name__ = what
    return parse


def _ranks(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expects a whole number of ranks, got {text!r}") from None
    if not 1 <= value <= 1 << 20:
        raise argparse.ArgumentTypeError(f"expects at least 1 rank per node, got {value}")
    return value


GIB_ABOVE_0 = _number(0.0, False, "GiB")
GIB_AT_LEAST_0 = _number(0.0, True, "GiB")
GBPS_ABOVE_0 = _number(0.0, False, "GB/s")
SECONDS_ABOVE_0 = _number(0.0, False, "seconds")


def add_plan_arguments(parser) -> None:
    """The planner's options, shared by plan_offload.py and run_recipe.py."""
    group = parser.add_argument_group("memory plan")
    group.add_argument("--gpu-memory-gib", type=GIB_ABOVE_0, metavar="G",
                       help=f"GPU memory per device (default: this GPU's, else {H100_80GB_GIB:g}, an H100 80GB's)")
    group.add_argument("--host-memory-gib", type=GIB_ABOVE_0, metavar="H",
                       help="host memory per node (default: not checked for a plan or dry run; "
                            "this machine's MemAvailable when launching)")
    group.add_argument("--gpus-per-node", type=_ranks, metavar="N", help="ranks per node (default min(GPUs, 8))")
    group.add_argument("--margin-gib", type=GIB_AT_LEAST_0, default=None, metavar="M",
                       help=("GPU memory kept free beyond the planned whole-device total (default: "
                             f"{FULL_DEVICE_MARGIN_SHARE:.1%} of that total with the full-device reserve rule, the "
                             "largest held-out under-prediction of PyTorch's peak; where that rule does not apply "
                             "(several GPUs, fixed segments, activation recompute) "
                             f"{HELDOUT_UNDERPREDICTION_SHARE:.0%}, the largest measured of the whole device)"
                             ).replace("%", "%%"))  # argparse formats help with %
    group.add_argument("--host-margin-gib", type=GIB_AT_LEAST_0, default=DEFAULT_HOST_MARGIN_GIB, metavar="M",
                       help="host memory kept free per offloading rank beyond the planned peak of the first optimizer "
                            f"step, for what the H200 measurements do not cover (default {DEFAULT_HOST_MARGIN_GIB:g})")
    group.add_argument("--host-link-gbps", type=GBPS_ABOVE_0, default=DEFAULT_HOST_LINK_GBPS, metavar="B",
                       help=f"host<->GPU bandwidth per direction in GB/s (default {DEFAULT_HOST_LINK_GBPS:g}, PCIe Gen5 x16)")
    group.add_argument("--host-memory-gbps", type=GBPS_ABOVE_0, default=H200_HOST_MEMORY_GBPS, metavar="B",
                       help=f"host memory bandwidth per node in GB/s that the cores reach, which the CPU Adam of all "
                            f"its ranks shares (default {H200_HOST_MEMORY_GBPS:g}, the project's 16-core H200 host; "
                            "scripts/measure_host.py measures yours)")
    group.add_argument("--host-memory-total-gbps", type=GBPS_ABOVE_0, default=H200_HOST_MEMORY_TOTAL_GBPS, metavar="B",
                       help="host memory bandwidth per node in GB/s for all traffic, the copies' DMA with the cores' "
                            f"work (default {H200_HOST_MEMORY_TOTAL_GBPS:g}, the best measured on the H200 host; "
                            "scripts/measure_host.py measures yours as host_memory_total_gbps)")
    group.add_argument("--step-time-budget-s", type=SECONDS_ABOVE_0, metavar="S",
                       help="refuse when the offload work alone (copies and CPU Adam) needs longer than S seconds "
                            "per step")


def launch_gpu_memory_problem(given_gib: float | None, here_gib: float | None) -> str | None:
    """What is wrong with --gpu-memory-gib for a launch on this machine, or None. A launch trains on the GPU it
    runs on, so a plan against more memory than that GPU has lets auto pick a fraction that cannot fit it (an
    "80GB" H100 holds 79.18 GiB: "--gpu-memory-gib 80" is 0.82 GiB short). Less is allowed: a plan as if part of
    the GPU were taken (scripts/check_auto.py's runs beside a ballast)."""
    if given_gib is None or here_gib is None or given_gib <= here_gib + 0.005:
        return None
    return (f"--gpu-memory-gib {given_gib:g} is more than this GPU's {here_gib:.2f} GiB: a launch here trains on "
            "this GPU, and a plan against more memory than it has can pick an offload fraction that runs out of "
            f"memory (GPU makers' GB are 10^9 bytes: an 80GB H100 holds 79.18 GiB). Fix: leave --gpu-memory-gib out "
            f"(this GPU's), or give at most {here_gib:.2f}; plan_offload.py or --dry-run plans for another GPU")


def plan_kwargs(args, launching: bool = False) -> dict[str, Any]:
    """Planner options from the command line. The host is only checked against this machine's
    memory when launching here; a plan for another node checks it when --host-memory-gib is given."""
    gpu = args.gpu_memory_gib or gpu_memory_gib_here() or H100_80GB_GIB
    host, source = args.host_memory_gib, HOST_MEMORY_GIVEN
    if host is None and launching:
        host, source = host_memory_available_gib(), HOST_MEMORY_AVAILABLE_NOW
    return dict(gpu_memory_gib=gpu, host_memory_gib=host, host_memory_source=source, margin_gib=args.margin_gib,
                host_margin_gib=args.host_margin_gib, host_memory_total_gbps=args.host_memory_total_gbps,
                host_link_gbps=args.host_link_gbps, gpus_per_node=args.gpus_per_node,
                host_memory_gbps=args.host_memory_gbps)
