"""Upstream ``ConfigContainer.validate()`` (via ``runtime_config_update``), run on a copy in an isolated
process state, and its error translated into a ``Problem``: the rule of the table that states the same
constraint (with its fix), else the config key the message is about."""

from __future__ import annotations

import contextlib
import copy
import io
import os
import re
import warnings
from typing import Any, Iterator, Mapping

from mbridge_offload.facts.config_tree import KeyPathError, get_path, show, walk
from mbridge_offload.validation.problem import Problem
from mbridge_offload.validation.registry import RULES_BY_ID
from mbridge_offload.validation.rule import Context

# Upstream messages -> the rule that states the same constraint (its fix is used).
_UPSTREAM_TO_RULE: tuple[tuple[str, str], ...] = (
    (r"CPU offloading can be done only for layers less than", "activation-offload/num-layers-range"),
    (r"no support for Pipeline parallelism with CPU offloading", "activation-offload/pipeline-parallel"),
    (r"CPU offloading does not work when activation recomputation", "activation-offload/recompute"),
    (r"CUDA graphs not supported with CPU offloading", "activation-offload/cuda-graphs"),
    (r"fine_grained_activation_offloading cannot be enabled with cpu_offloading", "activation-offload/not-with-fine-grained"),
    (r"NVTE_CPU_OFFLOAD_V1", "fine-grained/nvte-cpu-offload-v1"),
    (r"Fine-grained activation offloading is only supported with transformer_engine", "fine-grained/transformer-engine"),
    (r"Invalid choices for offload_modules", "fine-grained/modules-known"),
    (r"attn_proj cannot be set to offload_modules alone", "fine-grained/attn-proj-needs-core-attn"),
    (r"fused_group_mlp", "fine-grained/fused-group-mlp"),
    (r"activation_offload_fraction must be in range", "fine-grained/fraction-range"),
    (r"min_offloaded_tensor_size must be non-negative", "fine-grained/min-tensor-size"),
    (r"world size \(\d+\) is not divisible by total_model_size", "parallel/world-size"),
    (r"Sequence length in model config", "parallel/seq-length-match"),
    (r"num_attention_heads .*must be a multiple of tensor_model_parallel_size|"
     r"num_query_groups .*must be a multiple of tensor_model_parallel_size", "parallel/heads-per-tp"),
    (r"num_moe_experts .* must be a multiple of expert_model_parallel_size", "parallel/experts-per-ep"),
    (r"Sequence length must be divisible by 2 \* context parallel size", "parallel/seq-length-cp"),
    (r"Cross Entropy Fusion is currently not deterministic", "deterministic/cross-entropy-fusion"),
    (r"NCCL_ALGO must be one of", "deterministic/nccl-algo"),
)

# Upstream messages with no rule of ours: the key they are about and the fix.
_UPSTREAM_KEYS: tuple[tuple[str, str, str], ...] = (
    (r"eval_global_batch_size", "validation.eval_global_batch_size",
     "validation.eval_global_batch_size=<multiple of eval_micro_batch_size x DP>"),
    (r"main_grads_dtype|main_params_dtype|exp_avg_dtype|exp_avg_sq_dtype", "optimizer.use_precision_aware_optimizer",
     "optimizer.use_precision_aware_optimizer=True  (or set the optimizer dtypes back to float32)"),
    (r"use-precision-aware-optimizer", "optimizer.use_precision_aware_optimizer",
     "optimizer.use_precision_aware_optimizer=False"),
    (r"bf16=True and fp16=True", "mixed_precision", "mixed_precision=bf16_mixed"),
    (r"lr_warmup|lr_decay|warmup", "scheduler.lr_warmup_iters",
     "scheduler.lr_warmup_iters=<fewer than train.train_iters>"),
)


def _config_fields(cfg: Any) -> Iterator[str]:
    """The keys an upstream message may name: config fields three levels deep, the config's own
    ``_``-prefixed state included (upstream checks it too), dict entries not."""
    return (key for key, _, _ in walk(cfg, levels=3, into_dict=lambda key: False, private=True))


def translate_upstream(message: str, cfg: Any, ctx: Context) -> Problem:
    """An upstream error message as a Problem: the rule it matches, else the key it names."""
    first_line = message.strip().splitlines()[0] if message.strip() else "(no message)"
    for pattern, rule_id in _UPSTREAM_TO_RULE:
        if re.search(pattern, message):
            rule = RULES_BY_ID[rule_id]
            try:
                value = rule.value(ctx)
                fix = rule.fix(ctx)
            except (KeyPathError, AttributeError, TypeError, ZeroDivisionError):
                value, fix = "?", rule.fix_text or "see the rule"
            return Problem(key=rule.key, value=value, rule=f"{rule.text} (upstream: {first_line})", fix=fix,
                           severity="error", rule_id=rule_id, source="upstream")
    key, fix = "", ""
    for pattern, upstream_key, upstream_fix in _UPSTREAM_KEYS:
        if re.search(pattern, message):
            key, fix = upstream_key, upstream_fix
            break
    if not key:  # name the longest config field that the message mentions
        mentioned = [k for k in _config_fields(cfg) if re.search(rf"\b{re.escape(k.rsplit('.', 1)[-1])}\b", message)]
        key = max(mentioned, key=lambda k: len(k.rsplit(".", 1)[-1]), default="(config)")
        fix = f"change {key} as the rule says" if mentioned else "see the rule"
    try:
        value = show(get_path(cfg, key))
    except KeyPathError:
        value = "?"
    return Problem(key=key, value=value, rule=f"upstream ConfigContainer.validate(): {first_line}", fix=fix,
                   severity="error", rule_id="", source="upstream")


@contextlib.contextmanager
def _isolated_process_state(num_gpus: int, environ: Mapping[str, str]) -> Iterator[None]:
    """Upstream validation reads the environment (WORLD_SIZE, NVTE_*) and writes env vars and
    torch flags: give it the environment being validated, then undo all of it."""
    import torch

    saved_env = dict(os.environ)
    deterministic = torch.are_deterministic_algorithms_enabled()
    os.environ.clear()
    os.environ.update(environ)
    os.environ["WORLD_SIZE"] = str(num_gpus)
    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
            warnings.simplefilter("ignore")
            yield
    finally:
        os.environ.clear()
        os.environ.update(saved_env)
        torch.use_deterministic_algorithms(deterministic)


def upstream_error(cfg: Any, num_gpus: int, environ: Mapping[str, str]) -> str | None:
    """Run Megatron Bridge's own pre-launch validation on a copy; its error message, or None."""
    from megatron.bridge.training.config import runtime_config_update

    trial = copy.deepcopy(cfg)
    with _isolated_process_state(num_gpus, environ):
        try:
            runtime_config_update(trial)
        except (AssertionError, ValueError, TypeError, RuntimeError, KeyError, AttributeError) as error:
            return str(error) or type(error).__name__
    return None
