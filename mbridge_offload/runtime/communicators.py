"""Create the NCCL communicators before the first step (run_recipe ``--warm-communicators``).

PyTorch creates a process group's NCCL communicator at the group's first collective. In Megatron that is inside
step 1: the data-parallel group's first gradient reduce-scatter, after the step's activations have grown PyTorch's
caching allocator. NCCL allocates through CUDA, not through PyTorch, and PyTorch keeps its cached free memory for its
own allocations. So on a device that PyTorch's peak fits, NCCL's allocation can still fail (``Failed to CUDA calloc``,
docs/benchmarks/alloc-tight/), and the planner has to count PyTorch's whole reserve. A collective of each kind that
Megatron uses (all-reduce, reduce-scatter, all-gather) on every NCCL group this rank is in, before step 1, makes NCCL
allocate while the device is still free.

Measured on the H200 (docs/benchmarks/alloc-tight/): each communicator takes 0.38 GiB of the device (NCCL 2.28 puts
each channel's small allocations in 2 MiB pages of their own, 64 channels), and one GPU has 21 NCCL groups of which
a run uses 4: the warm-up cost 6.5 GiB more than the run needs. So it is an experiment, not a default.

Not covered: the pipeline's point-to-point connections, which NCCL makes at their first send and receive.
"""

from __future__ import annotations

from dataclasses import dataclass

from mbridge_offload.facts.units import GIB


@dataclass(frozen=True, kw_only=True)
class WarmedCommunicators:
    """What the warm-up did on this rank."""

    groups: tuple[str, ...]  # the groups' descriptions (Megatron names them, e.g. DATA_PARALLEL_GROUP), in order
    device_bytes: int  # device memory that went outside PyTorch during the warm-up (CUDA's free memory fell by it)
    seconds: float

    def line(self) -> str:
        return (f"communicators: {len(self.groups)} NCCL groups created before step 1 (--warm-communicators), "
                f"{self.device_bytes / GIB:.2f} GiB of the device outside PyTorch, {self.seconds:.1f} s")


_last: WarmedCommunicators | None = None


def nccl_groups() -> list:
    """Every process group this rank is in that runs on NCCL, in creation order.

    c10d's group registry is the only complete list: Megatron creates its groups in several places (parallel_state,
    the distributed optimizer's instances, the expert groups). Each rank registers only the groups it belongs to, and
    every rank creates groups in the same order, so walking the list in order never leaves two ranks waiting on each
    other's communicator.
    """
    import torch
    from torch.distributed import distributed_c10d as c10d

    found = []
    for group in c10d._world.pg_map:
        if torch.device("cuda") not in group._device_types:
            continue
        if isinstance(group._get_backend(torch.device("cuda")), c10d.ProcessGroupNCCL):
            found.append(group)
    return found


def _describe(group) -> str:
    return getattr(group, "group_desc", None) or group.group_name


def warm_communicators() -> WarmedCommunicators:
    """One all-reduce, reduce-scatter and all-gather on each NCCL group of this rank, then wait for them."""
    import time

    import torch
    import torch.distributed as dist

    global _last
    device = torch.device("cuda", torch.cuda.current_device())
    torch.cuda.synchronize()
    started = time.perf_counter()
    free_before, _ = torch.cuda.mem_get_info(device)
    reserved_before = torch.cuda.memory_reserved(device)
    groups = nccl_groups()
    for group in groups:
        size = dist.get_world_size(group)
        value = torch.ones(size, device=device)
        dist.all_reduce(value, group=group)
        shard = torch.empty(1, device=device)
        dist.reduce_scatter_tensor(shard, value, group=group)
        gathered = torch.empty(size, device=device)
        dist.all_gather_into_tensor(gathered, shard, group=group)
    torch.cuda.synchronize()
    free_after, _ = torch.cuda.mem_get_info(device)
    reserved_after = torch.cuda.memory_reserved(device)
    outside = (free_before - free_after) - (reserved_after - reserved_before)
    _last = WarmedCommunicators(groups=tuple(_describe(g) for g in groups), device_bytes=max(outside, 0),
                                seconds=time.perf_counter() - started)
    return _last


def last_warm_up() -> WarmedCommunicators | None:
    """This process's warm-up, if one ran (for the step records)."""
    return _last


def make_warm_up_callback(rank: int):
    """A Megatron Bridge callback that warms the communicators once the model and optimizer are built."""
    from megatron.bridge.training.callbacks import Callback

    class WarmCommunicators(Callback):
        def on_train_start(self, context) -> None:
            warmed = warm_communicators()
            if rank == 0:
                print(warmed.line(), flush=True)

    return WarmCommunicators()
