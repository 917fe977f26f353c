"""Upstream ``ConfigContainer.validate()`` (via ``runtime_config_update``), run on a copy in an isolated
process state, and its error translated into a ``Problem``: the rule of the table that states the same
constraint (with its fix), found by the site that raised it (``upstream_rules.SITES``, for the checks of
``megatron.bridge.training.config``) or by its words (``_UPSTREAM_TO_RULE``, for checks that validate()
reaches elsewhere, e.g. TransformerConfig's); else upstream's message whole, with the section and function
it came from and the config key it names, if any."""

from __future__ import annotations

import contextlib
import copy
import io
import linecache
import os
import re
import warnings
from dataclasses import dataclass
from typing import Any, Iterator, Mapping

from mbridge_offload.facts.config_tree import KeyPathError, get_path, show, walk
from mbridge_offload.facts.key_ranges import show_typed
from mbridge_offload.validation.problem import Problem
from mbridge_offload.validation.registry import RULES_BY_ID
from mbridge_offload.validation.rule import Context, Rule
from mbridge_offload.validation.upstream_rules import UNREACHABLE, site_target

# Upstream messages raised outside megatron.bridge.training.config (TransformerConfig.__post_init__, reached
# through model.finalize()) -> the rule that states the same constraint (its fix is used). The checks of
# that module itself are mapped by their site: upstream_rules.SITES.
_UPSTREAM_TO_RULE: tuple[tuple[str, str], ...] = (
    (r"CPU offloading can be done only for layers less than", "activation-offload/num-layers-range"),
    (r"no support for Pipeline parallelism with CPU offloading", "activation-offload/pipeline-parallel"),
    (r"CPU offloading does not work when activation recomputation", "activation-offload/recompute"),
    (r"CUDA graphs not supported with CPU offloading", "activation-offload/cuda-graphs"),
    (r"Only one of self\.fp16: .* and self\.bf16 .* should be True", "precision/model-bf16-or-fp16"),
    (r"Using recompute_granularity: full so recompute_method must be", "recompute/full-needs-method"),
    (r"When using recompute_granularity: full recompute_num_layers must be between", "recompute/full-needs-num-layers"),
    (r"When using recompute_granularity: selective recompute_num_layers must be None", "recompute/selective-no-num-layers"),
    (r"fine_grained_activation_offloading cannot be enabled with cpu_offloading", "activation-offload/not-with-fine-grained"),
    (r"NVTE_CPU_OFFLOAD_V1", "fine-grained/nvte-cpu-offload-v1"),
    (r"Fine-grained activation offloading is only supported with transformer_engine", "fine-grained/transformer-engine"),
    (r"Invalid choices for offload_modules", "fine-grained/modules-known"),
    (r"attn_proj cannot be set to offload_modules alone", "fine-grained/attn-proj-needs-core-attn"),
    (r"fused_group_mlp", "fine-grained/fused-group-mlp"),
    (r"activation_offload_fraction must be in range", "fine-grained/fraction-range"),
    (r"min_offloaded_tensor_size must be non-negative", "fine-grained/min-tensor-size"),
    (r"num_attention_heads .*must be a multiple of tensor_model_parallel_size|"
     r"num_query_groups .*must be a multiple of tensor_model_parallel_size", "parallel/heads-per-tp"),
    (r"num_moe_experts .* must be a multiple of expert_model_parallel_size", "parallel/experts-per-ep"),
    (r"Sequence length must be divisible by 2 \* context parallel size", "parallel/seq-length-cp"),
    (r"bias is not supported in the shared experts", "moe/shared-expert-bias"),  # SharedExpertMLP, at model build
)

# Upstream messages with no rule of ours: the key they are about and the fix.
_UPSTREAM_KEYS: tuple[tuple[str, str, str], ...] = (
    (r"main_grads_dtype|main_params_dtype|exp_avg_dtype|exp_avg_sq_dtype", "optimizer.use_precision_aware_optimizer",
     "optimizer.use_precision_aware_optimizer=True  (or set the optimizer dtypes back to float32)"),
    (r"use-precision-aware-optimizer", "optimizer.use_precision_aware_optimizer",
     "optimizer.use_precision_aware_optimizer=False"),
)


@dataclass(frozen=True)
class UpstreamFailure:
    """What upstream's validation raised, and where."""

    message: str
    site_text: str | None = None  # the normalized text of the site of megatron.bridge.training.config that raised
    where: str = "ConfigContainer.validate"  # "<function chain> / <section>", for a message left untranslated
    section: str = ""


def _config_fields(cfg: Any) -> Iterator[str]:
    """The keys an upstream message may name: config fields three levels deep, the config's own
    ``_``-prefixed state included (upstream checks it too), dict entries not."""
    return (key for key, _, _ in walk(cfg, levels=3, into_dict=lambda key: False, private=True))


def _from_rule(rule: Rule, ctx: Context, first_line: str) -> Problem:
    try:
        value = rule.value(ctx)
    except (KeyPathError, AttributeError, TypeError, ZeroDivisionError, ValueError):
        try:
            value = show_typed(get_path(ctx.cfg, rule.key))
        except (KeyPathError, AttributeError, TypeError):
            value = "(unset)"
    try:
        fix = rule.fix(ctx)
    except (KeyPathError, AttributeError, TypeError, ZeroDivisionError, ValueError):
        fix = ""
    fix = fix or rule.fix_text or f"set {rule.key} so that: {rule.text}"
    return Problem(key=rule.key, value=value, rule=f"{rule.text} (upstream: {first_line})", fix=fix,
                   severity="error", rule_id=rule.id, source="upstream")


def rule_for(failure: UpstreamFailure) -> str | None:
    """The id of the rule stating the constraint upstream refused: by the site that raised, else by words."""
    if failure.site_text is not None:
        target = site_target(failure.site_text)
        if target and not target.startswith(UNREACHABLE) and target in RULES_BY_ID:
            return target
    for pattern, rule_id in _UPSTREAM_TO_RULE:
        if re.search(pattern, failure.message):
            return rule_id
    return None


def translate_upstream(message: str | UpstreamFailure, cfg: Any, ctx: Context) -> Problem:
    """An upstream error as a Problem: the rule it matches, else upstream's words whole, with where they
    came from and the key they name."""
    failure = message if isinstance(message, UpstreamFailure) else UpstreamFailure(message, *_site_of_text(message))
    text = failure.message.strip() or "(no message)"
    first_line = text.splitlines()[0]
    rule_id = rule_for(failure)
    if rule_id is not None:
        return _from_rule(RULES_BY_ID[rule_id], ctx, first_line)
    key, fix = "", ""
    for pattern, upstream_key, upstream_fix in _UPSTREAM_KEYS:
        if re.search(pattern, text):
            key, fix = upstream_key, upstream_fix
            break
    if not key:  # name the longest config field that the message mentions
        mentioned = [k for k in _config_fields(cfg) if re.search(rf"\b{re.escape(k.rsplit('.', 1)[-1])}\b", text)]
        if failure.section and any(k.startswith(failure.section + ".") for k in mentioned):
            mentioned = [k for k in mentioned if k.startswith(failure.section + ".")]
        key = max(mentioned, key=lambda k: len(k.rsplit(".", 1)[-1]), default="")
        fix = (f"change {key} as upstream's message says" if key else
               f"change what upstream's message names (raised in {failure.where})")
    value = ""
    if key:
        try:
            value = show_typed(get_path(cfg, key))
        except KeyPathError:
            value = ""
    return Problem(key=key, value=value, rule=text, fix=fix, severity="error", rule_id="", source="upstream",
                   origin=f"upstream: {failure.where}")


def _site_of_text(message: str) -> tuple[str | None, str, str]:
    """(site text, where, section) of a message known only by its words."""
    from mbridge_offload.validation.upstream_sites import site_for_message

    site = site_for_message(message.strip())
    if site is None:
        return None, "ConfigContainer.validate", ""
    return site.text, _where(site.function, site.section), site.section


def _where(function: str, section: str) -> str:
    chain = function if function.startswith("ConfigContainer.validate") else f"ConfigContainer.validate -> {function}"
    if function == "runtime_config_update" or function == "apply_environment_variables":
        chain = f"runtime_config_update -> {function}" if function != "runtime_config_update" else function
    return f"{chain} / {section}" if section else chain


def _failure_from(error: BaseException) -> UpstreamFailure:
    """Where in upstream's code ``error`` was raised: the site of the config module (when it raised there),
    the chain of functions (``ConfigContainer.validate -> SchedulerConfig.finalize``) and the config section."""
    from mbridge_offload.validation.upstream_sites import function_at, section_of, site_at

    message = str(error) or type(error).__name__
    frames = []  # (qualified name, file, line, in the config module) from the outermost call in
    tb = error.__traceback__
    while tb is not None:
        code = tb.tb_frame.f_code
        in_config = function_at(code.co_filename, tb.tb_lineno) is not None
        frames.append((getattr(code, "co_qualname", code.co_name), code.co_filename, tb.tb_lineno, in_config))
        tb = tb.tb_next
    config_frames = [f for f in frames if f[3]]
    if not config_frames:
        return UpstreamFailure(message, None, "ConfigContainer.validate", "")
    chain = [f[0] for f in config_frames]
    if len(chain) > 1 and chain[0] == "runtime_config_update":
        chain = chain[1:]
    name, filename, lineno, _ = config_frames[-1]
    if frames[-1][3]:  # raised by a check of the config module itself
        site = site_at(filename, lineno)
        section = section_of(name)
        where = " -> ".join(chain) + (f" / {section}" if section else "")
        return UpstreamFailure(message, site.text if site else None, where, section)
    # raised further down (a section's own __post_init__, e.g. TransformerConfig's via model.finalize())
    line = linecache.getline(filename, lineno)
    call = re.search(r"(?:self|cfg|config)\.(\w+)\.\w+\(", line)
    section = call.group(1) if call else section_of(name)
    where = " -> ".join([*chain, frames[-1][0]]) + (f" / {section}" if section else "")
    return UpstreamFailure(message, None, where, section)


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


@contextlib.contextmanager
def _gpu_architecture_checks_skipped_without_a_gpu() -> Iterator[None]:
    """ConfigContainer.validate checks the flex dispatcher's backend (DeepEP, HybridEP, NCCL EP) against the GPU of
    the machine it runs on (torch.cuda.get_device_properties(0)). Run where the validator runs, a login node or
    laptop without a GPU, that call raises 'Found no NVIDIA driver': the machine's failure, not the config's, and it
    stopped every check after it. Without a GPU the check is skipped here, and env/flex-dispatcher-gpu-unchecked says
    so in the report; the launch on the GPUs makes it."""
    from mbridge_offload.validation.installed import cuda_available

    if cuda_available():
        yield
        return
    import megatron.bridge.training.config as bridge_config

    check = getattr(bridge_config, "validate_flex_dispatcher_backend", None)
    if check is not None:
        bridge_config.validate_flex_dispatcher_backend = lambda model_config: None
    try:
        yield
    finally:
        if check is not None:
            bridge_config.validate_flex_dispatcher_backend = check


# The model sizes whose values out of range make upstream's arithmetic fail (num_attention_heads=0: a division by
# zero in TransformerConfig; num_layers='16': a TypeError): the rules of these keys (facts/key_ranges.py) name the
# cause, with its fix.
_SIZE_KEYS = ("model.num_layers", "model.hidden_size", "model.num_attention_heads", "model.num_query_groups",
              "model.ffn_hidden_size", "model.kv_channels", "model.vocab_size", "model.num_moe_experts",
              "model.moe_ffn_hidden_size", "model.tensor_model_parallel_size", "model.pipeline_model_parallel_size",
              "model.context_parallel_size", "model.expert_model_parallel_size", "train.micro_batch_size",
              "train.global_batch_size", "model.seq_length", "dataset.seq_length")


def upstream_failure(cfg: Any, num_gpus: int, environ: Mapping[str, str]) -> UpstreamFailure | None:
    """Run Megatron Bridge's own pre-launch validation on a copy; what it raised and where, or None."""
    from megatron.bridge.training.config import runtime_config_update

    from mbridge_offload.facts.key_ranges import range_violations

    trial = copy.deepcopy(cfg)
    with _isolated_process_state(num_gpus, environ), _gpu_architecture_checks_skipped_without_a_gpu():
        try:
            runtime_config_update(trial)
        except (ArithmeticError, TypeError) as error:
            # a size of 0 divides, a size given as text or a float fails upstream's arithmetic: the size's own range
            # rule is the problem to report (with its key and fix); other such failures are upstream's own
            return None if range_violations(cfg, _SIZE_KEYS) else _failure_from(error)
        except (AssertionError, ValueError, RuntimeError, LookupError, AttributeError,
                ModuleNotFoundError) as error:
            return _failure_from(error)
    return None


def upstream_error(cfg: Any, num_gpus: int, environ: Mapping[str, str]) -> str | None:
    """Run Megatron Bridge's own pre-launch validation on a copy; its error message, or None."""
    failure = upstream_failure(cfg, num_gpus, environ)
    return None if failure is None else failure.message
