"""Device memory outside PyTorch's allocator on one GPU: the CUDA context with the libraries' handles and workspaces,
and one NCCL communicator per process group the run uses, each sized by NCCL's channels.

Measured per process with NVML on the H200 (torch 2.11, CUDA 13, TE 2.20, NCCL 2.28, one rank;
docs/benchmarks/alloc-tight/). NCCL's own log (NCCL_DEBUG=INFO) shows each communicator, even of one rank, taking
2 + 3 x channels allocations of a few bytes, each in a 2 MiB page of its own under NCCL's cuMem allocator (the
default): 194 pages, 0.379 GiB, at the 64 channels it picks here. A dense run uses 4 communicators (1 at start, 3 in
step 1): 2.43 GiB in all on every dense run, so the context and libraries take 0.91 GiB.

Checked on runs that set none of it:
- NCCL_MAX_NCHANNELS=4: 14 pages a communicator, 0.91 + 4 x 0.027 = 1.02 GiB planned; 1.02 GiB measured.
- The MoE proxy: 3.19-3.20 GiB on every run, 0.77 GiB more than dense from step 2 on, two communicators more
  (0.91 + 6 x 0.379 = 3.18 GiB).
- Megatron's own cross entropy (``model.cross_entropy_loss_fusion=False``): it all-reduces over the
  tensor-parallel group whatever its size (megatron/core/tensor_parallel/cross_entropy.py:130, and the same in
  fusions/fused_cross_entropy.py:94), whose communicator TE's loss never makes on one GPU (it skips its
  all-gather at a world size of 1: transformer_engine/pytorch/triton/cross_entropy.py:52): 2.81 GiB on both such
  runs (0.91 + 5 x 0.379 = 2.80 GiB).
With NCCL_CUMEM_ENABLE=0 NCCL allocates through cudaMalloc instead: 2.91 GiB on the dense run (one run, default
channels, 0.50 GiB a communicator); the plan counts that figure, not the page model. With several ranks a
communicator also holds buffers for its peers, which these one-GPU figures do not cover.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from mbridge_offload.facts.environment import run_env
from mbridge_offload.facts.units import GIB
from mbridge_offload.planning.activations import te_fused_cross_entropy

CUDA_CONTEXT_AND_LIBRARIES_BYTES = int(0.91 * GIB)
NCCL_PAGE_BYTES = 2 * 1024 * 1024
NCCL_PAGES_PER_CHANNEL = 3
NCCL_PAGES_PER_COMMUNICATOR = 2
NCCL_CHANNELS = 64  # what NCCL 2.28 picks for a rank of an H200 on its own
NCCL_CUDAMALLOC_COMMUNICATOR_BYTES = int(0.50 * GIB)  # NCCL_CUMEM_ENABLE=0, default channels (one run)
DENSE_COMMUNICATORS = 4
MOE_EXTRA_COMMUNICATORS = 2
MEGATRON_LOSS_COMMUNICATORS = 1  # the tensor-parallel group's, for Megatron's cross entropy


def nccl_channels(env_vars: Mapping[str, object] | None, environ: Mapping[str, str]) -> int:
    """The channels a communicator gets: NCCL_MAX_NCHANNELS where the run sets it below NCCL's own choice."""
    value = run_env("NCCL_MAX_NCHANNELS", env_vars, environ)
    try:
        asked = int(value) if value is not None else NCCL_CHANNELS
    except ValueError:
        asked = NCCL_CHANNELS  # NCCL ignores a value it cannot read
    return max(1, min(asked, NCCL_CHANNELS))


def communicator_bytes(env_vars: Mapping[str, object] | None, environ: Mapping[str, str]) -> int:
    """Device bytes of one NCCL communicator of one rank."""
    if run_env("NCCL_CUMEM_ENABLE", env_vars, environ) == "0":
        return NCCL_CUDAMALLOC_COMMUNICATOR_BYTES
    pages = NCCL_PAGES_PER_COMMUNICATOR + NCCL_PAGES_PER_CHANNEL * nccl_channels(env_vars, environ)
    return pages * NCCL_PAGE_BYTES


def communicators(cfg) -> int:
    """NCCL communicators a run of ``cfg`` on one GPU makes."""
    m = cfg.model
    count = DENSE_COMMUNICATORS + (MOE_EXTRA_COMMUNICATORS if m.num_moe_experts else 0)
    return count + (0 if te_fused_cross_entropy(m) else MEGATRON_LOSS_COMMUNICATORS)


def outside_pytorch_bytes(cfg, environ: Mapping[str, str] | None = None) -> int:
    """Device memory outside PyTorch's allocator of one rank of ``cfg`` (the shell's environment, else the
    recipe's ``env_vars``)."""
    env_vars = getattr(cfg, "env_vars", None)
    environ = os.environ if environ is None else environ
    return CUDA_CONTEXT_AND_LIBRARIES_BYTES + communicators(cfg) * communicator_bytes(env_vars, environ)
