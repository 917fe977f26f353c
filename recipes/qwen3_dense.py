"""Dense Qwen3 recipes (0.6B, 1.7B, 4B, 8B): baseline, layer-level activation offload (PP=1) and
optimizer offload variants, plus a ~1B proxy of the same shape that fits one GPU."""

from __future__ import annotations

from recipes.base import Parallelism, pretrain_config
from recipes.models import provider_from_hf_config, qwen3_dense_hf_config
from recipes.offload import with_activation_offload, with_optimizer_offload


def _dense(size: str, parallelism: Parallelism, num_layers: int | None = None, seq_length: int = 4096,
           global_batch_size: int = 32, micro_batch_size: int = 1):
    model = provider_from_hf_config(qwen3_dense_hf_config(size, num_layers=num_layers))
    return pretrain_config(model, parallelism=parallelism, seq_length=seq_length,
                           global_batch_size=global_batch_size, micro_batch_size=micro_batch_size)


def _half_the_layers(cfg):
    """Activation offload of half the layers: a middle point between memory and speed."""
    return with_activation_offload(cfg, num_layers=cfg.model.num_layers // 2)


def qwen3_0p6b_pretrain_config():
    """Qwen3-0.6B, 1 GPU, no offload."""
    return _dense("0.6b", Parallelism(tp=1))


def qwen3_0p6b_activation_offload_config():
    """Qwen3-0.6B with activation offload of 14 of 28 layers (PP=1)."""
    return _half_the_layers(qwen3_0p6b_pretrain_config())


def qwen3_0p6b_optimizer_offload_config():
    """Qwen3-0.6B with half of the optimizer states on the CPU."""
    return with_optimizer_offload(qwen3_0p6b_pretrain_config(), fraction=0.5)


def qwen3_1p7b_pretrain_config():
    """Qwen3-1.7B, 1 GPU, no offload."""
    return _dense("1.7b", Parallelism(tp=1))


def qwen3_1p7b_activation_offload_config():
    """Qwen3-1.7B with activation offload of 14 of 28 layers (PP=1)."""
    return _half_the_layers(qwen3_1p7b_pretrain_config())


def qwen3_1p7b_optimizer_offload_config():
    """Qwen3-1.7B with half of the optimizer states on the CPU."""
    return with_optimizer_offload(qwen3_1p7b_pretrain_config(), fraction=0.5)


def qwen3_4b_pretrain_config():
    """Qwen3-4B, 2 GPUs (TP2), no offload."""
    return _dense("4b", Parallelism(tp=2))


def qwen3_4b_activation_offload_config():
    """Qwen3-4B with activation offload of 18 of 36 layers (TP2, PP=1)."""
    return _half_the_layers(qwen3_4b_pretrain_config())


def qwen3_4b_optimizer_offload_config():
    """Qwen3-4B with half of the optimizer states on the CPU (TP2)."""
    return with_optimizer_offload(qwen3_4b_pretrain_config(), fraction=0.5)


def qwen3_8b_pretrain_config():
    """Qwen3-8B, 4 GPUs (TP4), no offload."""
    return _dense("8b", Parallelism(tp=4))


def qwen3_8b_activation_offload_config():
    """Qwen3-8B with activation offload of 18 of 36 layers (TP4, PP=1)."""
    return _half_the_layers(qwen3_8b_pretrain_config())


def qwen3_8b_optimizer_offload_config():
    """Qwen3-8B with half of the optimizer states on the CPU (TP4)."""
    return with_optimizer_offload(qwen3_8b_pretrain_config(), fraction=0.5)


def qwen3_1b_proxy_pretrain_config():
    """~1.1B Qwen3-shaped proxy for one GPU: Qwen3-1.7B widths, 16 layers, seq 2048, MBS 2, GBS 8."""
    return _dense("1.7b", Parallelism(tp=1), num_layers=16, seq_length=2048,
                  global_batch_size=8, micro_batch_size=2)


def qwen3_1b_proxy_optimizer_offload_config():
    """The ~1B proxy with all optimizer states on the CPU."""
    return with_optimizer_offload(qwen3_1b_proxy_pretrain_config(), fraction=1.0)


def qwen3_1b_proxy_activation_offload_config():
    """The ~1B proxy with activation offload of 8 of 16 layers."""
    return _half_the_layers(qwen3_1b_proxy_pretrain_config())
