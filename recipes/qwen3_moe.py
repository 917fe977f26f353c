"""Qwen3-30B-A3B recipes (48 layers, 128 experts, top-8): optimizer offload on the seed's validated
topology, fine-grained activation offload (works with PP>1), and one-GPU proxies of the same shape."""

from __future__ import annotations

from recipes.base import Parallelism, pretrain_config
from recipes.models import provider_from_hf_config, qwen3_30b_a3b_hf_config
from recipes.offload import with_fine_grained_offload, with_optimizer_offload

# The seed's measured topology: 16 GPUs, TP2 x PP2 (DP4), experts over EP4.
SEED_TOPOLOGY = Parallelism(tp=2, pp=2, ep=4, sequence_parallel=True)
PROXY_LAYERS = 4  # ~3B parameters: trains on one H200 without offload, so a sweep has its baseline


def _moe(parallelism: Parallelism, num_layers: int | None = None, seq_length: int = 4096,
         global_batch_size: int = 128, micro_batch_size: int = 1):
    model = provider_from_hf_config(qwen3_30b_a3b_hf_config(num_layers=num_layers))
    # All-to-all dispatch works without DeepEP/HybridEP, which a pip-installed stack lacks.
    model.moe_token_dispatcher_type = "alltoall"
    model.moe_flex_dispatcher_backend = None
    model.moe_grouped_gemm = True
    model.moe_permute_fusion = True
    return pretrain_config(model, parallelism=parallelism, seq_length=seq_length,
                           global_batch_size=global_batch_size, micro_batch_size=micro_batch_size)


def qwen3_30b_a3b_pretrain_config():
    """Qwen3-30B-A3B, 16 GPUs TP2 PP2 EP4, optimizer offload 0.5."""
    return with_optimizer_offload(_moe(SEED_TOPOLOGY), fraction=0.5)


def qwen3_30b_a3b_fine_grained_offload_config():
    """Qwen3-30B-A3B, 16 GPUs TP2 PP2 EP4, fine-grained offload of expert_fc1 and moe_act inputs."""
    return with_fine_grained_offload(_moe(SEED_TOPOLOGY), modules=("expert_fc1", "moe_act"))


def qwen3_30b_a3b_proxy_pretrain_config():
    """Qwen3-30B-A3B shape on one GPU: 4 layers, all 128 experts, EP1, optimizer offload 0.5."""
    return with_optimizer_offload(_moe(Parallelism(), num_layers=PROXY_LAYERS, global_batch_size=8),
                                  fraction=0.5)


def qwen3_30b_a3b_proxy_fine_grained_offload_config():
    """The one-GPU MoE proxy with fine-grained offload of expert_fc1 and moe_act inputs."""
    return with_fine_grained_offload(_moe(Parallelism(), num_layers=PROXY_LAYERS, global_batch_size=8),
                                     modules=("expert_fc1", "moe_act"))
