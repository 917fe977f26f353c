"""Rules of the streaming offload engine (mbridge_offload/runtime/streaming_engine.py, env MBRIDGE_OFFLOAD_ENGINE)."""

from __future__ import annotations

from mbridge_offload.facts.key_ranges import fixed
from mbridge_offload.facts.offload_engine import (BF16_MOMENTS, COPY_AT_STEP, COPY_PAUSE_ENV, COPY_PAUSE_KEY,
                                                 COPY_PAUSE_KNOWN_FIX, COPY_PAUSE_RANGE_US, COPY_WINDOW_ENV,
                                                 COPY_WINDOW_KEY,
                                                 COPY_WINDOW_KNOWN_FIX, COPY_WINDOWS, DELAYED, DELAYED_COPY_START_ENV,
                                                 DELAYED_COPY_START_KEY, DELAYED_COPY_START_KNOWN_FIX,
                                                 DELAYED_COPY_STARTS, ENGINE_ENV, ENGINE_KEY, ENGINE_MODES, EXACT,
                                                 FETCH_AHEAD_ENV, FETCH_AHEAD_KEY, FETCH_AHEAD_VALUES, FP32_MOMENTS,
                                                 FP32_MOMENTS_FIX, LIBRARY, MOMENT_BYTES, READ_FIXES_MEASURED, STREAM,
                                                 STREAM_MOMENTS_ENV, STREAM_MOMENTS_KEY, STREAM_MOMENTS_KNOWN_FIX,
                                                 STREAM_MOMENTS_MEASURED, copies_at_next_step, copy_pause_known,
                                                 copy_pause_setting,
                                                 copy_window_known, copy_window_setting,
                                                 delayed_copy_start_setting, engine_mode, fetch_ahead_on,
                                                 fetch_ahead_setting, stream_host_bytes_per_param, stream_moments,
                                                 ZERO_BY_REGION_ENV, ZERO_BY_REGION_KEY, ZERO_BY_REGION_VALUES,
                                                 zero_by_region_on, zero_by_region_setting)
from mbridge_offload.validation.activation_offload import activation_offload_on
from mbridge_offload.validation.choices import OPTIMIZER_WORDS
from mbridge_offload.validation.fine_grained import fine_grained_on
from mbridge_offload.validation.guard import guarded, sane
from mbridge_offload.validation.optimizer_offload import OFFLOAD_ON_TEXT, offload_on_fix
from mbridge_offload.validation.rule import OPTIMIZER, Context, Rule

# What diagnose.py says with the fixes it names for a run with the stream engine (facts' FP32_MOMENTS_FIX where bf16
# moments may have made the loss diverge, BF16_MOMENTS_FIX where the host ran out of memory; diagnosis/engine.py adds
# them to the rule's own fix)
FP32_MOMENTS_SUSPECT_WORDS = ("a suspect: the run kept Adam's moments in bf16, rounded at every step; resume from the "
                              "last checkpoint before it with fp32 moments, which load one saved with bf16 ones")
BF16_MOMENTS_HOST_WORDS = (
    f"Adam's moments in bf16 on the host: {stream_host_bytes_per_param(FP32_MOMENTS)} -> "
    f"{stream_host_bytes_per_param(BF16_MOMENTS)} bytes per offloaded parameter; NOT bit-identical to no offload: "
    "the moments are rounded to bf16 at every step, compare the first steps' loss with fp32 moments'")

LOW_PRECISION_PARAM_KEYS = ("ddp.fp8_param_gather", "ddp.fp4_param_gather", "optimizer.use_precision_aware_optimizer",
                            "ddp.use_megatron_fsdp")


def _mode(ctx: Context) -> str:
    return engine_mode(ctx.cfg.env_vars, ctx.environ)


def _streaming(ctx: Context) -> bool:
    return _mode(ctx) in ENGINE_MODES and _mode(ctx) != LIBRARY


def _streaming_offload(ctx: Context) -> bool:
    return _streaming(ctx) and bool(ctx.opt.optimizer_cpu_offload)


def _offload_with(mode: str):
    """Whether ``mode``'s engine runs the offloaded optimizer step (a rule's ``applies``)."""
    return lambda ctx: _streaming_offload(ctx) and _mode(ctx) == mode


_stream_offload = _offload_with(STREAM)
_delayed_offload = _offload_with(DELAYED)


def _cpu_adam_offload(ctx: Context) -> bool:
    """exact or delayed: the engines that run the library's CPU Adam."""
    return _streaming_offload(ctx) and _mode(ctx) != STREAM


def _moments(ctx: Context) -> str:
    """The stream engine's moments as the run will read them (the shell's value wins), the default where unset."""
    return stream_moments(ctx.cfg.env_vars, ctx.environ)


def _bf16_moments(ctx: Context) -> bool:
    return _moments(ctx) == BF16_MOMENTS


def _moments_where(ctx: Context) -> str:
    return (f"{_moments(ctx)} with the {_mode(ctx)} engine, optimizer offload "
            + ("on" if ctx.opt.optimizer_cpu_offload else "off"))


def _one_shard(ctx: Context) -> bool:
    return ctx.sizes.dense_optimizer_shards == 1 and ctx.sizes.expert_optimizer_shards == 1


def _shards(ctx: Context) -> str:
    sizes = ctx.sizes
    return f"{_mode(ctx)} on {ctx.num_gpus} GPUs: " + (
        f"{sizes.dense_optimizer_shards} dense and {sizes.expert_optimizer_shards} expert optimizer shards"
        if ctx.num_experts else f"{sizes.dense_optimizer_shards} optimizer shards")


def _set(ctx: Context, key: str) -> bool:
    section, name = key.split(".")
    return bool(getattr(getattr(ctx.cfg, section), name, False))


def _early_writers(ctx: Context) -> dict[str, bool]:
    """The settings under which the backward's kernels write the gradient buffer before DDP's hook for a parameter
    (zero-by-region-needs-unfused-accumulation)."""
    return {"model.gradient_accumulation_fusion": bool(getattr(ctx.cfg.model, "gradient_accumulation_fusion", False)),
            "model.delay_wgrad_compute": bool(getattr(ctx.cfg.model, "delay_wgrad_compute", False)),
            "ddp.delay_wgrad_compute": bool(getattr(ctx.cfg.ddp, "delay_wgrad_compute", False))}


def _engine_rule(suffix: str, text: str, holds, fix: str, key: str = ENGINE_KEY, applies=_streaming_offload,
                 observed=None) -> Rule:
    return Rule(id=f"offload-engine/{suffix}", mechanism=OPTIMIZER, key=key, text=text, applies=applies,
                holds=holds, fix=fixed(fix), observed=observed)


def _ignored_with(setting):
    """What an engine-only setting's rule says it saw: the setting's value, and the engine and offload that would
    ignore it (the key's value alone would not say why it is refused)."""
    return lambda c: (f"{setting(c.cfg.env_vars, c.environ)} (engine {_mode(c)}, optimizer offload "
                      f"{'on' if c.opt.optimizer_cpu_offload else 'off'})")


_OVERLAP_ON = "optimizer.overlap_cpu_optimizer_d2h_h2d=True"
_OVERLAP_ON_TEXT = f" [{_OVERLAP_ON} with the exact or delayed engine where it is off]"


def _overlap_if_needed(ctx: Context) -> str:
    """The copy streams the exact and delayed engines need (needs-overlap-streams), where the config has them off."""
    return f" {_OVERLAP_ON}" if _mode(ctx) in (EXACT, DELAYED) and not ctx.opt.overlap_cpu_optimizer_d2h_h2d else ""


def _needing_offload(suffix: str, text: str, first: str, rest: str, engine_needs: bool = False, **rule) -> Rule:
    """An engine rule whose fix turns optimizer offload on after ``first`` (offload_on_fix: with what offload needs
    that the config lacks; ``engine_needs``: and the overlap streams of the engine the config keeps), with its
    docs-table form."""
    also = _overlap_if_needed if engine_needs else (lambda _: "")
    return Rule(id=f"offload-engine/{suffix}", mechanism=OPTIMIZER, text=text, **{"key": ENGINE_KEY, **rule},
                fix=lambda c: f"{first}{offload_on_fix(c)}{also(c)}{rest}",
                fix_text=f"{first}{OFFLOAD_ON_TEXT}{_OVERLAP_ON_TEXT if engine_needs else ''}{rest}")


_SHARED_LINK = "its copies share the host link and the GPU's copy engines with the engine's"
# (rule name, key, holds, what, why) of the settings the engines have not run with on the H200
NOT_RUN_WITH = (
    ("activation-offload", "model.cpu_offloading", lambda c: not activation_offload_on(c),
     "layer-level activation offload", _SHARED_LINK),
    ("fine-grained", "model.fine_grained_activation_offloading", lambda c: not fine_grained_on(c),
     "fine-grained activation offload", _SHARED_LINK),
    ("pipeline", "model.pipeline_model_parallel_size", lambda c: c.model.pipeline_model_parallel_size == 1,
     "pipeline parallelism", "the forward hooks that wait for each module's update then run across a stage's micro "
     "batches; Megatron's 1F1B schedule with them ran on gloo ranks on the CPU"),
)


RULES: tuple[Rule, ...] = guarded(
    _engine_rule("known", f"the offload engine ({ENGINE_ENV}) is one of {', '.join(ENGINE_MODES)}",
                 applies=lambda c: c.env(ENGINE_ENV) is not None, holds=lambda c: _mode(c) in ENGINE_MODES,
                 fix=f"++{ENGINE_KEY}=exact  (or run_recipe.py --offload-engine exact)", observed=_mode),
    _needing_offload("needs-optimizer-offload", "a streaming offload engine runs the offloaded optimizer step: with "
                     "optimizer offload off it has nothing to run", "", f"  (or ++{ENGINE_KEY}=library)",
                     engine_needs=True, applies=_streaming, holds=lambda c: bool(c.opt.optimizer_cpu_offload),
                     observed=_mode),
    _engine_rule("needs-overlap-streams", "the streaming offload engine copies on the D2H/H2D overlap streams "
                 "(run_recipe.py's tuning turns them on); the stream mode has copy streams of its own",
                 key="optimizer.overlap_cpu_optimizer_d2h_h2d",
                 applies=_cpu_adam_offload,
                 holds=lambda c: bool(c.opt.overlap_cpu_optimizer_d2h_h2d),
                 fix="optimizer.overlap_cpu_optimizer_d2h_h2d=True"),
    *(Rule(id=f"offload-engine/{mode}-several-ranks", mechanism=OPTIMIZER, key=ENGINE_KEY,
           text=f"the {mode} engine with several data-parallel or expert-data-parallel ranks has not run on several "
                f"GPUs yet ({how}; its scenarios ran on gloo ranks on the CPU): compare the first steps' loss with "
                "the library engine's",
           applies=sane(_offload_with(mode)),
           holds=_one_shard,
           observed=_shards,
           fix=fixed(f"++{ENGINE_KEY}=library  (to compare the loss of the first steps)"), severity="warning")
      for mode, how in ((STREAM, "each bucket's parameter all-gather waits on the GPU for this rank's update"),
                        (EXACT, "each bucket's parameter all-gather waits for this rank's CPU update of its shards; "
                                "without ddp.overlap_param_gather it runs at the end of the step and waits for the "
                                "whole update"),
                        (DELAYED, "every rank's weights stay one step behind alike; a save or an evaluation applies "
                                  "the pending update and all-gathers it on every rank"))),
    # What the engines have not run with: allowed, said before launch, and compared by the user on the first steps.
    *(Rule(id=f"offload-engine/not-run-with-{name}", mechanism=OPTIMIZER, key=key,
           text=f"the streaming offload engines have not run with {what} yet ({why}): compare the first steps' loss "
                "and step time with the library engine's",
           applies=_streaming_offload, holds=holds, fix=fixed(f"++{ENGINE_KEY}=library  (the run to compare with)"),
           severity="warning")
      for name, key, holds, what, why in NOT_RUN_WITH),
    _engine_rule("stream-adam", "the stream engine updates with the GPU's Adam (Transformer Engine's FusedAdam, the "
                 "optimizer without offload): it supports optimizer.optimizer=adam only", key="optimizer.optimizer",
                 applies=lambda c: _stream_offload(c) and OPTIMIZER_WORDS.admits(c.opt.optimizer),
                 holds=lambda c: getattr(c.opt, "optimizer", "adam") == "adam",
                 fix=f"optimizer.optimizer=adam  (or ++{ENGINE_KEY}=exact)"),
    _engine_rule("stream-sync-save", "the stream engine keeps Adam's moments in memory that forked processes do not "
                 "inherit (the data loader's workers would otherwise copy it); an asynchronous checkpoint save reads "
                 "the optimizer state from a forked process", key="checkpoint.async_save",
                 applies=_stream_offload,
                 holds=lambda c: not getattr(c.cfg.checkpoint, "async_save", False),
                 fix=f"checkpoint.async_save=False  (or ++{ENGINE_KEY}=exact)"),
    _engine_rule("fetch-ahead-known", f"the stream engine's fetch-ahead ({FETCH_AHEAD_ENV}) is on or off",
                 key=FETCH_AHEAD_KEY, applies=lambda c: c.env(FETCH_AHEAD_ENV) is not None,
                 holds=lambda c: fetch_ahead_setting(c.cfg.env_vars, c.environ) in FETCH_AHEAD_VALUES,
                 observed=lambda c: fetch_ahead_setting(c.cfg.env_vars, c.environ),
                 fix=f"++{FETCH_AHEAD_KEY}=on  (or off, the default; a value in the shell wins: set it there; in a "
                     "YAML file quote it, 'on': YAML reads a bare on or off as true or false)"),
    _needing_offload("fetch-ahead-needs-stream", "fetch-ahead brings the stream engine's chunks up during the "
                     "backward: it runs only with the stream engine and optimizer offload on",
                     f"++{ENGINE_KEY}=stream ", f"  (or ++{FETCH_AHEAD_KEY}=off)", key=FETCH_AHEAD_KEY,
                     applies=lambda c: fetch_ahead_on(c.cfg.env_vars, c.environ), holds=lambda c: _stream_offload(c),
                     observed=_mode),
    Rule(id="offload-engine/fetch-ahead-measured", mechanism=OPTIMIZER, key=FETCH_AHEAD_KEY,
         text="on the 4-layer MoE proxy (one H100, docs/benchmarks/offload-engine/stream-fetch-ahead) fetch-ahead "
              "kept the update and the run's peak allocated, but its buffers added 2.9 GiB of reserved device "
              "memory, which the plan does not count, and no step-time gain was resolved (1.44x against stream's "
              "1.41x); compare the step time and peak_reserved_gib with it off",
         applies=lambda c: _stream_offload(c) and fetch_ahead_on(c.cfg.env_vars, c.environ), holds=lambda c: False,
         observed=lambda c: "on", fix=fixed(f"++{FETCH_AHEAD_KEY}=off  (the run to compare with)"),
         severity="warning"),
    _engine_rule("copy-pieces-in-flight-known", f"the exact and delayed engines' copies keep a whole number from "
                 f"{COPY_WINDOWS[0]} to {COPY_WINDOWS[-1]} of pieces in flight ({COPY_WINDOW_ENV})",
                 key=COPY_WINDOW_KEY, applies=lambda c: c.env(COPY_WINDOW_ENV) is not None,
                 holds=lambda c: copy_window_known(copy_window_setting(c.cfg.env_vars, c.environ)),
                 observed=lambda c: repr(copy_window_setting(c.cfg.env_vars, c.environ)), fix=COPY_WINDOW_KNOWN_FIX),
    Rule(id="offload-engine/copy-pieces-need-exact-or-delayed", mechanism=OPTIMIZER, key=COPY_WINDOW_KEY,
         text="the pieces in flight are the exact and delayed engines' copies: with another engine, or with optimizer "
              "offload off, the setting would be ignored",
         applies=lambda c: c.env(COPY_WINDOW_ENV) is not None,
         holds=lambda c: _streaming_offload(c) and _mode(c) in (EXACT, DELAYED),
         observed=_ignored_with(copy_window_setting),
         # the fix names the delayed engine: with it, the overlap streams it needs where the config has them off
         fix=lambda c: (f"++{ENGINE_KEY}=delayed {offload_on_fix(c)}"
                        f"{'' if c.opt.overlap_cpu_optimizer_d2h_h2d else ' ' + _OVERLAP_ON}"
                        f"  (or exact; or drop {COPY_WINDOW_KEY})"),
         fix_text=f"++{ENGINE_KEY}=delayed {OFFLOAD_ON_TEXT} [{_OVERLAP_ON} where it is off]  (or exact; or drop "
                  f"{COPY_WINDOW_KEY})"),
    _engine_rule("copy-piece-pause-known", f"the exact and delayed engines' pause before each piece of their copies "
                 f"({COPY_PAUSE_ENV}) is a whole number of microseconds from {COPY_PAUSE_RANGE_US[0]} to "
                 f"{COPY_PAUSE_RANGE_US[1]}", key=COPY_PAUSE_KEY, applies=lambda c: c.env(COPY_PAUSE_ENV) is not None,
                 holds=lambda c: copy_pause_known(copy_pause_setting(c.cfg.env_vars, c.environ)),
                 observed=lambda c: repr(copy_pause_setting(c.cfg.env_vars, c.environ)), fix=COPY_PAUSE_KNOWN_FIX),
    _needing_offload("copy-piece-pause-needs-exact-or-delayed", "the pause between pieces spaces the exact and delayed "
                     "engines' copies: with another engine, or with optimizer offload off, the setting would be "
                     "ignored", f"++{ENGINE_KEY}=delayed ", f"  (or exact; or drop {COPY_PAUSE_KEY})",
                     engine_needs=True, key=COPY_PAUSE_KEY, applies=lambda c: c.env(COPY_PAUSE_ENV) is not None,
                     holds=lambda c: _cpu_adam_offload(c), observed=_ignored_with(copy_pause_setting)),
    _engine_rule("copy-piece-pause-or-window", f"with a pause between pieces ({COPY_PAUSE_ENV}) every piece is "
                 f"enqueued at once: a window of pieces in flight ({COPY_WINDOW_ENV}) would be ignored",
                 key=COPY_WINDOW_KEY,
                 applies=lambda c: c.env(COPY_PAUSE_ENV) is not None,
                 holds=lambda c: c.env(COPY_WINDOW_ENV) is None,
                 observed=lambda c: f"{copy_window_setting(c.cfg.env_vars, c.environ)} with {COPY_PAUSE_ENV}="
                                    f"{copy_pause_setting(c.cfg.env_vars, c.environ)}",
                 fix=f"drop {COPY_WINDOW_KEY}  (or drop {COPY_PAUSE_KEY})"),
    Rule(id="offload-engine/copy-piece-pause-unmeasured", mechanism=OPTIMIZER, key=COPY_PAUSE_KEY,
         text="spaced pieces let another stream's small copy through at or near the copy's full rate (one H100, "
              f"docs/benchmarks/offload-engine/copy-window/); {READ_FIXES_MEASURED}; spaced pieces' step time in the "
              "exact mode is unmeasured; compare the step time with the setting dropped",
         applies=lambda c: _cpu_adam_offload(c) and c.env(COPY_PAUSE_ENV) is not None, holds=lambda c: False,
         observed=lambda c: copy_pause_setting(c.cfg.env_vars, c.environ),
         fix=fixed(f"drop {COPY_PAUSE_KEY}  (the run to compare with)"), severity="warning"),
    _engine_rule("zero-by-region-known", f"the exact and delayed engines' zeroing by region ({ZERO_BY_REGION_ENV}) "
                 "is on or off", key=ZERO_BY_REGION_KEY, applies=lambda c: c.env(ZERO_BY_REGION_ENV) is not None,
                 holds=lambda c: zero_by_region_setting(c.cfg.env_vars, c.environ) in ZERO_BY_REGION_VALUES,
                 observed=lambda c: repr(zero_by_region_setting(c.cfg.env_vars, c.environ)),
                 fix=f"++{ZERO_BY_REGION_KEY}=on  (or off, the default; a value in the shell wins: set it there; in a "
                     "YAML file quote it, 'on': YAML reads a bare on or off as true or false)"),
    _needing_offload("zero-by-region-needs-exact-or-delayed", "the zeroing by region orders the exact and delayed "
                     "engines' copies of the gradients to the host: with another engine, or with optimizer offload "
                     "off, the setting would be ignored", f"++{ENGINE_KEY}=delayed ", f"  (or exact; or "
                     f"++{ZERO_BY_REGION_KEY}=off)", engine_needs=True, key=ZERO_BY_REGION_KEY,
                     applies=lambda c: zero_by_region_on(c.cfg.env_vars, c.environ),
                     holds=lambda c: _cpu_adam_offload(c), observed=_ignored_with(zero_by_region_setting)),
    _engine_rule("zero-by-region-needs-unfused-accumulation", "the zeroing by region makes the backward wait for a "
                 "region's zeroing in Megatron's hook that adds each weight gradient into the gradient buffer; with "
                 "gradient-accumulation fusion or a delayed weight-gradient computation the backward's kernels write "
                 "the buffer before that hook", key="model.gradient_accumulation_fusion",
                 applies=lambda c: _cpu_adam_offload(c) and zero_by_region_on(c.cfg.env_vars, c.environ),
                 holds=lambda c: not any(_early_writers(c).values()),
                 observed=lambda c: ", ".join(f"{key}={value}" for key, value in _early_writers(c).items()),
                 fix=f"model.gradient_accumulation_fusion=False model.delay_wgrad_compute=False "
                     f"ddp.delay_wgrad_compute=False  (or ++{ZERO_BY_REGION_KEY}=off)"),
    _engine_rule("delayed-copy-start-known", f"the delayed engine's gradient copies start in the step or at the next "
                 f"step's gradient zeroing ({DELAYED_COPY_START_ENV}: {' or '.join(DELAYED_COPY_STARTS)})",
                 key=DELAYED_COPY_START_KEY, applies=lambda c: c.env(DELAYED_COPY_START_ENV) is not None,
                 holds=lambda c: delayed_copy_start_setting(c.cfg.env_vars, c.environ) in DELAYED_COPY_STARTS,
                 observed=lambda c: repr(delayed_copy_start_setting(c.cfg.env_vars, c.environ)),
                 fix=DELAYED_COPY_START_KNOWN_FIX),
    _needing_offload("delayed-copy-start-needs-delayed", "only the delayed engine's update can wait for copies started "
                     "at the next step (the exact engine's next forward waits for its update): with another engine, "
                     "or with optimizer offload off, the setting would be ignored", f"++{ENGINE_KEY}=delayed ",
                     f"  (or ++{DELAYED_COPY_START_KEY}={COPY_AT_STEP})", engine_needs=True,
                     key=DELAYED_COPY_START_KEY, applies=lambda c: copies_at_next_step(c.cfg.env_vars, c.environ),
                     holds=lambda c: _delayed_offload(c), observed=_ignored_with(delayed_copy_start_setting)),
    Rule(id="offload-engine/delayed-copy-start-unmeasured", mechanism=OPTIMIZER, key=DELAYED_COPY_START_KEY,
         text="the delayed engine's copies from the next step's zeroing took out of its profile the scalar reads' "
              "waits behind the D2H; they also start after the device-wide synchronize of Megatron's interval timer "
              "at each logged step (logger.log_interval), a synchronize that, with the copies started in the step, "
              f"waits for the rest of the D2H; {READ_FIXES_MEASURED}; compare the step time with it off",
         applies=lambda c: _delayed_offload(c) and copies_at_next_step(c.cfg.env_vars, c.environ),
         holds=lambda c: False, observed=lambda c: delayed_copy_start_setting(c.cfg.env_vars, c.environ),
         fix=fixed(f"++{DELAYED_COPY_START_KEY}={COPY_AT_STEP}  (the run to compare with)"), severity="warning"),
    Rule(id="offload-engine/zero-by-region-no-gain", mechanism=OPTIMIZER, key=ZERO_BY_REGION_KEY,
         text="on the dense proxy at fraction 1 (one H100, docs/benchmarks/offload-engine/zero-by-region) the zeroing "
              "by region changed no update but brought no step-time gain: the delayed mode ran 1.40x with it and "
              "1.34x without, inside the runs' 10-13 % spread (the exact mode's step time with it is not measured); "
              "compare the step time with it off",
         applies=lambda c: _cpu_adam_offload(c) and zero_by_region_on(c.cfg.env_vars, c.environ),
         holds=lambda c: False, observed=lambda c: "on",
         fix=fixed(f"++{ZERO_BY_REGION_KEY}=off  (the run to compare with)"), severity="warning"),
    _engine_rule("stream-moments-known", f"the stream engine's moments ({STREAM_MOMENTS_ENV}) are one of "
                 f"{', '.join(MOMENT_BYTES)}", key=STREAM_MOMENTS_KEY,
                 applies=lambda c: c.env(STREAM_MOMENTS_ENV) is not None, holds=lambda c: _moments(c) in MOMENT_BYTES,
                 observed=lambda c: repr(_moments(c)),
                 fix=STREAM_MOMENTS_KNOWN_FIX),
    _needing_offload("stream-moments-need-stream", "bf16 moments are the stream engine's: with another engine, or "
                     "with optimizer offload off, the setting would be ignored and the moments stay fp32",
                     f"++{ENGINE_KEY}=stream ", f"  (or {FP32_MOMENTS_FIX})", key=STREAM_MOMENTS_KEY,
                     applies=_bf16_moments, holds=lambda c: _stream_offload(c), observed=_moments_where),
    Rule(id="offload-engine/stream-moments-not-exact", mechanism=OPTIMIZER, key=STREAM_MOMENTS_KEY,
         text="with bf16 moments the stream engine's update is not the one without offload: Adam computes in fp32 "
              "but its moments are rounded to bf16 at every step (measured on the CPU stand-in: the shards follow "
              f"AdamW with bf16-rounded moments exactly; on a GPU: {STREAM_MOMENTS_MEASURED})",
         applies=lambda c: _stream_offload(c) and _bf16_moments(c), holds=lambda c: False,
         observed=lambda c: BF16_MOMENTS,
         fix=fixed(f"{FP32_MOMENTS_FIX}  (the run to compare the first steps' loss with)"), severity="warning"),
    _engine_rule("delayed-low-precision-weights", "the delayed engine needs bf16 or fp16 model weights: an fp32 weight "
                 "is its own fp32 copy, which the delayed update would overwrite during the next step",
                 key="model.bf16", applies=_delayed_offload,
                 holds=lambda c: bool(getattr(c.model, "bf16", False) or getattr(c.model, "fp16", False)),
                 fix=f"model.bf16=True  (or ++{ENGINE_KEY}=exact)"),
    Rule(id="offload-engine/params-norm", mechanism=OPTIMIZER, key="logger.log_params_norm",
         text="logger.log_params_norm reads the fp32 weights after every step: the streaming offload engine then "
              "waits for its update each step, and its overlap with the next step is lost",
         applies=_streaming_offload, holds=lambda c: not getattr(c.cfg.logger, "log_params_norm", False),
         fix=fixed("logger.log_params_norm=False"), severity="warning"),
    *(_engine_rule(f"bf16-params-{key.split('.')[1].replace('_', '-')}",
                   "the streaming offload engine casts the fp32 weights into the bf16/fp32 model weights itself: "
                   f"{key} is not supported with it", key=key, holds=lambda c, key=key: not _set(c, key),
                   fix=f"{key}=False  (or ++{ENGINE_KEY}=library)")
      for key in LOW_PRECISION_PARAM_KEYS),
    _engine_rule("cuda-graphs", "the streaming offload engine waits in forward hooks, which CUDA graphs skip",
                 key="model.cuda_graph_impl", holds=lambda c: getattr(c.model, "cuda_graph_impl", "none") == "none",
                 fix=f"model.cuda_graph_impl=none  (or ++{ENGINE_KEY}=library)"),
    _engine_rule("optimizer-cuda-graph", "the streaming offload engine's optimizer step is Python that a CUDA graph's "
                 "replay skips: the offloaded parameters would stop being updated",
                 key="optimizer.optimizer_cuda_graph",
                 holds=lambda c: not getattr(c.opt, "optimizer_cuda_graph", False),
                 fix=f"optimizer.optimizer_cuda_graph=False  (or ++{ENGINE_KEY}=library)"),
)
