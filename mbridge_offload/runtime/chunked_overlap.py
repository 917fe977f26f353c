"""D2H/H2D overlap in a few large chunks instead of one CPU optimizer per tensor.

With ``optimizer.overlap_cpu_optimizer_d2h_h2d=True`` Megatron Core's HybridDeviceOptimizer builds one
CPU optimizer per parameter tensor, so that each tensor's Adam waits only for its own gradient copy and
its parameter copy starts right after: hundreds of small Adam calls per step. Without overlap the step
runs D2H, Adam and H2D one after another.

Here the tensors are grouped, in order, into K chunks of about equal size, one CPU optimizer each:
chunk k's Adam runs while chunk k+1's gradients arrive and chunk k-1's parameters go back. Same
arithmetic (the same fused AdamW on the same tensors), fewer, larger calls. On the H200 at 100% on
the dense proxy this made the step 0.747 s against 0.917 s without overlap and 0.820 s with per-tensor
overlap, at the floor (docs/benchmarks/offload-overhead/dense-1b-chunked/). run_recipe.py's tuning
uses 8 chunks (mbridge_offload/runtime/offload_tuning.py); ``--overlap-chunks K`` picks another K.
"""

from __future__ import annotations

from typing import Any, Callable


def chunk_of_each_tensor(sizes: list[int], chunks: int) -> list[int]:
    """Chunk index of each tensor, in order, splitting the total size into ``chunks`` near-equal runs."""
    total = sum(sizes) or 1
    index, seen = [], 0
    for size in sizes:
        index.append(min(chunks - 1, seen * chunks // total))
        seen += size
    return index


def chunked_optimizer_builder(chunks: int) -> Callable[[type, list[dict[str, Any]]], list]:
    """A replacement for ``HybridDeviceOptimizer.build_cpu_optimizer_list`` that makes ``chunks`` optimizers."""
    if isinstance(chunks, bool) or not isinstance(chunks, int) or chunks < 1:
        raise ValueError(f"--overlap-chunks expects a whole number >= 1, got {chunks!r}")

    def build_cpu_optimizer_list(cpu_optimizer_cls, cpu_param_groups):
        tensors = []  # (index of the source group, tensor), in the library's order
        for group_index, group in enumerate(cpu_param_groups):
            params = group["params"]
            tensors.extend((group_index, p) for p in ([params] if hasattr(params, "numel") else params))
        if not tensors:
            return []
        where = chunk_of_each_tensor([p.numel() for _, p in tensors], chunks)
        optimizers = []
        for chunk in sorted(set(where)):
            groups: list[dict[str, Any]] = []
            for (group_index, param), in_chunk in zip(tensors, where):
                if in_chunk != chunk:
                    continue
                if not groups or groups[-1]["_source"] != group_index:
                    # A chunk keeps each source group's own settings (lr, weight decay, ...).
                    groups.append({**{k: v for k, v in cpu_param_groups[group_index].items() if k != "params"},
                                   "params": [], "_source": group_index})
                groups[-1]["params"].append(param)
            for group in groups:
                del group["_source"]
            optimizers.append(cpu_optimizer_cls(groups))
        return optimizers

    return build_cpu_optimizer_list


def use_chunked_overlap(chunks: int) -> None:
    """Make HybridDeviceOptimizers built from now on in this process overlap in ``chunks`` chunks."""
    from megatron.core.optimizer.cpu_offloading.hybrid_optimizer import HybridDeviceOptimizer

    HybridDeviceOptimizer.build_cpu_optimizer_list = staticmethod(chunked_optimizer_builder(chunks))
