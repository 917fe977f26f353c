"""Megatron Bridge's own pre-launch checks (``runtime_config_update`` -> ``ConfigContainer.validate()`` and
the section ``finalize()`` methods it calls), translated into rules of the table: each with its key, the
rule in words and a fix to paste, so that all of them show at once, before upstream runs (upstream stops
at its first failed assert, often without naming a key).

``SITES`` maps every raise/assert site of that code (``upstream_sites.py`` finds them in the installed
source) to the rule stating the same constraint, here or in another concern's module, or to why no
user can reach it. tests/validation/test_upstream_sites.py fails on a site the table does not know.

Rules read what the config will be when upstream checks it: the ``mixed_precision`` preset applied
(``runtime_config_update`` applies it first) and the environment a launched run will see (``Context.env``).
"""

from __future__ import annotations

import math
import os
from typing import Any, Callable

from mbridge_offload.facts.config_tree import show
from mbridge_offload.facts.key_ranges import fixed, show_typed
from mbridge_offload.validation.rule import CHECKPOINT, ENVIRONMENT, PARALLELISM, Context, Rule, always

TRAINING = "training length and scheduler"
DATASET = "dataset"
CHECKPOINTING = "checkpointing"
PRECISION = "precision"
DISTRIBUTED = "distributed (FSDP, process groups)"
MONITORING = "logging and profiling"
MODEL = "model features"
MECHANISMS = (TRAINING, DATASET, CHECKPOINTING, PRECISION, DISTRIBUTED, MONITORING, MODEL)

_ = CHECKPOINT  # (resume rules live in checkpoint.py; the save/load settings below are "checkpointing")


def _guard(check: Callable[[Context], Any], on_error: Any) -> Callable[[Context], Any]:
    """A check that cannot crash the validator: a config that breaks it in an unexpected way (a None
    where a number belongs) gives ``on_error``; upstream then says what it makes of it."""

    def guarded(ctx: Context) -> Any:
        try:
            return check(ctx)
        except (AttributeError, TypeError, ValueError, KeyError, ZeroDivisionError):
            return on_error

    return guarded


def _rule(id: str, mechanism: str, key: str, text: str, applies: Callable[[Context], bool],
          holds: Callable[[Context], bool], fix: str | Callable[[Context], str], *,
          observed: Callable[[Context], str] | None = None, fix_text: str = "") -> Rule:
    fix_fn = fixed(fix) if isinstance(fix, str) else fix
    return Rule(id=id, mechanism=mechanism, key=key, text=text, applies=_guard(applies, False),
                holds=_guard(holds, True),
                fix=(fix_fn if isinstance(fix, str) else
                     (lambda ctx: fix_text if ctx is None else _guard(fix_fn, fix_text)(ctx))),
                observed=None if observed is None else _guard(observed, "?"), fix_text=fix_text)


# -- what the config reads like when upstream checks it ----------------------------------------------

def _class_names(obj: Any) -> set[str]:
    return {klass.__name__ for klass in type(obj).__mro__}


def _sft_dataset(ctx: Context) -> bool:
    return bool(_class_names(ctx.cfg.dataset) & {"GPTSFTDatasetConfig", "DirectHFSFTDatasetConfig",
                                                 "EnergonDatasetConfig", "MockVLMSFTDatasetConfig"})


def _mixed_precision(ctx: Context) -> Any:
    """The mixed-precision preset as runtime_config_update applies it (a name resolved), or None."""
    mp = ctx.cfg.mixed_precision
    if isinstance(mp, str):
        from megatron.bridge.training.mixed_precision import get_mixed_precision_config

        mp = get_mixed_precision_config(mp)
    return mp


def _precision(ctx: Context, section: str, name: str) -> Any:
    """``section.name`` (bf16, fp16) after the preset: the preset's value wins where it has the field."""
    mp = _mixed_precision(ctx)
    if mp is not None and hasattr(mp, name):
        return getattr(mp, name)
    return getattr(getattr(ctx.cfg, section), name, None)


def _megatron_fsdp(ctx: Context) -> bool:
    return bool(ctx.cfg.dist.use_megatron_fsdp or ctx.cfg.ddp.use_megatron_fsdp)


def _saves_or_loads(ctx: Context) -> bool:
    return ctx.cfg.checkpoint.save is not None or ctx.cfg.checkpoint.load is not None


def _sample_based(ctx: Context) -> bool:
    return ctx.cfg.train.train_samples is not None


def _lengths_given(ctx: Context) -> list[str]:
    t = ctx.cfg.train
    given = [("train.train_iters", t.train_iters is not None and not getattr(t, "_train_iters_from_num_epochs", False)),
             ("train.train_samples", t.train_samples is not None),
             ("train.num_epochs", getattr(t, "num_epochs", None) is not None)]
    return [key for key, on in given if on]


def _fix_lengths(ctx: Context) -> str:
    given = _lengths_given(ctx)
    if not given:
        return "train.train_iters=<iterations>"
    return " ".join(f"train.{k.split('.')[1]}=null" for k in given[1:]) + f"  (keep {given[0]})"


def _decay_steps(ctx: Context) -> float:
    """scheduler.lr_decay_steps as _calculate_scheduler_steps computes it."""
    s, t = ctx.cfg.scheduler, ctx.cfg.train
    if _sample_based(ctx):
        return s.lr_decay_samples if s.lr_decay_samples is not None else t.train_samples
    iters = s.max_steps if s.max_steps is not None else (s.lr_decay_iters if s.lr_decay_iters is not None
                                                         else t.train_iters)
    return iters * t.global_batch_size


def _decay_length_given(ctx: Context) -> bool:
    """Whether the decay's length is set by the scheduler's own keys. Otherwise it follows the training's length and
    batch (train_iters or train_samples, global_batch_size), whose own rules name a value <= 0: a second error here
    would point at a scheduler key the user never set, with a fix that is already its value."""
    s, t = ctx.cfg.scheduler, ctx.cfg.train
    if _sample_based(ctx):
        return s.lr_decay_samples is not None
    return (s.max_steps is not None or s.lr_decay_iters is not None) and t.global_batch_size > 0


def _decay_steps_fix(ctx: Context) -> str:
    if _sample_based(ctx):
        return "scheduler.lr_decay_samples=null  (it then follows train.train_samples)"
    if ctx.cfg.scheduler.max_steps is not None:
        return "scheduler.max_steps=null  (the decay then follows lr_decay_iters, else train.train_iters)"
    return "scheduler.lr_decay_iters=null  (it then follows train.train_iters)"


def _eval_layout(ctx: Context) -> tuple[int, int, int]:
    """(eval global batch, eval micro batch, eval data-parallel size) as validate() resolves them."""
    v, t, m = ctx.cfg.validation, ctx.cfg.train, ctx.model
    gbs = v.eval_global_batch_size if v.eval_global_batch_size is not None else t.global_batch_size
    mbs = v.eval_micro_batch_size if v.eval_micro_batch_size is not None else t.micro_batch_size
    cp = ctx.cfg.dist.eval_context_parallel_size or m.context_parallel_size
    return gbs, mbs, ctx.num_gpus // (m.tensor_model_parallel_size * m.pipeline_model_parallel_size * cp)


def _eval_splits(ctx: Context) -> bool:
    m, cp = ctx.model, ctx.cfg.dist.eval_context_parallel_size or ctx.model.context_parallel_size
    return ctx.num_gpus % (m.tensor_model_parallel_size * m.pipeline_model_parallel_size * cp) == 0


def _fix_eval_batch(ctx: Context) -> str:
    gbs, mbs, dp = _eval_layout(ctx)
    unit = mbs * dp
    return f"validation.eval_global_batch_size={max(unit, round(gbs / unit) * unit)}"


def _hcp_sizes(ctx: Context) -> list[int] | None:
    return getattr(ctx.model, "hierarchical_context_parallel_sizes", None)


def _cp_comm_types(ctx: Context) -> list[str]:
    value = getattr(ctx.model, "cp_comm_type", None)
    return list(value) if isinstance(value, (list, tuple)) else [value or "p2p"]


def _full_iteration_graph(ctx: Context) -> bool:
    from megatron.bridge.utils.cuda_graph import is_full_iteration_cuda_graph

    return bool(is_full_iteration_cuda_graph(ctx.model))


def _path_exists(path: str) -> bool:
    """As upstream's file_exists: a local path, or (with a scheme, msc://...) through Megatron Bridge."""
    if "://" not in str(path):
        return os.path.exists(path)
    try:
        from megatron.bridge.training.utils.checkpoint_utils import file_exists
    except ImportError:
        return os.path.exists(path)
    return bool(file_exists(path))


def _mlflow_used(ctx: Context) -> bool:
    lg = ctx.cfg.logger
    return any(getattr(lg, name, None) for name in ("mlflow_experiment", "mlflow_run_name", "mlflow_tracking_uri",
                                                     "mlflow_tags", "mlflow_description"))


def _comet_used(ctx: Context) -> bool:
    lg = ctx.cfg.logger
    return any(getattr(lg, name, None) for name in ("comet_project", "comet_experiment_name", "comet_workspace",
                                                     "comet_api_key", "comet_tags"))


def _profiling(ctx: Context) -> bool:
    return ctx.cfg.profiling is not None


def _nvrx_on(ctx: Context) -> bool:
    return ctx.cfg.nvrx_straggler is not None and bool(getattr(ctx.cfg.nvrx_straggler, "enabled", False))


def _env_var_value_ok(value: Any) -> bool:
    return isinstance(value, (str, int, float, bool))


def _not_null(id: str, mechanism: str, key: str, applies: Callable[[Context], bool], fix: str) -> Rule:
    section, name = key.split(".", 1)
    return _rule(id, mechanism, key, f"{key} must be set (not null)", applies,
                 lambda c: getattr(getattr(c.cfg, section), name) is not None, fix)


# -- the rules -------------------------------------------------------------------------------------------

RULES: tuple[Rule, ...] = (
    # training length (TrainingConfig.finalize, validate)
    _rule("train/one-length", TRAINING, "train.train_iters",
          "exactly one of train.train_iters, train.train_samples, train.num_epochs must be set",
          always, lambda c: len(_lengths_given(c)) == 1, _fix_lengths,
          observed=lambda c: ("set: " + ", ".join(_lengths_given(c))) if _lengths_given(c) else "none set",
          fix_text="train.train_iters=<iterations>, and the others null"),
    _rule("train/num-epochs-dataset", TRAINING, "train.num_epochs",
          "train.num_epochs needs a finite SFT dataset (GPTSFTDatasetConfig); pretraining datasets are sized by "
          "iterations or samples", lambda c: getattr(c.cfg.train, "num_epochs", None) is not None, _sft_dataset,
          "train.num_epochs=null train.train_iters=<iterations>"),
    _rule("train/train-samples-positive", TRAINING, "train.train_samples", "train.train_samples must be > 0",
          _sample_based, lambda c: c.cfg.train.train_samples > 0, "train.train_samples=<samples, > 0>"),
    _rule("train/no-rampup-with-samples", TRAINING, "train.rampup_batch_size",
          "batch size rampup is not supported with sample-based training (train.train_samples)",
          _sample_based, lambda c: c.cfg.train.rampup_batch_size is None, "train.rampup_batch_size=null"),
    _not_null("train/global-batch-set", TRAINING, "train.global_batch_size",
              lambda c: _sample_based(c) or c.cfg.validation.eval_global_batch_size is None,
              "train.global_batch_size=<multiple of micro_batch_size x DP>"),
    _not_null("train/micro-batch-set", TRAINING, "train.micro_batch_size",
              lambda c: c.cfg.validation.eval_micro_batch_size is None, "train.micro_batch_size=1"),
    # scheduler (SchedulerConfig.finalize, _validate_training_scheduler_compatibility, _calculate_scheduler_steps)
    _rule("scheduler/max-steps-positive", TRAINING, "scheduler.max_steps", "scheduler.max_steps must be > 0 (or null)",
          lambda c: c.cfg.scheduler.max_steps is not None, lambda c: c.cfg.scheduler.max_steps > 0,
          "scheduler.max_steps=null"),
    _rule("scheduler/max-steps-iteration-based", TRAINING, "scheduler.max_steps",
          "scheduler.max_steps is for iteration-based training only (not with train.train_samples)",
          _sample_based, lambda c: c.cfg.scheduler.max_steps is None, "scheduler.max_steps=null"),
    _rule("scheduler/max-steps-covers-train", TRAINING, "scheduler.max_steps",
          "scheduler.max_steps must be >= train.train_iters (it stretches the schedule, never shortens it)",
          lambda c: (not _sample_based(c) and c.cfg.scheduler.max_steps is not None
                     and c.cfg.train.train_iters is not None),
          lambda c: c.cfg.scheduler.max_steps >= c.cfg.train.train_iters,
          lambda c: f"scheduler.max_steps={c.cfg.train.train_iters}  (or null)",
          observed=lambda c: (f"{show_typed(c.cfg.scheduler.max_steps, number=True)} "
                              f"(train.train_iters={show_typed(c.cfg.train.train_iters, number=True)})"),
          fix_text="scheduler.max_steps=<train.train_iters or more>"),
    _rule("scheduler/start-weight-decay", TRAINING, "scheduler.start_weight_decay",
          "scheduler.start_weight_decay must be >= 0", lambda c: c.cfg.scheduler.start_weight_decay is not None,
          lambda c: c.cfg.scheduler.start_weight_decay >= 0.0, "scheduler.start_weight_decay=0.0"),
    _rule("scheduler/weight-decay-order", TRAINING, "scheduler.end_weight_decay",
          "scheduler.end_weight_decay must be >= scheduler.start_weight_decay",
          lambda c: c.cfg.scheduler.start_weight_decay is not None,
          lambda c: (c.cfg.scheduler.end_weight_decay is not None
                     and c.cfg.scheduler.end_weight_decay >= c.cfg.scheduler.start_weight_decay),
          lambda c: f"scheduler.end_weight_decay={c.cfg.scheduler.start_weight_decay}",
          observed=lambda c: (f"{show_typed(c.cfg.scheduler.end_weight_decay)} "
                              f"(start_weight_decay={c.cfg.scheduler.start_weight_decay})"),
          fix_text="scheduler.end_weight_decay=<start_weight_decay or more>"),
    _rule("scheduler/override-or-checkpoint", TRAINING, "scheduler.override_opt_param_scheduler",
          "scheduler.override_opt_param_scheduler and scheduler.use_checkpoint_opt_param_scheduler exclude each other",
          lambda c: bool(c.cfg.scheduler.override_opt_param_scheduler),
          lambda c: not c.cfg.scheduler.use_checkpoint_opt_param_scheduler,
          "scheduler.use_checkpoint_opt_param_scheduler=False  (or scheduler.override_opt_param_scheduler=False)"),
    _rule("scheduler/iters-or-samples", TRAINING, "scheduler.lr_decay_iters",
          "scheduler fields are either iteration-based (lr_decay_iters, lr_warmup_iters, lr_wsd_decay_iters) or "
          "sample-based (lr_*_samples), not both", always,
          lambda c: not ((c.cfg.scheduler.lr_decay_iters is not None or c.cfg.scheduler.lr_warmup_iters != 0
                          or c.cfg.scheduler.lr_wsd_decay_iters is not None)
                         and (c.cfg.scheduler.lr_decay_samples is not None or c.cfg.scheduler.lr_warmup_samples != 0
                              or c.cfg.scheduler.lr_wsd_decay_samples is not None)),
          "scheduler.lr_decay_samples=null scheduler.lr_warmup_samples=0 scheduler.lr_wsd_decay_samples=null  "
          "(or the *_iters ones, for sample-based training)",
          observed=lambda c: (f"lr_decay_iters={show_typed(c.cfg.scheduler.lr_decay_iters)}, "
                              f"lr_warmup_iters={c.cfg.scheduler.lr_warmup_iters}, "
                              f"lr_decay_samples={show_typed(c.cfg.scheduler.lr_decay_samples)}, "
                              f"lr_warmup_samples={c.cfg.scheduler.lr_warmup_samples}")),
    _rule("scheduler/warmup-one-way", TRAINING, "scheduler.lr_warmup_fraction",
          "warmup is given one way: scheduler.lr_warmup_fraction, or lr_warmup_iters, or lr_warmup_samples",
          lambda c: c.cfg.scheduler.lr_warmup_fraction is not None,
          lambda c: c.cfg.scheduler.lr_warmup_iters == 0 and c.cfg.scheduler.lr_warmup_samples == 0,
          "scheduler.lr_warmup_fraction=null  (or scheduler.lr_warmup_iters=0 scheduler.lr_warmup_samples=0)",
          observed=lambda c: (f"{show_typed(c.cfg.scheduler.lr_warmup_fraction, number=True)} (lr_warmup_iters="
                              f"{show_typed(c.cfg.scheduler.lr_warmup_iters, number=True)}, lr_warmup_samples="
                              f"{show_typed(c.cfg.scheduler.lr_warmup_samples, number=True)})")),
    _rule("scheduler/sample-based-fields", TRAINING, "scheduler.lr_decay_iters",
          "sample-based training (train.train_samples) takes lr_decay_samples / lr_warmup_samples, not "
          "lr_decay_iters / lr_warmup_iters", _sample_based,
          lambda c: c.cfg.scheduler.lr_decay_iters is None and c.cfg.scheduler.lr_warmup_iters == 0,
          "scheduler.lr_decay_iters=null scheduler.lr_warmup_iters=0  (give lr_decay_samples / lr_warmup_samples)",
          observed=lambda c: (f"lr_decay_iters={show_typed(c.cfg.scheduler.lr_decay_iters)}, "
                              f"lr_warmup_iters={c.cfg.scheduler.lr_warmup_iters}")),
    _rule("scheduler/iteration-based-fields", TRAINING, "scheduler.lr_decay_samples",
          "iteration-based training (train.train_iters) takes lr_decay_iters / lr_warmup_iters, not "
          "lr_decay_samples / lr_warmup_samples", lambda c: not _sample_based(c),
          lambda c: c.cfg.scheduler.lr_decay_samples is None and c.cfg.scheduler.lr_warmup_samples == 0,
          "scheduler.lr_decay_samples=null scheduler.lr_warmup_samples=0  (give lr_decay_iters / lr_warmup_iters)",
          observed=lambda c: (f"lr_decay_samples={show_typed(c.cfg.scheduler.lr_decay_samples)}, "
                              f"lr_warmup_samples={c.cfg.scheduler.lr_warmup_samples}")),
    _rule("scheduler/decay-steps-positive", TRAINING, "scheduler.lr_decay_iters",
          "the learning-rate decay must span > 0 steps (lr_decay_iters, else max_steps or train_iters, "
          "x global batch)", _decay_length_given, lambda c: _decay_steps(c) > 0, _decay_steps_fix,
          observed=lambda c: f"{show_typed(c.cfg.scheduler.lr_decay_iters)} (decay steps {_decay_steps(c)})",
          fix_text="scheduler.lr_decay_iters=null  (it then follows train.train_iters)"),
    # dataset (GPTDatasetConfig.finalize)
    *(_not_null(f"dataset/{name.replace('_', '-')}-set", DATASET, f"dataset.{name}",
                lambda c: hasattr(c.cfg.dataset, "reset_position_ids"), f"dataset.{name}=False")
      for name in ("reset_position_ids", "reset_attention_mask", "eod_mask_loss")),
    # checkpointing (CheckpointConfig.finalize, validate)
    _rule("checkpointing/pretrained-exists", CHECKPOINTING, "checkpoint.pretrained_checkpoint",
          "checkpoint.pretrained_checkpoint must exist", lambda c: c.cfg.checkpoint.pretrained_checkpoint is not None,
          lambda c: _path_exists(c.cfg.checkpoint.pretrained_checkpoint),
          "checkpoint.pretrained_checkpoint=<an existing checkpoint directory>  (or null)"),
    _rule("checkpointing/main-params-without-optim", CHECKPOINTING, "checkpoint.load_optim",
          "checkpoint.load_main_params_from_ckpt needs checkpoint.load_optim=False",
          lambda c: bool(c.cfg.checkpoint.load_main_params_from_ckpt), lambda c: not c.cfg.checkpoint.load_optim,
          "checkpoint.load_optim=False  (or checkpoint.load_main_params_from_ckpt=False)"),
    _rule("checkpointing/async-needs-save", CHECKPOINTING, "checkpoint.save",
          "checkpoint.async_save needs checkpoint.save (a directory)", lambda c: bool(c.cfg.checkpoint.async_save),
          lambda c: c.cfg.checkpoint.save is not None, "checkpoint.save=<directory>  (or checkpoint.async_save=False)"),
    _rule("checkpointing/async-needs-persistent-worker", CHECKPOINTING, "checkpoint.use_persistent_ckpt_worker",
          "checkpoint.async_save needs checkpoint.use_persistent_ckpt_worker=True",
          lambda c: bool(c.cfg.checkpoint.async_save), lambda c: bool(c.cfg.checkpoint.use_persistent_ckpt_worker),
          "checkpoint.use_persistent_ckpt_worker=True  (or checkpoint.async_save=False)"),
    _rule("checkpointing/async-format", CHECKPOINTING, "checkpoint.ckpt_format",
          "checkpoint.async_save needs ckpt_format torch_dist or fsdp_dtensor",
          lambda c: bool(c.cfg.checkpoint.async_save),
          lambda c: c.cfg.checkpoint.ckpt_format in ("torch_dist", "fsdp_dtensor"),
          "checkpoint.ckpt_format=torch_dist  (or checkpoint.async_save=False)"),
    _rule("checkpointing/hf-export-format", CHECKPOINTING, "checkpoint.ckpt_format",
          "checkpoint.also_save_hf_checkpoint does not work with ckpt_format=fsdp_dtensor",
          lambda c: bool(c.cfg.checkpoint.also_save_hf_checkpoint),
          lambda c: c.cfg.checkpoint.ckpt_format != "fsdp_dtensor",
          "checkpoint.ckpt_format=torch_dist  (or checkpoint.also_save_hf_checkpoint=False)"),
    _rule("checkpointing/hf-export-not-local", CHECKPOINTING, "checkpoint.non_persistent_ckpt_type",
          "checkpoint.also_save_hf_checkpoint does not work with local non-persistent checkpoints",
          lambda c: bool(c.cfg.checkpoint.also_save_hf_checkpoint),
          lambda c: c.cfg.checkpoint.non_persistent_ckpt_type != "local",
          "checkpoint.non_persistent_ckpt_type=global  (or checkpoint.also_save_hf_checkpoint=False)"),
    _rule("checkpointing/hf-export-source", CHECKPOINTING, "checkpoint.hf_source_path",
          "checkpoint.also_save_hf_checkpoint needs an HF source for config and tokenizer files "
          "(checkpoint.hf_source_path, model.hf_model_id or tokenizer.tokenizer_model)",
          lambda c: bool(c.cfg.checkpoint.also_save_hf_checkpoint),
          lambda c: bool(c.cfg.checkpoint.hf_source_path or getattr(c.model, "hf_model_id", None)
                         or getattr(c.cfg.tokenizer, "tokenizer_model", None)),
          "checkpoint.hf_source_path=<HF model id or directory>  (or checkpoint.also_save_hf_checkpoint=False)"),
    _rule("checkpointing/ckpt-step-needs-load", CHECKPOINTING, "checkpoint.ckpt_step",
          "checkpoint.ckpt_step needs checkpoint.load (the checkpoint directory)",
          lambda c: c.cfg.checkpoint.ckpt_step is not None, lambda c: c.cfg.checkpoint.load is not None,
          "checkpoint.load=<checkpoint directory>  (or checkpoint.ckpt_step=null)"),
    _rule("checkpointing/reshardable-mem-efficient", CHECKPOINTING,
          "checkpoint.distrib_optim_fully_reshardable_mem_efficient",
          "checkpoint.distrib_optim_fully_reshardable_mem_efficient cannot be combined with "
          "checkpoint.dist_ckpt_optim_fully_reshardable (it needs Gloo process groups)",
          lambda c: bool(c.cfg.checkpoint.dist_ckpt_optim_fully_reshardable),
          lambda c: not c.cfg.checkpoint.distrib_optim_fully_reshardable_mem_efficient,
          "checkpoint.distrib_optim_fully_reshardable_mem_efficient=False"),
    _rule("checkpointing/distributed-optimizer-format", CHECKPOINTING, "checkpoint.ckpt_format",
          "without Gloo process groups (dist.use_gloo_process_groups=False), the distributed optimizer needs "
          "ckpt_format torch_dist or fsdp_dtensor",
          lambda c: not c.cfg.dist.use_gloo_process_groups and bool(c.opt.use_distributed_optimizer
                                                                    or _megatron_fsdp(c)),
          lambda c: c.cfg.checkpoint.ckpt_format in ("torch_dist", "fsdp_dtensor"),
          "checkpoint.ckpt_format=torch_dist  (or dist.use_gloo_process_groups=True)"),
    _rule("checkpointing/fsdp-dtensor-needs-megatron-fsdp", CHECKPOINTING, "checkpoint.ckpt_format",
          "ckpt_format=fsdp_dtensor (when saving or loading) works only with Megatron FSDP (ddp.use_megatron_fsdp, "
          "not dist.use_torch_fsdp2)",
          lambda c: _saves_or_loads(c) and c.cfg.checkpoint.ckpt_format == "fsdp_dtensor",
          lambda c: _megatron_fsdp(c) and not c.cfg.dist.use_torch_fsdp2, "checkpoint.ckpt_format=torch_dist"),
    # precision (_validate_mixed_precision_consistency, validate; on the values after the mixed_precision preset)
    *(_rule(f"precision/{section}-bf16-or-fp16", PRECISION, f"{section}.fp16",
            f"{section}.bf16 and {section}.fp16 exclude each other (after the mixed_precision preset)", always,
            lambda c, s=section: not (_precision(c, s, "bf16") and _precision(c, s, "fp16")),
            f"{section}.fp16=False  (or mixed_precision=bf16_mixed)",
            observed=lambda c, s=section: (f"bf16={_precision(c, s, 'bf16')}, fp16={_precision(c, s, 'fp16')} "
                                           f"(mixed_precision={show(c.cfg.mixed_precision)})"))
      for section in ("model", "optimizer")),
    *(_rule(f"precision/aware-optimizer-{dtype}", PRECISION, f"optimizer.{dtype}",
            f"with optimizer.use_precision_aware_optimizer and model.{dtype}=True, optimizer.{dtype} must be True",
            lambda c, d=dtype: bool(c.opt.use_precision_aware_optimizer and _precision(c, "model", d)),
            lambda c, d=dtype: bool(_precision(c, "optimizer", d)),
            f"optimizer.{dtype}=True  (a mixed_precision preset sets model and optimizer alike)",
            observed=lambda c, d=dtype: (f"{_precision(c, 'optimizer', d)} (model.{d}={_precision(c, 'model', d)}, "
                                         f"mixed_precision={show(c.cfg.mixed_precision)})"))
      for dtype in ("bf16", "fp16")),
    _rule("precision/aware-optimizer-fp32", PRECISION, "optimizer.bf16",
          "with optimizer.use_precision_aware_optimizer and an fp32 model (model.bf16 and model.fp16 False), "
          "optimizer.bf16 and optimizer.fp16 must be False",
          lambda c: bool(c.opt.use_precision_aware_optimizer and not _precision(c, "model", "bf16")
                         and not _precision(c, "model", "fp16")),
          lambda c: not _precision(c, "optimizer", "bf16") and not _precision(c, "optimizer", "fp16"),
          "optimizer.bf16=False optimizer.fp16=False  (or mixed_precision=bf16_mixed for a bf16 model)",
          observed=lambda c: (f"optimizer bf16={_precision(c, 'optimizer', 'bf16')}, "
                              f"fp16={_precision(c, 'optimizer', 'fp16')}")),
    _rule("precision/mxfp8-reuse-grad-buf", PRECISION, "mixed_precision",
          "fp8_param_gather with fp8_recipe=mxfp8 (without Megatron FSDP) needs reuse_grad_buf_for_mxfp8_param_ag",
          lambda c: (not _megatron_fsdp(c) and _mixed_precision(c) is not None
                     and bool(getattr(_mixed_precision(c), "fp8_param_gather", False))
                     and getattr(_mixed_precision(c), "fp8_recipe", None) == "mxfp8"),
          lambda c: bool(getattr(_mixed_precision(c), "reuse_grad_buf_for_mxfp8_param_ag", False)),
          "mixed_precision.reuse_grad_buf_for_mxfp8_param_ag=True  (or a preset without fp8_param_gather)"),
    # distributed (validate, _validate_and_apply_megatron_fsdp_configs)
    _rule("distributed/fsdp-exclusive", DISTRIBUTED, "dist.use_torch_fsdp2",
          "dist.use_megatron_fsdp and dist.use_torch_fsdp2 exclude each other",
          lambda c: bool(c.cfg.dist.use_megatron_fsdp), lambda c: not c.cfg.dist.use_torch_fsdp2,
          "dist.use_torch_fsdp2=False  (or dist.use_megatron_fsdp=False)"),
    _rule("distributed/fsdp-checkpoint-format", DISTRIBUTED, "checkpoint.ckpt_format",
          "Megatron FSDP saves and loads only ckpt_format=fsdp_dtensor", lambda c: _megatron_fsdp(c) and _saves_or_loads(c),
          lambda c: c.cfg.checkpoint.ckpt_format == "fsdp_dtensor", "checkpoint.ckpt_format=fsdp_dtensor"),
    _rule("distributed/fsdp-cuda-device-max-connections", DISTRIBUTED, "env_vars.CUDA_DEVICE_MAX_CONNECTIONS",
          "Megatron FSDP needs the environment variable CUDA_DEVICE_MAX_CONNECTIONS unset or > 1", _megatron_fsdp,
          lambda c: c.env("CUDA_DEVICE_MAX_CONNECTIONS") != "1",
          "~env_vars.CUDA_DEVICE_MAX_CONNECTIONS  (and unset CUDA_DEVICE_MAX_CONNECTIONS in the shell), or "
          "++env_vars.CUDA_DEVICE_MAX_CONNECTIONS=8",
          observed=lambda c: f"{show(c.env('CUDA_DEVICE_MAX_CONNECTIONS'))} (environment variable)"),
    _rule("distributed/fsdp-manual-registration", DISTRIBUTED, "ddp.fsdp_manual_registration",
          "ddp.fsdp_manual_registration needs ddp.nccl_ub (NCCL user buffers)",
          lambda c: _megatron_fsdp(c) and not c.cfg.ddp.nccl_ub, lambda c: not c.cfg.ddp.fsdp_manual_registration,
          "ddp.fsdp_manual_registration=False  (or ddp.nccl_ub=True)"),
    _rule("distributed/fsdp-weight-hash", DISTRIBUTED, "train.check_weight_hash_across_dp_replicas_interval",
          "the weight-hash check across DP replicas does not work with Megatron FSDP's optim_grads_params sharding",
          lambda c: _megatron_fsdp(c) and c.cfg.ddp.data_parallel_sharding_strategy == "optim_grads_params",
          lambda c: c.cfg.train.check_weight_hash_across_dp_replicas_interval is None,
          "train.check_weight_hash_across_dp_replicas_interval=null"),
    _rule("distributed/fsdp-tp-pp-dp-mapping", DISTRIBUTED, "dist.use_tp_pp_dp_mapping",
          "dist.use_tp_pp_dp_mapping does not work with Megatron FSDP", _megatron_fsdp,
          lambda c: not c.cfg.dist.use_tp_pp_dp_mapping, "dist.use_tp_pp_dp_mapping=False"),
    _rule("distributed/decentralized-pg-gloo", DISTRIBUTED, "dist.use_gloo_process_groups",
          "decentralized process groups (dist.use_decentralized_pg) are NCCL only: no Gloo process groups",
          lambda c: bool(c.cfg.dist.use_decentralized_pg), lambda c: not c.cfg.dist.use_gloo_process_groups,
          "dist.use_gloo_process_groups=False  (or dist.use_decentralized_pg=False)"),
    # parallelism of evaluation and context parallelism (validate, _validate_cp_comm_type)
    _rule("parallel/eval-world-size", PARALLELISM, "dist.eval_context_parallel_size",
          "the GPU count must be a multiple of TP x PP x the evaluation CP size",
          lambda c: c.cfg.dist.eval_context_parallel_size is not None, _eval_splits,
          "dist.eval_context_parallel_size=null  (evaluate with the training CP size)",
          observed=lambda c: (f"{c.cfg.dist.eval_context_parallel_size} (TP{c.model.tensor_model_parallel_size} x "
                              f"PP{c.model.pipeline_model_parallel_size}; {c.num_gpus} GPUs)")),
    _rule("parallel/eval-global-batch", PARALLELISM, "validation.eval_global_batch_size",
          "the evaluation global batch (validation.eval_global_batch_size, else train.global_batch_size) must be "
          "divisible by the evaluation micro batch x the evaluation data-parallel size", _eval_splits,
          lambda c: _eval_layout(c)[0] % (_eval_layout(c)[1] * _eval_layout(c)[2]) == 0, _fix_eval_batch,
          observed=lambda c: (f"{_eval_layout(c)[0]} (eval micro batch {_eval_layout(c)[1]} x eval DP "
                              f"{_eval_layout(c)[2]})"),
          fix_text="validation.eval_global_batch_size=<multiple of eval micro batch x DP>"),
    _rule("parallel/cp-comm-type-per-layer", PARALLELISM, "model.cp_comm_type",
          "a list model.cp_comm_type needs one entry per layer (model.num_layers)",
          lambda c: c.model.context_parallel_size > 1 and isinstance(c.model.cp_comm_type, (list, tuple)),
          lambda c: len(c.model.cp_comm_type) == c.model.num_layers, "model.cp_comm_type=p2p  (one type for all layers)",
          observed=lambda c: f"{len(c.model.cp_comm_type)} entries (model.num_layers={c.model.num_layers})"),
    _rule("parallel/hierarchical-cp-needed", PARALLELISM, "model.hierarchical_context_parallel_sizes",
          "cp_comm_type a2a+p2p needs model.hierarchical_context_parallel_sizes (else CP silently does not "
          "communicate)", lambda c: any("a2a+p2p" in str(t) for t in _cp_comm_types(c)),
          lambda c: _hcp_sizes(c) is not None,
          "model.hierarchical_context_parallel_sizes=[<GPUs per node in CP>,<nodes in CP>]  (product = CP)"),
    _rule("parallel/hierarchical-cp-product", PARALLELISM, "model.hierarchical_context_parallel_sizes",
          "the product of model.hierarchical_context_parallel_sizes must equal model.context_parallel_size",
          lambda c: _hcp_sizes(c) is not None, lambda c: math.prod(_hcp_sizes(c)) == c.model.context_parallel_size,
          "model.hierarchical_context_parallel_sizes=<sizes whose product is the CP size>  (or null)",
          observed=lambda c: f"{_hcp_sizes(c)} (context_parallel_size={c.model.context_parallel_size})"),
    # model features (validate)
    _rule("model/full-iteration-graph-nan-check", MODEL, "rerun_state_machine.check_for_nan_in_loss",
          "a full-iteration CUDA graph needs rerun_state_machine.check_for_nan_in_loss=False",
          _full_iteration_graph, lambda c: not c.cfg.rerun_state_machine.check_for_nan_in_loss,
          "rerun_state_machine.check_for_nan_in_loss=False"),
    _rule("model/modelopt-no-grad-accumulation-fusion", MODEL, "model.gradient_accumulation_fusion",
          "ModelOpt / quantized models (model.restore_modelopt_state) do not support gradient accumulation fusion",
          lambda c: bool(getattr(c.model, "restore_modelopt_state", False)),
          lambda c: not c.model.gradient_accumulation_fusion, "model.gradient_accumulation_fusion=False"),
    _rule("model/peft-needs-pretrained", MODEL, "checkpoint.pretrained_checkpoint",
          "PEFT (peft set) needs checkpoint.pretrained_checkpoint", lambda c: c.cfg.peft is not None,
          lambda c: c.cfg.checkpoint.pretrained_checkpoint is not None,
          "checkpoint.pretrained_checkpoint=<base model checkpoint>"),
    # activation recomputation (TransformerConfig.__post_init__, reached through model.finalize())
    _rule("recompute/full-needs-method", MODEL, "model.recompute_method",
          "full recomputation (model.recompute_granularity=full) needs model.recompute_method block or uniform",
          lambda c: c.model.recompute_granularity == "full",
          lambda c: c.model.recompute_method in ("block", "uniform"),
          "model.recompute_method=uniform  (or model.recompute_granularity=null)"),
    _rule("recompute/full-needs-num-layers", MODEL, "model.recompute_num_layers",
          "full recomputation (model.recompute_granularity=full) needs model.recompute_num_layers "
          "(1 to the layers per pipeline stage)", lambda c: c.model.recompute_granularity == "full",
          lambda c: c.model.recompute_num_layers is not None,
          "model.recompute_num_layers=1  (or model.recompute_granularity=null)"),
    _rule("recompute/selective-no-num-layers", MODEL, "model.recompute_num_layers",
          "selective recomputation (model.recompute_granularity=selective) takes no model.recompute_num_layers",
          lambda c: c.model.recompute_granularity == "selective", lambda c: c.model.recompute_num_layers is None,
          "model.recompute_num_layers=null"),
    # logging and profiling (LoggerConfig / ProfilingConfig / NVRxStragglerDetectionConfig .finalize)
    _rule("logging/mlflow-run-name", MONITORING, "logger.mlflow_run_name",
          "MLFlow logging (logger.mlflow_experiment) needs logger.mlflow_run_name",
          lambda c: bool(c.cfg.logger.mlflow_experiment), lambda c: bool(c.cfg.logger.mlflow_run_name),
          "logger.mlflow_run_name=<run name>"),
    _rule("logging/mlflow-installed", MONITORING, "logger.mlflow_experiment",
          "MLFlow logging (any logger.mlflow_* set) needs the mlflow package", _mlflow_used,
          lambda c: c.has_module("mlflow"), "uv add mlflow  (or set every logger.mlflow_* to null)"),
    _rule("logging/comet-experiment-name", MONITORING, "logger.comet_experiment_name",
          "Comet ML logging (logger.comet_project) needs logger.comet_experiment_name",
          lambda c: bool(c.cfg.logger.comet_project), lambda c: bool(c.cfg.logger.comet_experiment_name),
          "logger.comet_experiment_name=<experiment name>"),
    _rule("logging/comet-installed", MONITORING, "logger.comet_project",
          "Comet ML logging (any logger.comet_* set) needs the comet_ml package", _comet_used,
          lambda c: c.has_module("comet_ml"), "uv add comet-ml  (or set every logger.comet_* to null)"),
    _rule("profiling/one-profiler", MONITORING, "profiling.use_nsys_profiler",
          "profiling.use_pytorch_profiler and profiling.use_nsys_profiler exclude each other", _profiling,
          lambda c: not (c.cfg.profiling.use_pytorch_profiler and c.cfg.profiling.use_nsys_profiler),
          "profiling.use_nsys_profiler=False  (or profiling.use_pytorch_profiler=False)"),
    *(_rule(f"profiling/{name.replace('_', '-')}", MONITORING, f"profiling.{name}", f"profiling.{name} must be >= 0",
            _profiling, lambda c, n=name: getattr(c.cfg.profiling, n) >= 0, f"profiling.{name}=0")
      for name in ("profile_step_start", "profile_step_end")),
    _rule("profiling/step-order", MONITORING, "profiling.profile_step_end",
          "profiling.profile_step_end must be >= profiling.profile_step_start", _profiling,
          lambda c: c.cfg.profiling.profile_step_end >= c.cfg.profiling.profile_step_start,
          lambda c: f"profiling.profile_step_end={c.cfg.profiling.profile_step_start}",
          observed=lambda c: (f"{show_typed(c.cfg.profiling.profile_step_end, number=True)} (profile_step_start="
                              f"{show_typed(c.cfg.profiling.profile_step_start, number=True)})"),
          fix_text="profiling.profile_step_end=<profile_step_start or later>"),
    _rule("nvrx/measures-something", MONITORING, "nvrx_straggler.calc_relative_gpu_perf",
          "NVRx straggler detection needs calc_relative_gpu_perf or calc_individual_gpu_perf", _nvrx_on,
          lambda c: bool(c.cfg.nvrx_straggler.calc_relative_gpu_perf or c.cfg.nvrx_straggler.calc_individual_gpu_perf),
          "nvrx_straggler.calc_relative_gpu_perf=True"),
    _rule("nvrx/report-interval", MONITORING, "nvrx_straggler.report_time_interval",
          "nvrx_straggler.report_time_interval must be > 0", _nvrx_on,
          lambda c: c.cfg.nvrx_straggler.report_time_interval > 0, "nvrx_straggler.report_time_interval=300.0"),
    *(_rule(f"nvrx/{name.replace('_', '-')}", MONITORING, f"nvrx_straggler.{name}",
            f"nvrx_straggler.{name} must be from 0 to 1", _nvrx_on,
            lambda c, n=name: 0.0 <= getattr(c.cfg.nvrx_straggler, n) <= 1.0, f"nvrx_straggler.{name}=0.7")
      for name in ("gpu_relative_perf_threshold", "gpu_individual_perf_threshold")),
    # environment (apply_environment_variables)
    _rule("env/env-var-names", ENVIRONMENT, "env_vars",
          "every env_vars name must be a non-empty string", always,
          lambda c: all(isinstance(name, str) and name for name in (c.cfg.env_vars or {})),
          "~env_vars.<the empty name>",
          observed=lambda c: ", ".join(repr(n) for n in (c.cfg.env_vars or {}) if not (isinstance(n, str) and n))),
    _rule("env/env-var-values", ENVIRONMENT, "env_vars",
          "every env_vars value must be a str, int, float or bool", always,
          lambda c: all(_env_var_value_ok(v) for v in (c.cfg.env_vars or {}).values()),
          lambda c: " ".join(f"++env_vars.{n}=<a value>" for n, v in (c.cfg.env_vars or {}).items()
                             if not _env_var_value_ok(v)),
          observed=lambda c: ", ".join(f"{n}={show(v)}" for n, v in (c.cfg.env_vars or {}).items()
                                       if not _env_var_value_ok(v)),
          fix_text="++env_vars.NAME=<a scalar value>"),
)


# -- every raise/assert site of upstream's validate(), by the start of its normalized text -----------------
# A rule id (of any module of the table), or UNREACHABLE + why no user of this plugin can reach it.
UNREACHABLE = "unreachable: "
_SFT_ONLY = (UNREACHABLE + "checks a field or type of SFT/VLM/Energon dataset configs; every recipe here builds "
             "GPTDatasetConfig, and an override cannot change a section's type")
_MOCK_ONLY = (UNREACHABLE + "checks MockGPTDatasetConfig, which no recipe here builds (they use GPTDatasetConfig "
              "with mock data), and an override cannot change a section's type")
_AFTER_EPOCHS = (UNREACHABLE + "needs train.num_epochs, which validate() refuses first for the GPT datasets of "
                 "these recipes (rule train/num-epochs-dataset)")

SITES: tuple[tuple[str, str], ...] = (
    ("reset_position_ids must be defined", "dataset/reset-position-ids-set"),
    ("reset_attention_mask must be defined", "dataset/reset-attention-mask-set"),
    ("eod_mask_loss must be defined", "dataset/eod-mask-loss-set"),
    ("TypeError: got an unexpected keyword argument", _MOCK_ONLY),
    ("ValueError: scheduler.max_steps must be positive", "scheduler/max-steps-positive"),
    ("start_weight_decay should be positive", "scheduler/start-weight-decay"),
    ("assert self.end_weight_decay >= self.start_weight_decay", "scheduler/weight-decay-order"),
    ("both override and use-checkpoint are set", "scheduler/override-or-checkpoint"),
    ("Cannot mix iteration-based and sample-based scheduler fields", "scheduler/iters-or-samples"),
    ("Cannot specify lr_warmup_fraction=", "scheduler/warmup-one-way"),
    ("One of train_iters, train_samples, or num_epochs must be provided", "train/one-length"),
    ("Cannot specify more than one of train_iters, train_samples, or num_epochs", "train/one-length"),
    ("num_epochs must be a positive number", _AFTER_EPOCHS),
    ("Batch size rampup not supported with epoch-based training", _AFTER_EPOCHS),
    ("global_batch_size must be set when using num_epochs", _AFTER_EPOCHS),
    ("train_samples must be positive", "train/train-samples-positive"),
    ("Batch size rampup not supported with sample-based training", "train/no-rampup-with-samples"),
    ("global_batch_size must be set when using train_samples", "train/global-batch-set"),
    ("Pretrained checkpoint {} does not exist", "checkpointing/pretrained-exists"),
    ("load_main_params_from_ckpt must be used with load_optim=False", "checkpointing/main-params-without-optim"),
    ("async_save is enabled, but save is not set", "checkpointing/async-needs-save"),
    ("async_save requires use_persistent_ckpt_worker=True", "checkpointing/async-needs-persistent-worker"),
    ("ValueError: also_save_hf_checkpoint=True is not supported together with ckpt_format='fsdp_dtensor'",
     "checkpointing/hf-export-format"),
    ("ValueError: also_save_hf_checkpoint=True is not compatible with local non-persistent",
     "checkpointing/hf-export-not-local"),
    ("ValueError: ckpt_step={} specified but checkpoint.load is None", "checkpointing/ckpt-step-needs-load"),
    ("distrib_optim_fully_reshardable_mem_efficient requires use_gloo_process_groups",
     "checkpointing/reshardable-mem-efficient"),
    ("ValueError: Set logger.mlflow_run_name", "logging/mlflow-run-name"),
    ("ModuleNotFoundError: MLFlow logging is configured", "logging/mlflow-installed"),
    ("ValueError: Set logger.comet_experiment_name", "logging/comet-experiment-name"),
    ("ModuleNotFoundError: Comet ML logging is configured", "logging/comet-installed"),
    ("Exactly one of pytorch or nsys profiler", "profiling/one-profiler"),
    ("profile_step_start must be >= 0", "profiling/profile-step-start"),
    ("profile_step_end must be >= 0", "profiling/profile-step-end"),
    ("profile_step_end ({}) must be >= profile_step_start", "profiling/step-order"),
    ("ValueError: At least one of calc_relative_gpu_perf or calc_individual_gpu_perf", "nvrx/measures-something"),
    ("ValueError: report_time_interval must be positive", "nvrx/report-interval"),
    ("ValueError: gpu_relative_perf_threshold must be between", "nvrx/gpu-relative-perf-threshold"),
    ("ValueError: gpu_individual_perf_threshold must be between", "nvrx/gpu-individual-perf-threshold"),
    ("world size ({}) is not divisible by total_model_size", "parallel/world-size"),
    ("Cross Entropy Fusion is currently not deterministic", "deterministic/cross-entropy-fusion"),
    ("NCCL_ALGO must be one of", "deterministic/nccl-algo"),
    ("Megatron-FSDP requires the fsdp_dtensor checkpointing format", "distributed/fsdp-checkpoint-format"),
    ("FSDP requires CUDA_DEVICE_MAX_CONNECTIONS > 1 or unset", "distributed/fsdp-cuda-device-max-connections"),
    ("DDP.fsdp_manual_registration requires DDP.nccl_ub", "distributed/fsdp-manual-registration"),
    ("TrainingConfig.check_weight_hash_across_dp_replicas_interval is not supported", "distributed/fsdp-weight-hash"),
    ("use_tp_pp_dp_mapping is not supported with Megatron FSDP", "distributed/fsdp-tp-pp-dp-mapping"),
    ("ValueError: also_save_hf_checkpoint=True requires an HF source", "checkpointing/hf-export-source"),
    ("ValueError: num_epochs is only supported for finite GPTSFTDatasetConfig", "train/num-epochs-dataset"),
    ('ValueError: num_epochs is currently supported only with dataloader_type="batch"', _AFTER_EPOCHS),
    ("ValueError: enable_offline_packing and enable_in_batch_packing are mutually exclusive", _SFT_ONLY),
    ("ValueError: offline_packing_specs must be set when enable_offline_packing", _SFT_ONLY),
    ("ValueError: enable_offline_packing must be True when offline_packing_specs", _SFT_ONLY),
    ("ValueError: offline_packing_specs.pad_cu_seqlens=True requires", _SFT_ONLY),
    ("ValueError: Offline packing with CUDA graphs requires", _SFT_ONLY),
    ("ValueError: Packed attention CUDA graphs require", _SFT_ONLY),
    ("ValueError: EnergonDatasetConfig.micro_batch_size must match", _SFT_ONLY),
    ("ValueError: {}.seq_length must be divisible by the CP/SP collate padding multiple", _SFT_ONLY),
    ("train.global_batch_size must be set when eval_global_batch_size", "train/global-batch-set"),
    ("train.micro_batch_size must be set when eval_micro_batch_size", "train/micro-batch-set"),
    ("world size ({}) is not divisible by eval model parallel size", "parallel/eval-world-size"),
    ("eval_global_batch_size ({}) must be divisible by", "parallel/eval-global-batch"),
    ("ValueError: use_megatron_fsdp and use_torch_fsdp2 are mutually exclusive", "distributed/fsdp-exclusive"),
    ("When fp8_param_gather=True and fp8_recipe='mxfp8'", "precision/mxfp8-reuse-grad-buf"),
    ("check_for_nan_in_loss must be disabled when using full_iteration CUDA graph",
     "model/full-iteration-graph-nan-check"),
    ("Gradient accumulation fusion is not supported with ModelOpt", "model/modelopt-no-grad-accumulation-fusion"),
    ("fsdp_dtensor checkpoint format only supports Megatron FSDP", "checkpointing/fsdp-dtensor-needs-megatron-fsdp"),
    ("async_save is only supported with ckpt_format", "checkpointing/async-format"),
    ("Gloo process groups are not supported when use_decentralized_pg", "distributed/decentralized-pg-gloo"),
    ("Legacy checkpointing requires ckpt_format", "checkpointing/distributed-optimizer-format"),
    ("Sequence length must be divisible by 2 * context parallel size", "parallel/seq-length-cp"),
    ("When finetuning with CP>1, calculate_per_token_loss must be True", _SFT_ONLY),
    ("When finetuning with CP>1, average_in_collective must be False", _SFT_ONLY),
    ("assert offline_packing_specs is not None", _SFT_ONLY),
    ("ValueError: offline_packing_specs.packed_sequence_size must be greater than 0", _SFT_ONLY),
    ("ValueError: Micro batch size should be 1 when training with packed sequence", _SFT_ONLY),
    ("ValueError: micro_batch_size should be greater than 1 when using enable_in_batch_packing", _SFT_ONLY),
    ("PEFT requires a pretrained checkpoint path", "model/peft-needs-pretrained"),
    ("Please ensure sequence length configuration in model config and dataset config match",
     "parallel/seq-length-match"),
    ("Length of cp_comm_type ({}) must equal num_layers", "parallel/cp-comm-type-per-layer"),
    ("cp_comm_type must be a str or list of str",
     UNREACHABLE + "the override layer sets model.cp_comm_type only to its declared types (str or list of str)"),
    ("hierarchical_context_parallel_sizes must be set when cp_comm_type", "parallel/hierarchical-cp-needed"),
    ("Product of hierarchical_context_parallel_sizes", "parallel/hierarchical-cp-product"),
    ("scheduler.max_steps is only supported for iteration-based training", "scheduler/max-steps-iteration-based"),
    ("Use lr_decay_samples for sample-based training, not lr_decay_iters", "scheduler/sample-based-fields"),
    ("Use lr_warmup_samples for sample-based training, not lr_warmup_iters", "scheduler/sample-based-fields"),
    ("Can only specify one of lr_warmup_fraction or lr_warmup_samples", "scheduler/warmup-one-way"),
    ("Use lr_decay_iters for iteration-based training, not lr_decay_samples", "scheduler/iteration-based-fields"),
    ("Use lr_warmup_iters for iteration-based training, not lr_warmup_samples", "scheduler/iteration-based-fields"),
    ("Can only specify one of lr_warmup_fraction or lr_warmup_iters", "scheduler/warmup-one-way"),
    ("ValueError: scheduler.max_steps ({}) must be greater than or equal to", "scheduler/max-steps-covers-train"),
    ("ValueError: lr_decay_steps must be > 0", "scheduler/decay-steps-positive"),
    ("ValueError: Environment variable names must be non-empty strings", "env/env-var-names"),
    ("TypeError: Environment variable {} must have a scalar value", "env/env-var-values"),
    ("Model config cannot have both bf16=True and fp16=True", "precision/model-bf16-or-fp16"),
    ("Optimizer config cannot have both bf16=True and fp16=True", "precision/optimizer-bf16-or-fp16"),
    ("optimizer.bf16=True must be set when model.bf16=True", "precision/aware-optimizer-bf16"),
    ("optimizer.fp16=True must be set when model.fp16=True", "precision/aware-optimizer-fp16"),
    ("optimizer.bf16 and optimizer.fp16 must both be False when model is using fp32", "precision/aware-optimizer-fp32"),
    ("ValueError: Fine-grained activation offloading is only supported with transformer_engine",
     "fine-grained/transformer-engine"),
    ("ValueError: For fine-grained activation offloading with TE >= 2.10.0", "fine-grained/nvte-cpu-offload-v1"),
)


# -- the sites validate() reaches outside megatron.bridge.training.config (upstream_sites.EXTERNAL_ROOTS): the
# model's TransformerConfig.__post_init__ and what it calls, Megatron Core's optimizer / DDP __post_init__, the
# CUDA-graph, mixed-precision and comm-overlap checks. Their rules: upstream_model_rules.py (and the concern
# modules, where a rule already states the constraint).
_GDN, _DSA, _INF = "model/gated-delta-net", "model/dsa", "model/inference-optimized"
_FP8, _FP4, _TE, _TORCH = "precision/fp8-options", "precision/fp4-options", "model/transformer-engine-version", \
    "model/torch-version"
_EP, _WGRAD = "moe/ep-comm-overlap", "moe/wgrad-overlap"
_LAYOUT, _UNEVEN, _EMB_LOSS = "pipeline/layout-valid", "pipeline/uneven-stages", "pipeline/embedding-loss-split"
_GRAPH_MOE, _GRAPH_RECOMPUTE, _GRAPH_OFFLOAD = ("model/cuda-graph-moe-modules", "model/cuda-graph-recompute",
                                               "model/cuda-graph-fine-grained-offload")
_GRAPH_MODULES, _RECOMPUTE_FEATURES = "model/cuda-graph-modules-valid", "recompute/modules-need-features"
_CP_COMM_TYPE_TYPE = (UNREACHABLE + "the override layer sets model.cp_comm_type only to its declared types "
                      "(str or list of str)")

MODEL_SITES: tuple[tuple[str, str], ...] = (
    # TransformerConfig.__post_init__ (megatron.core.transformer.transformer_config)
    ("ValueError: Only one of self.fp16: {} and self.bf16 {} should be True", "precision/model-bf16-or-fp16"),
    ("ValueError: num_attention_heads ({}) must be a multiple of tensor_model_parallel_size", "parallel/heads-per-tp"),
    ("ValueError: num_query_groups ({}) must be a multiple or divisor of tensor_model_parallel_size",
     "parallel/heads-per-tp"),
    ("linear_attention_freq must be set", _GDN), ("linear_conv_kernel_dim must be set", _GDN),
    ("linear_key_head_dim must be set", _GDN), ("linear_value_head_dim must be set", _GDN),
    ("linear_num_key_heads must be set", _GDN), ("linear_num_value_heads must be set", _GDN),
    ("linear_num_value_heads ({}) must be a multiple of linear_num_key_heads", _GDN),
    ("self.linear_num_key_heads={} must be a multiple of", _GDN),
    ("self.linear_num_value_heads={} must be a multiple of", _GDN),
    ("ValueError: DSA uses AbsorbedMLASelfAttention", _DSA), ("ValueError: dsa_indexer_topk_freq must be positive", _DSA),
    ("ValueError: dsa_indexer_skip_topk_offset must be non-negative", _DSA),
    ("ValueError: Delayed scaling does not support first / last layer in BF16", _FP8),
    ("ValueError: num_layers_at_start_in_bf16 ({}) must be between", _FP8),
    ("ValueError: num_layers_at_end_in_bf16 ({}) must be between", _FP8),
    ("ValueError: fp8_quantizer_factory must be provided", _FP8),
    ("ValueError: fp8_param must be used together with fp8 mode", _FP8),
    ("ValueError: fp8_output_proj must be used together with fp8 mode", _FP8),
    ("ValueError: fp8_output_proj requires fp8_recipe='mxfp8'", _FP8),
    ("ValueError: fp4_param must be used together with fp4 mode", _FP4),
    ("ValueError: fp4 and fp8 cannot be used simultaneously", _FP4),  # also MixedPrecisionConfig.finalize's
    ("ValueError: fp4_quantizer_factory must be provided", _FP4),
    ("ValueError: num_moe_experts must be non None to use expert-parallel", "parallel/ep-needs-experts"),
    ("ValueError: Inference-optimized MoE layers", _INF), ("ValueError: --transformer-impl='inference_optimized'", _INF),
    ("ValueError: fp8_param must be enabled when using --transformer-impl='inference_optimized'", _INF),
    ("ValueError: inference_grouped_gemm_backend must be", _INF),
    ("ValueError: FlashInfer is not compatible with MXFP8", _INF),
    ("ValueError: vLLM Triton fused MoE only supports BF16", _INF),
    ("ValueError: num_moe_experts must be non-negative", "parallel/experts-range"),
    ("ValueError: moe_ffn_hidden_size is set but num_moe_experts is None", "moe/ffn-hidden-size-needs-experts"),
    ("ValueError: moe_single_grouped_weight and moe_single_grouped_bias require moe_grouped_gemm",
     "moe/single-grouped-weight"),
    ("ValueError: moe_single_grouped_weight and moe_single_grouped_bias require transformer-engine", _TE),
    ("ValueError: moe_single_grouped_weight is currently supported", "moe/single-grouped-weight"),
    ("ValueError: moe_single_grouped_weight requires use_transformer_engine_op_fuser", "moe/single-grouped-weight"),
    ("ValueError: moe_single_grouped_bias requires add_bias_linear", "moe/single-grouped-weight"),
    ("ValueError: DeepEP backend is only supported with flex token dispatcher", "moe/flex-dispatcher"),
    ("ValueError: Only one backend is supported for flex token dispatcher", "moe/flex-dispatcher"),
    ("ValueError: Flex token dispatcher with deepep backend does not support", "moe/flex-dispatcher"),
    ("ValueError: moe_flex_dispatcher_backend='ncclep' requires", "moe/flex-dispatcher"),
    ("ValueError: Conflicting deprecated SM-count knobs", "moe/flex-dispatcher-num-sms"),
    ("ValueError: moe_shared_expert_intermediate_size must be", "moe/shared-expert-size"),
    ("ValueError: moe_shared_expert_overlap only works with", "moe/shared-expert-overlap"),
    ("moe_aux_loss_coeff must be a list of the same length", "moe/aux-loss-coeff-per-type"),
    ("ValueError: moe_expert_capacity_factor only works with", "moe/capacity-factor-balancing"),
    ("ValueError: moe_expert_capacity_factor must be set to use moe_pad_expert_input_to_capacity",
     "moe/pad-needs-capacity"),
    ("ValueError: moe_expert_rank_capacity_factor", "moe/rank-capacity-factor"),
    ("ValueError: CPU offloading can be done only for layers less than", "activation-offload/num-layers-range"),
    ("ValueError: Currently there is no support for Pipeline parallelism with CPU offloading",
     "activation-offload/pipeline-parallel"),
    ("ValueError: CPU offloading does not work when activation recomputation", "activation-offload/recompute"),
    ("ValueError: When using recompute_granuarlity:", "recompute/granularity-known"),
    ("ValueError: recompute_method: {} must be", "recompute/method-known"),
    ("ValueError: Using recompute_granularity: {} so recompute_method must be", "recompute/full-needs-method"),
    ("ValueError: When using recompute_granularity: {} recompute_num_layers must be between",
     "recompute/full-needs-num-layers"),
    ("ValueError: When using recompute_granularity: {} recompute_num_layers must be None",
     "recompute/selective-no-num-layers"),
    ("ValueError: distribute_saved_activations:", "recompute/distribute-saved-activations"),
    ("Invalid choices for recompute_modules", "recompute/modules-known"),
    ("ValueError: moe_act in recompute_modules", _RECOMPUTE_FEATURES),
    ("ValueError: mla_up_proj in recompute_modules", _RECOMPUTE_FEATURES),
    ("ValueError: gdn_norm_out in recompute_modules", _RECOMPUTE_FEATURES),
    ("ValueError: shared_experts recompute cannot work", _RECOMPUTE_FEATURES),
    ("ValueError: Delayed scaling does not support moe_act and layernorm recompute", _RECOMPUTE_FEATURES),
    ("ValueError: moe_act and layernorm recompute for fp8 needs transformer-engine", _TE),
    ("ValueError: Do not set --moe-layer-recompute with full recompute granularity", "recompute/moe-layer-not-full"),
    ("fine_grained_activation_offloading cannot be enabled with cpu_offloading",
     "activation-offload/not-with-fine-grained"),
    ("assert self.offload_modules is not None and len(self.offload_modules) > 0", "fine-grained/modules-given"),
    ("Invalid choices for offload_modules", "fine-grained/modules-known"),
    ("ValueError: attn_proj cannot be set to offload_modules alone", "fine-grained/attn-proj-needs-core-attn"),
    ("Cannot offload {} while recomputing the entire MoE layer", "fine-grained/not-inside-moe-recompute"),
    ("min_offloaded_tensor_size must be non-negative", "fine-grained/min-tensor-size"),
    ("activation_offload_fraction must be in range", "fine-grained/fraction-range"),
    ("delta_offload_bytes_across_pp_ranks must be non-negative", "fine-grained/delta-offload-bytes"),
    ("ValueError: fused_group_mlp requires use_transformer_engine_op_fuser", "fine-grained/fused-group-mlp"),
    ("ValueError: fused_group_mlp offloads the whole fused grouped MLP", "fine-grained/fused-group-mlp"),
    ("ValueError: moe_paged_stash cannot be enabled with cpu_offloading", "activation-offload/paged-stash"),
    ("ValueError: moe_paged_stash requires moe_expert_rank_capacity_factor", "moe/paged-stash"),
    ("ValueError: When moe_paged_stash is enabled, offload_modules must not include", "moe/paged-stash"),
    ("ValueError: num_layers_in_first_pipeline_stage and num_layers_in_last_pipeline_stage cannot be",
     "pipeline/one-layout-way"),
    ("ValueError: pipeline_model_parallel_layout cannot be set with other pipeline layout arguments",
     "pipeline/one-layout-way"),
    ("virtual_pipeline_model_parallel_size conflicts with pipeline_model_parallel_layout", _LAYOUT),
    ("ValueError: num_layers_in_first_pipeline_stage must be larger than 0", _UNEVEN),
    ("ValueError: number of layers at first stage:", _UNEVEN),
    ("ValueError: num_layers_in_last_pipeline_stage must be larger than 0", _UNEVEN),
    ("ValueError: number of layers at last stage:", _UNEVEN),
    ("ValueError: Mismatch: {} middle layers remaining", _UNEVEN),
    ("ValueError: number of layers at middle stage:", _UNEVEN),
    ("ValueError: number of layers on each middle pipeline rank:", _UNEVEN),
    ("ValueError: number of middle layers: {} must be divisible by middle pipeline_model_parallel_size", _EMB_LOSS),
    ("ValueError: num_layers: {} after enableaccount_for_embedding_in_pipeline_split", _EMB_LOSS),
    ("ValueError: number of layers on each pipeline rank: {}(after enable account_for_embedding", _EMB_LOSS),
    ("ValueError: When bias_activation_fusion is True", "model/bias-activation-fusion"),
    ("ValueError: bias_activation_fusion and use_te_activation_func cannot be both true", "model/bias-activation-fusion"),
    ("ValueError: fused_residual_rmsnorm is only supported when normalization is RMSNorm",
     "model/fused-residual-rmsnorm"),
    ("ValueError: TransformerEngine only support gelu, geglu, silu, swiglu, relu, reglu", "model/te-activation-func"),
    ("ValueError: Storing activation input in FP8 is supported only for SwiGLU", "model/activation-fp8-input-store"),
    ("ValueError: rotary_interleaved does not work with apply_rope_fusion for TE < 2.3.0", _TE),
    ("ValueError: apply_rope_fusion is not available", "model/rope-fusion-available"),
    ("ValueError: fused_single_qkv_rope does not support gated attention", "model/fused-qkv-rope-gate"),
    ("ValueError: rotary_interleaved does not work with multi_latent_attention", "model/multi-latent-attention-rope"),
    ("--mup-base-hidden-size must be positive", "model/mup-base-hidden-size"),
    ("Bias in Moe is only supported when ETP==1", "moe/bias-needs-etp-1"),
    ("ValueError: Expert bias for aux-loss-free routing only supports", "moe/expert-bias-score-function"),
    ("ValueError: Only transformer-engine>=", _TE),
    ("ValueError: fp8/fp4 must be specified when moe_router_padding_for_quantization", "moe/router-padding-quantization"),
    ("ValueError: allgather and alltoall_seq dispatcher does not support moe_router_padding",
     "moe/router-padding-quantization"),
    ("ValueError: Please use --moe-router-pre-softmax when topk is 1", "moe/topk-1-pre-softmax"),
    ("ValueError: moe_router_topk_limited_devices is deprecated", "moe/group-limited-routing"),
    ("ValueError: When using group limited routing, moe_router_num_groups must be specified",
     "moe/group-limited-routing"),
    ("num_moe_experts ({}) should be divisible by moe_router_num_groups", "moe/group-limited-routing"),
    ("moe_router_group_topk ({}) should be smaller than moe_router_num_groups", "moe/group-limited-routing"),
    ("Do not use enable_cuda_graph or external_cuda_graph with cuda_graph_impl", "model/cuda-graph-legacy-flags"),
    ("enable_cuda_graph and external_cuda_graph cannot be enabled at the same time", "model/cuda-graph-legacy-flags"),
    ("cuda_graph_scope and cuda_graph_modules cannot be set together", "model/cuda-graph-legacy-flags"),
    ("cuda_graph_modules must be a list of CudaGraphModule",
     UNREACHABLE + "an invariant of Megatron Core: normalize_cuda_graph_modules returns CudaGraphModule members, "
     "or refuses the value first (rule model/cuda-graph-modules-valid)"),
    ("Invalid cuda graph implementation", "model/cuda-graph-impl-known"),
    ("Invalid inference CUDA graph scope", "model/cuda-graph-inference-scope"),
    ('cuda_graph_modules must be empty when cuda_graph_impl="full_iteration"', "model/cuda-graph-full-iteration-modules"),
    ("ValueError: CUDA graphs not supported with CPU offloading", "activation-offload/cuda-graphs"),
    ("cuda_graph_modules must not contain both moe and moe_router", _GRAPH_MOE),
    ("moe_preprocess cuda graph is only supported with moe_router cuda graph", _GRAPH_MOE),
    ("moe cuda graph is only supported ", _GRAPH_MOE),
    ("mlp cuda graph is only supported for dense layers", _GRAPH_MOE),
    ("moe_preprocess cuda graph is not supported when there are DtoH copies", _GRAPH_MOE),
    ("full recompute is only supported with full iteration CUDA graph", _GRAPH_RECOMPUTE),
    ("moe recompute is not supported with moe_router CUDA graph", _GRAPH_RECOMPUTE),
    ("attention dropout is not supported with graphed attention recomputation", _GRAPH_RECOMPUTE),
    ("hidden dropout is not supported with graphed MLP/MoE recomputation", _GRAPH_RECOMPUTE),
    ("moe_input_jitter_eps is not supported with graphed moe recomputation", _GRAPH_RECOMPUTE),
    ("GTP + local CUDA graphs that capture shared_experts", _GRAPH_RECOMPUTE),
    ("fine-grained activation offloading with cuda_graph_impl='local' only supports offload_modules",
     "fine-grained/cuda-graphs"),
    ("fine-grained activation offloading with cuda_graph_impl='local' is not supported with whole-layer",
     _GRAPH_OFFLOAD),
    ("fine-grained activation offloading is only supported with transformer_engine CUDA graph",
     "fine-grained/cuda-graphs"),
    ("Token-drop MoE is temporarily not supported with activation offloading", _GRAPH_OFFLOAD),
    ("cuda_graph_warmup_steps must be greater than 0 when enabling fine-grained", _GRAPH_OFFLOAD),
    ("fine_grained_offloading_max_inflight_offloads must be a non-negative integer", _GRAPH_OFFLOAD),
    ("ValueError: Token dispatcher type: {} does not support variable sequence length", "moe/allgather-fixed-lengths"),
    ("ValueError: fused permutation is not available", _TE),
    ("A2A Overlap encounters hang issue with torch version < 2.6.0", _TORCH),  # also CommOverlapConfig's
    ("If enabling EP A2A overlap, virtual_pipeline_model_parallel_size must be specified", _EP),  # ... and below
    ("overlap_moe_expert_parallel_comm is only supported with expert model parallelism", _EP),
    ("overlap_moe_expert_parallel_comm is supported with alltoall/flex token dispatcher", _EP),
    ("disable full recomputation when enabling overlap_moe_expert_parallel_comm", _EP),
    ("disable recomputation method when enabling overlap_moe_expert_parallel_comm", _EP),
    ("recompute_num_layers must be None when enabling overlap_moe_expert_parallel_comm", _EP),
    ("disable moe in recompute_modules when enabling overlap_moe_expert_parallel_comm", _EP),
    ("overlap_moe_expert_parallel_comm is only supported with bf16 or fp16 model", _EP),
    ("disable moe_shared_expert_overlap when enabling overlap_moe_expert_parallel_comm", _EP),
    ("MTP supports at most one layer when enabling overlap_moe_expert_parallel_comm", _EP),
    ("overlap_moe_expert_parallel_comm with ncclep does not support offloading 'expert_fc1'", _EP),
    ("CUDA graph scope on moe and mlp is not supported with overlap_moe_expert_parallel_comm", _EP),
    ("overlap_moe_expert_parallel_comm must be enabled when enabling delay_wgrad_compute", _WGRAD),
    ("TE version >= 2.10.0 is required for delay_wgrad_compute with partial cuda graph", _TE),
    ("overlap_moe_expert_parallel_comm must be disabled when enabling overlap_dispatch_backward", _WGRAD),
    ("TE version >= 2.3.0 is required for overlap_dispatch_backward_with_experts_wgrad", _TE),
    ("delay_wgrad_compute and overlap_dispatch_backward_with_experts_wgrad are mutually exclusive", _WGRAD),
    ("overlap_moe_expert_parallel_comm must be enabled when enabling ep_overlap_early_attn_memory_release", _WGRAD),
    ("Length of cp_comm_type ({}) should equal to the total number of transformer layers",
     "parallel/cp-comm-type-per-layer"),
    ("Unsupported communication type for context parallelism", _CP_COMM_TYPE_TYPE),
    ("Pipeline model parallel size must be larger than 0", "parallel/pp-range"),
    ("ImportError: packaging is not installed",
     UNREACHABLE + "packaging is a dependency of the installed torch and transformers: it is importable wherever "
     "Megatron Bridge imports"),
    ("Must have at least torch version 2.7 or higher", _TORCH),
    ("Must have at least TE version 2.3 or higher to use symmetric memory all reduce", _TE),
    ("flash_decode cannot be used with no_rope", "model/no-rope-freq"),
    ("no_rope_freq={} should be divisible by num_layers", "model/no-rope-freq"),
    ("Length of no_rope list ({}) must match the number of layers", "model/no-rope-freq"),
    ("assert self.normalization == 'RMSNorm'", _INF), ("assert not self.layernorm_zero_centered_gamma", _INF),
    ("assert not self.add_bias_linear", _INF), ("assert not self.add_qkv_bias", _INF),
    ("assert not self.use_kitchen", _INF),
    ("RoPE fusion is not supported for DSAttention", _DSA),
    ("DSAttention context parallelism currently supports cp_comm_type=allgather only", _DSA),
    ("inference_fuse_tp_communication is only supported", "model/inference-only-options"),
    ("--inference-fuse-tp-communication is not supported for MoE models", "model/inference-only-options"),
    ("inference_disable_triton_nvls_kernels is only supported", "model/inference-only-options"),
    ("flash_attention_version must be one of 2, 3, or 4", "model/flash-attention-version"),
    ("Batch invariant mode", "model/batch-invariant-mode"),
    # ModelParallelConfig.__post_init__ and resolve_tensor_parallel_weight_shards (megatron.core.model_parallel_config)
    ("ValueError: {} ({}) must be >= {} ({}).", "parallel/tp-weight-shards"),
    ("ValueError: {} ({}) must be divisible by {} ({}).", "parallel/tp-weight-shards"),
    ("ValueError: Cannot use sequence parallelism without tensor parallelism",
     UNREACHABLE + "Megatron Bridge's TransformerConfig.finalize() turns sequence_parallel off when "
     "tensor_model_parallel_size <= 1, before Megatron Core's post-init checks it"),
    ("ValueError: When using pipeline parallelism, pipeline_dtype must be specified", "parallel/pipeline-dtype"),
    ("ValueError: Cannot defer embedding wgrad compute", "parallel/defer-embedding-wgrad"),
    ("ValueError: Wgrad deferral limit should be greater than or equal to 0", "parallel/defer-embedding-wgrad"),
    ("ValueError: Pipeline parallel communication overlapping in warmup and flush", "parallel/p2p-warmup-flush"),
    # PipelineParallelLayerLayout (model.pipeline_model_parallel_layout)
    ("pipeline_model_parallel_layout must be a list of lists", _LAYOUT),
    ("pipeline_model_parallel_layout must be divisible by pipeline_model_parallel_size", _LAYOUT),
    ("elements in pipeline_model_parallel_layout must be LayerType or str", _LAYOUT),
    ("{} is not a valid LayerType", _LAYOUT), ("All layers must be a valid LayerType", _LAYOUT),
    ("The first layer must be embedding", _LAYOUT), ("The last layer must be loss", _LAYOUT),
    ("Embedding must be specified exactly once", _LAYOUT), ("Loss must be specified exactly once", _LAYOUT),
    ("Number of decoder layers {}must match num_layers", _LAYOUT),
    ("Number of mtp layers in layout must match mtp_num_layers", _LAYOUT),
    ("decoder layers must be placed before MTP layers", _LAYOUT),
    ("Currently we restrict that the MTP should", _LAYOUT),
    ("All of the MTP layers must be in the same one virtual pipeline stage", _LAYOUT),
    ("NotImplementedError: Encoder layer is not supported for flexible pipeline layout", _LAYOUT),
    ("Invalid layer character:", _LAYOUT),
    # cuda_graph_config (megatron.core.transformer): model.cuda_graph_modules / inference_cuda_graph_scope
    ("full scope cannot be used with other scopes", _GRAPH_MODULES),
    ("cuda_graph_modules values must be strings or CudaGraphModule enums", _GRAPH_MODULES),
    ("inference_cuda_graph_scope must be a string or InferenceCudaGraphScope enum", _GRAPH_MODULES),
    ("AssertionError: cuda_graph_modules cannot contain multiple deprecated values", _GRAPH_MODULES),
    ("cuda_graph_modules='full_iteration' cannot be combined with", _GRAPH_MODULES),
    ("cuda_graph_modules='full_iteration_inference' cannot be combined with", _GRAPH_MODULES),
    # _validate_dsa_kernel_backend_dependencies (megatron.core.utils)
    ("ValueError: dsa_kernel_backend must be one of", _DSA), ("ValueError: dsa_kernel_backend={} requires", _DSA),
    # validate_cuda_graph_configuration (megatron.bridge.utils.cuda_graph)
    ('ValueError: Megatron Bridge supports {}.cuda_graph_impl="local" only for full-iteration CUDA graphs',
     "model/cuda-graph-local-full-iteration"),
    # OptimizerConfig / DistributedDataParallelConfig.__post_init__ (megatron.core)
    ("ValueError: overlap_param_gather_with_optimizer_step is not supported with reuse_grad_buf_for_mxfp8_param_ag",
     "optimizer/mxfp8-param-gather-overlap"),
    ("--use-precision-aware-optimizer only supported with", "optimizer/precision-aware-adam"),
    ("Current FusedAdam of TE doesn't support --use-precision-aware-optimizer",
     "optimizer/precision-aware-te-fused-adam"),
    ("RuntimeError: --use-precision-aware-optimizer requires FusedAdam from TransformerEngine",
     "optimizer/precision-aware-te-fused-adam"),
    ("main_grads_dtype can only be fp32", "optimizer/dtypes-need-precision-aware"),
    ("main_params_dtype can only be fp32", "optimizer/dtypes-need-precision-aware"),
    ("exp_avg_dtype can only be fp32", "optimizer/dtypes-need-precision-aware"),
    ("exp_avg_sq_dtype can only be fp32", "optimizer/dtypes-need-precision-aware"),
    ("Reuse grad buffer only when keeping params in MXFP8", "ddp/reuse-grad-buf-needs-fp8-param-gather"),
    ("ValueError: PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True is currently not supported with nccl_ub",
     "ddp/nccl-ub-expandable-segments"),
    ("Only need to explicitly specify param_name patterns for FP32 local accumulation",
     "ddp/fp32-accumulation-patterns"),
    ("Cannot specify both num_buckets and bucket_size", "ddp/buckets"),
    ("num_buckets must be greater than 0", "ddp/buckets"),
    # MixedPrecisionConfig / get_mixed_precision_config (megatron.bridge.training.mixed_precision)
    ("ValueError: fp4 requires Transformer Engine >= 2.7.0", _TE),
    ("ValueError: Unknown mixed-precision recipe", "precision/preset-known"),
    # CommOverlapConfig.setup -> _get_model_comm_overlap_cfgs (megatron.bridge.training.comm_overlap)
    ("model_cfg: {} does not have overlap_moe_expert_parallel_comm",
     UNREACHABLE + "every recipe here builds a GPTModelProvider, a Megatron Core TransformerConfig, which declares "
     "overlap_moe_expert_parallel_comm; an override cannot change the model's type"),
    ("overlap_moe_expert_parallel_comm is only supported when", _EP),
    ("TE version >= 2.7.0 is required for", _TE),
    ("overlap_moe_expert_parallel_comm is required for delay_wgrad_compute", _WGRAD),
    ("CUDA graph with delay_wgrad_compute requires TE version", _TE),
    ("CUDA graph with delay_wgrad_compute requires gradient_accumulation_fusion", _WGRAD),
    ("CUDA graph with delay_wgrad_compute does not support attention bias", _WGRAD),
    # str_to_callable / str_to_dtype (megatron.bridge.utils.activation_map), from model.finalize()
    ("ValueError: Unknown activation function:",
     UNREACHABLE + "needs model.activation_func given as a string; the override layer refuses to set a function "
     "from the command line, and every recipe here sets a callable"),
    ("ValueError: Unknown dtype:",
     UNREACHABLE + "needs model.params_dtype / pipeline_dtype as an unknown string; the override layer turns them into "
     "a torch dtype (float32, bfloat16, float16) or refuses the value"),
    # _enable_safe_hybridep_dispatch (megatron.bridge.models.transformer_config)
    ("AttributeError: Megatron Core TransformerConfig does not expose a HybridEP uneven-input padding field",
     UNREACHABLE + "an invariant between Megatron Bridge and the Megatron Core it is installed with (the "
     "HybridEP padding field exists in this one); no config key decides it"),
)
SITES += MODEL_SITES


def site_target(text: str) -> str | None:
    """The rule id (or UNREACHABLE reason) of a site's normalized text: the longest matching start."""
    matches = [(prefix, target) for prefix, target in SITES if text.startswith(prefix)]
    return max(matches, key=lambda m: len(m[0]))[1] if matches else None
