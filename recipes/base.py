"""The base pretraining config every recipe starts from: offline, mock data, NullTokenizer.

Everything a recipe does not state is decided here once: Adam with cosine decay, distributed
optimizer, bf16 mixed precision, mock GPT data sized to the model's vocabulary, no checkpoints
written (benchmarks of a 30B model should not leave 300 GB behind; set ``checkpoint.save=DIR``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
from megatron.bridge.recipes.utils.environment_utils import COMMON_RECIPE_ENV_VARS
from megatron.bridge.recipes.utils.optimizer_utils import distributed_fused_adam_with_cosine_annealing
from megatron.bridge.training.config import (
    CheckpointConfig,
    ConfigContainer,
    DistributedDataParallelConfig,
    GPTDatasetConfig,
    LoggerConfig,
    RNGConfig,
    TrainingConfig,
    ValidationConfig,
)
from megatron.bridge.training.tokenizers.config import TokenizerConfig


@dataclass(frozen=True)
class Parallelism:
    """The topology a recipe was written for (``num_gpus`` is what validation assumes by default)."""

    tp: int = 1
    pp: int = 1
    cp: int = 1
    ep: int = 1
    etp: int = 1
    sequence_parallel: bool = False


def pretrain_config(
    model,
    *,
    parallelism: Parallelism,
    seq_length: int,
    global_batch_size: int,
    micro_batch_size: int,
    train_iters: int = 100,
    lr: float = 3e-4,
    lr_warmup_iters: int = 10,
) -> ConfigContainer:
    """A complete pretraining ConfigContainer for ``model`` (a provider from ``recipes.models``)."""
    output_dir = os.path.join(os.getcwd(), "runs", "default")

    model.tensor_model_parallel_size = parallelism.tp
    model.pipeline_model_parallel_size = parallelism.pp
    model.context_parallel_size = parallelism.cp
    model.expert_model_parallel_size = parallelism.ep
    model.expert_tensor_parallel_size = parallelism.etp
    model.sequence_parallel = parallelism.sequence_parallel
    model.virtual_pipeline_model_parallel_size = None
    model.pipeline_dtype = torch.bfloat16 if parallelism.pp > 1 else None
    model.seq_length = seq_length
    model.init_method_std = 0.02
    model.transformer_impl = "transformer_engine"
    model.cuda_graph_impl = "none"
    model.recompute_granularity = None
    model.recompute_method = None
    model.recompute_num_layers = None
    model.cross_entropy_loss_fusion = True
    model.cross_entropy_fusion_impl = "te"
    # Needs APEX's fused_weight_gradient_mlp_cuda, which a pip-installed stack does not have.
    model.gradient_accumulation_fusion = False

    optimizer, scheduler = distributed_fused_adam_with_cosine_annealing(
        lr_warmup_iters=lr_warmup_iters, max_lr=lr, min_lr=lr / 10
    )
    # Offload is opt-in: every offload setting starts from Megatron Core's default (off).
    optimizer.main_grads_dtype = torch.float32
    optimizer.main_params_dtype = torch.float32
    optimizer.exp_avg_dtype = torch.float32
    optimizer.exp_avg_sq_dtype = torch.float32

    return ConfigContainer(
        model=model,
        train=TrainingConfig(
            train_iters=train_iters,
            global_batch_size=global_batch_size,
            micro_batch_size=micro_batch_size,
            manual_gc=True,
            manual_gc_interval=100,
        ),
        validation=ValidationConfig(eval_interval=1000, eval_iters=0),
        optimizer=optimizer,
        scheduler=scheduler,
        ddp=DistributedDataParallelConfig(
            check_for_nan_in_grad=True,
            grad_reduce_in_fp32=True,
            overlap_grad_reduce=True,
            overlap_param_gather=True,
            average_in_collective=True,
            use_distributed_optimizer=True,
        ),
        # blend=None means mock data: random tokens of the model's vocabulary, no files needed.
        # Real data: dataset.blend=[[/path/to/prefix],null] plus a real tokenizer.
        dataset=GPTDatasetConfig(
            random_seed=1234,
            seq_length=seq_length,
            blend=None,
            split="9999,8,2",
            reset_attention_mask=False,
            reset_position_ids=False,
            eod_mask_loss=False,
            num_dataset_builder_threads=1,
            data_sharding=True,
            dataloader_type="single",
            num_workers=2,
            skip_getting_attention_mask_from_dataset=True,
        ),
        logger=LoggerConfig(log_interval=1, tensorboard_dir=os.path.join(output_dir, "tb_logs")),
        # NullTokenizer: ids are taken as they come; its vocabulary matches the model's embedding.
        tokenizer=TokenizerConfig(tokenizer_type="NullTokenizer", vocab_size=model.vocab_size),
        checkpoint=CheckpointConfig(save=None, load=None, save_interval=None, ckpt_format="torch_dist"),
        rng=RNGConfig(seed=1234),
        mixed_precision="bf16_mixed",
        env_vars=dict(COMMON_RECIPE_ENV_VARS),
    )
