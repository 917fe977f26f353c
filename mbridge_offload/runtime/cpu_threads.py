"""CPU threads for the CPU optimizer, per local rank.

With optimizer offload, Adam runs on the CPU with PyTorch's intra-op threads. torchrun sets
``OMP_NUM_THREADS=1`` for every rank when a node runs several ranks and the user set nothing, and on
the H200 100% offload ran 4.3x slower than no offload with 1 thread against 1.85x with 16 threads
(docs/benchmarks/offload-overhead/).
``--cpu-threads auto`` (the default) gives each rank its share of the cores this process may use
and pins the rank to its own cores so that ranks do not compete; an ``OMP_NUM_THREADS`` the user set
wins; ``--cpu-threads launcher`` leaves the launcher's setting alone (the stock behaviour).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Mapping, Sequence

USER_OMP_ENV = "MBRIDGE_OFFLOAD_USER_OMP_NUM_THREADS"  # set by run_recipe before it spawns torchrun


@dataclass(frozen=True)
class ThreadPlan:
    threads: int | None  # None: leave PyTorch's setting alone
    cores: tuple[int, ...]  # cores to pin this rank to; () for no pinning
    reason: str


def parse_request(text: str) -> str | int:
    if text in ("auto", "launcher"):
        return text
    try:
        value = int(text)
    except ValueError:
        raise ValueError(f"--cpu-threads expects auto, launcher or a whole number, got {text!r}") from None
    if value < 1:
        raise ValueError(f"--cpu-threads expects at least 1, got {value}")
    return value


def user_omp_num_threads(environ: Mapping[str, str]) -> str | None:
    """OMP_NUM_THREADS as the user set it, telling torchrun's own default apart where we can."""
    if USER_OMP_ENV in environ:  # run_recipe recorded the user's value before starting torchrun
        return environ[USER_OMP_ENV] or None
    value = environ.get("OMP_NUM_THREADS")
    launched_by_torchrun = "TORCHELASTIC_RUN_ID" in environ and int(environ.get("LOCAL_WORLD_SIZE", "1")) > 1
    if value == "1" and launched_by_torchrun:
        return None  # torchrun's default for several ranks per node, not a user choice
    return value


def plan_threads(request: str | int, environ: Mapping[str, str], available_cores: Sequence[int],
                 local_rank: int, ranks_on_node: int) -> ThreadPlan:
    cores = sorted(available_cores)
    if request == "launcher":
        return ThreadPlan(None, (), "left as the launcher set it (--cpu-threads launcher)")
    if isinstance(request, int):
        return ThreadPlan(request, (), f"{request} (--cpu-threads {request})")
    user = user_omp_num_threads(environ)
    if user:
        return ThreadPlan(int(user), (), f"{user} (OMP_NUM_THREADS set by you)")
    share = max(1, len(cores) // max(1, ranks_on_node))
    if ranks_on_node > 1 and len(cores) >= ranks_on_node:
        mine = tuple(cores[local_rank * share:(local_rank + 1) * share])
        return ThreadPlan(share, mine, f"{share} (auto: {len(cores)} cores / {ranks_on_node} ranks on this node, "
                                       f"pinned to cores {mine[0]}-{mine[-1]})")
    return ThreadPlan(share, (), f"{share} (auto: {len(cores)} cores for {ranks_on_node} rank(s))")


def apply_threads(plan: ThreadPlan) -> None:
    import torch

    if plan.cores and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, plan.cores)
    if plan.threads is not None:
        torch.set_num_threads(plan.threads)
        os.environ["OMP_NUM_THREADS"] = str(plan.threads)  # for threads started from here on
