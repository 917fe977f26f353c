"""The checks upstream ``ConfigContainer.validate()`` reaches outside megatron.bridge.training.config, as rules
of the table: above all the model's (Megatron Core ``TransformerConfig.__post_init__``, run by
``model.finalize()``; ``ModelParallelConfig.__post_init__``; the pipeline layout), and Megatron Core's
``OptimizerConfig`` / ``DistributedDataParallelConfig.__post_init__``, Megatron Bridge's CUDA-graph,
mixed-precision and comm-overlap checks. Upstream stops at the first of them; these rules report all at once.

One rule states one constraint; where upstream checks one constraint in several places (every field a feature
needs, its copy in comm_overlap), the rule covers all of them. ``upstream_rules.SITES`` maps each site to its
rule (``upstream_sites.EXTERNAL_ROOTS`` says where the walk goes).

Rules read the config as upstream will check it: the ``mixed_precision`` preset applied to model, optimizer
and DDP (``runtime_config_update`` does that first), unset fields at the defaults ``__post_init__`` gives them
(``recompute_modules`` null: ``[core_attn]``; ``num_query_groups`` null: the heads). A field the installed
Megatron Core does not have reads as unset.
"""

from __future__ import annotations

import re
from importlib import metadata
from typing import Any, Callable, Iterable

import dataclasses

from mbridge_offload.facts.config_tree import show
from mbridge_offload.facts.key_ranges import show_typed
from mbridge_offload.validation.choices import (FP8_FORMAT_WORDS, MOE_BALANCING_WORDS, NORMALIZATION_WORDS,
                                                 OPTIMIZER_WORDS)
from mbridge_offload.validation.guard import guarded
from mbridge_offload.validation.rule import FINE_GRAINED, PARALLELISM, Context, Rule, always
from mbridge_offload.validation.upstream_rules import DISTRIBUTED, MODEL, PRECISION, _mixed_precision, _rule

OPTIMIZER_SECTION = DISTRIBUTED  # optimizer / DDP settings are shown with the distributed ones


# -- reading the config as upstream checks it ------------------------------------------------------------

def _m(c: Context, name: str, default: Any = None) -> Any:
    """``model.<name>``, after the mixed_precision preset (the preset's value wins where it has the field)."""
    mp = _mixed_precision(c)
    if mp is not None and hasattr(mp, name) and hasattr(c.model, name):
        return getattr(mp, name)
    return getattr(c.model, name, default)


def _section(c: Context, section: str, name: str, default: Any = None) -> Any:
    mp = _mixed_precision(c)
    obj = getattr(c.cfg, section)
    if mp is not None and hasattr(mp, name) and hasattr(obj, name):
        return getattr(mp, name)
    return getattr(obj, name, default)


def _name(value: Any) -> str:
    """An enum or string value by its name (``Fp8Recipe.delayed`` -> ``delayed``)."""
    if value is None:
        return ""
    name = getattr(value, "name", None)
    return name if isinstance(name, str) else str(value).rsplit(".", 1)[-1]


def _recompute_modules(c: Context) -> list[str]:
    modules = _m(c, "recompute_modules")
    return ["core_attn"] if modules is None else [str(x) for x in modules]


def _offload_modules(c: Context) -> set[str]:
    return {str(x) for x in (_m(c, "offload_modules") or [])}


def _graph_impl(c: Context) -> str:
    impl = _m(c, "cuda_graph_impl", "none") or "none"
    if _m(c, "enable_cuda_graph"):
        return "local"
    if _m(c, "external_cuda_graph"):
        return "transformer_engine"
    return impl


def _graph_modules(c: Context) -> set[str]:
    """The per-layer CUDA graph modules (cuda_graph_modules, or the deprecated cuda_graph_scope)."""
    from megatron.bridge.utils.cuda_graph import cuda_graph_module_names

    if (_m(c, "cuda_graph_impl", "none") or "none") == "none":
        return set()  # validate_cuda_graph_configuration clears them, on the field as set (before finalize turns
        # the deprecated enable_cuda_graph / external_cuda_graph into an implementation)
    return set(cuda_graph_module_names(c.model))


def _full_graph(c: Context) -> bool:
    """Whole layers captured: a full-iteration graph, or local / TE graphs without a module list."""
    from megatron.bridge.utils.cuda_graph import is_full_iteration_cuda_graph

    return bool(is_full_iteration_cuda_graph(c.model)) or not _graph_modules(c)


def _fp8(c: Context) -> bool:
    return bool(_m(c, "fp8"))


def _fp4(c: Context) -> bool:
    return bool(_m(c, "fp4"))


def _moe(c: Context) -> bool:
    return (_m(c, "num_moe_experts") or 0) > 0


def _layers_per_stage(c: Context) -> int:
    return c.model.num_layers // c.model.pipeline_model_parallel_size


def _activation(c: Context) -> str:
    """model.activation_func by name (a callable, or its name as an override gives it)."""
    fn = _m(c, "activation_func")
    return fn if isinstance(fn, str) else getattr(fn, "__name__", str(fn))


def _version(text: str | None) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", text or "")[:3]) if text else ()


def _te_at_least(c: Context, version: str) -> bool:
    installed = c.installed_te
    return installed is not None and _version(installed) >= _version(version)


def _torch_version(c: Context | None = None) -> str | None:
    """The installed PyTorch's version; a context may name another (``ctx.torch_version``, as ``te_version``)."""
    named = getattr(c, "torch_version", None)
    if named:
        return named
    try:
        return metadata.version("torch")
    except metadata.PackageNotFoundError:
        return None


def _broken(checks: Iterable[tuple[bool, str]]) -> list[str]:
    return [words for ok, words in checks if not ok]


def _group(id: str, mechanism: str, key: str, text: str, applies: Callable[[Context], bool],
           checks: Callable[[Context], list[tuple[bool, str]]], fix: str,
           fixes: Callable[[Context], list[str]] | None = None) -> Rule:
    """A rule over several requirements of one feature: it holds when all do; its value names those broken."""
    return _rule(id, mechanism, key, text, applies, lambda c: not _broken(checks(c)),
                 (lambda c: "  ".join(fixes(c)) or fix) if fixes else fix,
                 observed=lambda c: f"{show_typed(c.get(key))}; broken: " + "; ".join(_broken(checks(c))) if _broken(
                     checks(c)) else show_typed(c.get(key)),
                 fix_text=fix if fixes else "")


# -- features that need a newer Transformer Engine or PyTorch -------------------------------------------------

def _te_needs(c: Context) -> list[tuple[str, str]]:
    """(feature, TE version it needs) for each feature this config turns on that checks the TE version."""
    m, needs = c.model, []
    if _m(c, "moe_single_grouped_weight") or _m(c, "moe_single_grouped_bias"):
        needs.append(("moe_single_grouped_weight/bias", "2.14.0"))
    if _fp8(c) and _m(c, "recompute_granularity") == "selective" and (
            {"moe_act", "layernorm"} & set(_recompute_modules(c))):
        needs.append(("fp8 with moe_act/layernorm recompute", "2.6.0"))
    if _m(c, "apply_rope_fusion") and not _m(c, "multi_latent_attention"):
        needs.append(("apply_rope_fusion", "2.3.0" if _m(c, "rotary_interleaved") else "1.4.0"))
    if _moe(c) and _fp8(c):
        needs.append(("MoE fp8", "1.11.0" if _m(c, "moe_grouped_gemm") else "1.7.0"))
    if _m(c, "moe_permute_fusion"):
        needs.append(("moe_permute_fusion", "2.1.0"))
    if _m(c, "delay_wgrad_compute") and _graph_impl(c) == "transformer_engine":
        needs.append(("delay_wgrad_compute with transformer_engine CUDA graphs", "2.10.0"))
    if _m(c, "overlap_dispatch_backward_with_experts_wgrad"):
        needs.append(("overlap_dispatch_backward_with_experts_wgrad", "2.3.0"))
    if _m(c, "symmetric_ar_type") is not None:
        needs.append(("symmetric_ar_type", "2.3.0"))
    if _fp4(c):
        needs.append(("fp4", "2.7.0"))
    co = c.cfg.comm_overlap
    if co is not None and getattr(co, "delay_wgrad_compute", None) is True:
        if c.cfg.ddp.overlap_grad_reduce or getattr(co, "overlap_grad_reduce", None) or m.gradient_accumulation_fusion:
            needs.append(("comm_overlap.delay_wgrad_compute with overlap_grad_reduce / gradient_accumulation_fusion",
                          "2.7.0"))
        if _wgrad_in_graph(c):
            needs.append(("comm_overlap.delay_wgrad_compute with attn / moe_router CUDA graphs", "2.12.0"))
    return needs


def _wgrad_in_graph(c: Context) -> bool:
    modules = _graph_modules(c)
    return "attn" in modules or ("moe_router" in modules and _m(c, "moe_shared_expert_intermediate_size") is not None
                                 and not _m(c, "moe_shared_expert_overlap"))


def _torch_needs(c: Context) -> list[tuple[str, str]]:
    needs = []
    if _ep_overlap(c):
        needs.append(("overlap_moe_expert_parallel_comm", "2.6.0"))
    if _m(c, "symmetric_ar_type") is not None:
        needs.append(("symmetric_ar_type", "2.7.0"))
    return needs


# -- MoE expert-parallel communication overlap --------------------------------------------------------------

def _ep_overlap(c: Context) -> bool:
    co = c.cfg.comm_overlap
    return bool(_m(c, "overlap_moe_expert_parallel_comm")
                or (co is not None and getattr(co, "overlap_moe_expert_parallel_comm", None) is True))


def _ep_overlap_checks(c: Context) -> list[tuple[bool, str]]:
    m = c.model
    modules = _graph_modules(c)
    ncclep = _m(c, "moe_token_dispatcher_type") == "flex" and _m(c, "moe_flex_dispatcher_backend") == "ncclep"
    return [
        (m.expert_model_parallel_size > 1, "model.expert_model_parallel_size > 1"),
        ((_m(c, "num_moe_experts") or 0) > 1, "model.num_moe_experts > 1"),
        (_m(c, "moe_token_dispatcher_type") in ("alltoall", "flex"), "moe_token_dispatcher_type alltoall or flex"),
        (bool(_m(c, "bf16") or _m(c, "fp16")), "a bf16 or fp16 model"),
        (m.pipeline_model_parallel_size == 1 or m.virtual_pipeline_model_parallel_size is not None,
         "virtual_pipeline_model_parallel_size set when pipeline_model_parallel_size > 1"),
        (_m(c, "recompute_granularity") != "full", "no full recompute"),
        (_m(c, "recompute_method") is None, "recompute_method null"),
        (_m(c, "recompute_num_layers") is None, "recompute_num_layers null"),
        ("moe" not in _recompute_modules(c), "no moe in recompute_modules"),
        (not _m(c, "moe_shared_expert_overlap"), "moe_shared_expert_overlap False"),
        (_m(c, "mtp_num_layers") in (None, 0, 1), "mtp_num_layers at most 1"),
        (not (ncclep and _m(c, "fine_grained_activation_offloading") and "expert_fc1" in _offload_modules(c)),
         "with the ncclep backend, no expert_fc1 in offload_modules"),
        (not (_graph_impl(c) == "transformer_engine" and {"moe", "mlp"} & modules),
         "no moe / mlp CUDA graph modules with cuda_graph_impl=transformer_engine"),
    ]


def _ep_overlap_fixes(c: Context) -> list[str]:
    m, out = c.model, []
    if m.expert_model_parallel_size <= 1 or (_m(c, "num_moe_experts") or 0) <= 1:
        return ["model.overlap_moe_expert_parallel_comm=False  (it overlaps expert-parallel communication: "
                "it needs model.expert_model_parallel_size > 1)"]
    if m.pipeline_model_parallel_size > 1 and m.virtual_pipeline_model_parallel_size is None:
        out.append("model.virtual_pipeline_model_parallel_size=2")
    if _m(c, "recompute_granularity") == "full":
        out.append("model.recompute_granularity=null model.recompute_method=null model.recompute_num_layers=null")
    if _m(c, "moe_token_dispatcher_type") not in ("alltoall", "flex"):
        out.append("model.moe_token_dispatcher_type=alltoall")
    if _m(c, "moe_shared_expert_overlap"):
        out.append("model.moe_shared_expert_overlap=False")
    if "moe" in _recompute_modules(c):
        out.append("model.recompute_modules=[" + ",".join(x for x in _recompute_modules(c) if x != "moe") + "]")
    return out


# -- pipeline stages ------------------------------------------------------------------------------------

def _uneven_split_checks(c: Context) -> list[tuple[bool, str]]:
    """TransformerConfig's checks of num_layers_in_first/last_pipeline_stage."""
    m = c.model
    first, last, vpp = m.num_layers_in_first_pipeline_stage, m.num_layers_in_last_pipeline_stage, \
        m.virtual_pipeline_model_parallel_size
    layers, stages, out = m.num_layers, m.pipeline_model_parallel_size, []
    for name, n in (("first", first), ("last", last)):
        if n is None:
            continue
        out.append((n > 0, f"num_layers_in_{name}_pipeline_stage > 0"))
        if vpp is not None:
            out.append((n % vpp == 0, f"num_layers_in_{name}_pipeline_stage ({n}) divisible by the virtual "
                                      f"pipeline size ({vpp})"))
        layers, stages = layers - n, stages - 1
    out.append((bool(layers) == bool(stages), f"{layers} middle layers for {stages} middle stages"))
    if stages:
        out.append((layers % stages == 0, f"middle layers ({layers}) divisible by the middle stages ({stages})"))
        if vpp is not None and stages > 0:
            out.append(((layers // stages) % vpp == 0,
                        f"layers per middle stage ({layers // stages}) divisible by the virtual pipeline size "
                        f"({vpp})"))
    return out


def _embedding_loss_layers(c: Context) -> int:
    m = c.model
    return m.num_layers + bool(m.account_for_embedding_in_pipeline_split) + bool(m.account_for_loss_in_pipeline_split)


def _layout_error(c: Context) -> str:
    """What PipelineParallelLayerLayout says of model.pipeline_model_parallel_layout ('' when it is valid)."""
    from megatron.core.transformer.pipeline_parallel_layer_layout import PipelineParallelLayerLayout

    m, layout = c.model, c.model.pipeline_model_parallel_layout
    try:
        if isinstance(layout, str):
            parsed = PipelineParallelLayerLayout.from_str(layout=layout,
                                                          pipeline_model_parallel_size=m.pipeline_model_parallel_size)
        elif isinstance(layout, PipelineParallelLayerLayout):
            parsed = layout
        else:
            parsed = PipelineParallelLayerLayout(layout=layout, pipeline_model_parallel_size=m.pipeline_model_parallel_size)
        vpp = m.virtual_pipeline_model_parallel_size
        if vpp is not None and vpp != parsed.virtual_pipeline_model_parallel_size:
            return (f"the layout has {parsed.virtual_pipeline_model_parallel_size} virtual stages, "
                    f"virtual_pipeline_model_parallel_size is {vpp}")
        parsed.validate_layer_layout(num_layers=m.num_layers, mtp_num_layers=m.mtp_num_layers)
    except (AssertionError, ValueError, TypeError, KeyError, NotImplementedError, AttributeError) as error:
        return str(error) or type(error).__name__
    return ""


# -- CUDA graphs ------------------------------------------------------------------------------------------

_GRAPH_MODULE_NAMES = ("attn", "mlp", "moe", "moe_router", "moe_preprocess", "mamba")


def _graph_module_values(c: Context) -> list[Any]:
    value = _m(c, "cuda_graph_modules")
    scope = _m(c, "cuda_graph_scope")
    return [*(value if isinstance(value, list) else [] if value is None else [value]),
            *(scope if isinstance(scope, list) else [] if scope is None else [scope])]


def _graph_modules_error(c: Context) -> str:
    """What Megatron Core's normalization says of model.cuda_graph_modules / inference_cuda_graph_scope."""
    from megatron.core.transformer.cuda_graph_config import (normalize_cuda_graph_modules,
                                                             normalize_inference_cuda_graph_scope,
                                                             validate_deprecated_cuda_graph_modules_migration_inputs)

    impl = _graph_impl(c)
    try:
        modules = _m(c, "cuda_graph_modules")
        scope = _m(c, "cuda_graph_scope")
        if scope is not None:
            modules = [getattr(s, "name", s) for s in scope] if isinstance(scope, list) else getattr(scope, "name", scope)
        _, deprecated, _ = normalize_cuda_graph_modules(modules)
        validate_deprecated_cuda_graph_modules_migration_inputs(deprecated, impl, _m(c, "inference_cuda_graph_scope"))
        normalize_inference_cuda_graph_scope(_m(c, "inference_cuda_graph_scope"), impl)
    except (AssertionError, ValueError, TypeError, KeyError) as error:
        return str(error) or type(error).__name__
    return ""


def _inference_scope_ok(c: Context) -> bool:
    from megatron.core.transformer.cuda_graph_config import (ALLOWED_INFERENCE_SCOPES,
                                                             normalize_inference_cuda_graph_scope)

    impl = _graph_impl(c)
    if impl not in ALLOWED_INFERENCE_SCOPES:
        return True  # rule model/cuda-graph-impl-known
    try:
        scope = normalize_inference_cuda_graph_scope(_m(c, "inference_cuda_graph_scope"), impl)
    except (AssertionError, ValueError, TypeError, KeyError):
        return True  # rule model/cuda-graph-modules-valid
    return scope in ALLOWED_INFERENCE_SCOPES[impl]


def _moe_graph_checks(c: Context) -> list[tuple[bool, str]]:
    modules, impl = _graph_modules(c), _graph_impl(c)
    if impl == "local" and {"moe_router", "moe_preprocess"} & modules:
        modules = modules | {"moe_router", "moe_preprocess"}  # local graphs add each other
    out = [(not {"moe", "moe_router"} <= modules, "not both moe and moe_router"),
           ("moe_preprocess" not in modules or "moe_router" in modules, "moe_preprocess only with moe_router")]
    experts = _m(c, "num_moe_experts") or 0
    if experts <= 1:
        out.append((not {"moe", "moe_router"} & modules, "moe / moe_router only for an MoE model"))
    else:
        freq = _m(c, "moe_layer_freq", 1)
        if freq == 1 or (isinstance(freq, list) and 0 not in freq):
            out.append(("mlp" not in modules, "mlp only for a model with dense layers"))
        if _m(c, "moe_expert_capacity_factor") is None or not _m(c, "moe_pad_expert_input_to_capacity"):
            out.append(("moe" not in modules, "moe only with drop-and-pad MoE (moe_expert_capacity_factor and "
                                              "moe_pad_expert_input_to_capacity)"))
            if _m(c, "moe_token_dispatcher_type") == "alltoall" and (
                    _m(c, "moe_expert_capacity_factor") is not None or _m(c, "moe_router_padding_for_fp8")):
                out.append(("moe_preprocess" not in modules, "no moe_preprocess with token dropping or fp8 padding "
                                                             "(host syncs in the preprocess step)"))
    return out


def _graph_recompute_checks(c: Context) -> list[tuple[bool, str]]:
    impl, modules, rm = _graph_impl(c), _graph_modules(c), set(_recompute_modules(c))
    if _m(c, "recompute_granularity") != "selective":
        return [(impl == "full_iteration", "full recompute only with a full-iteration CUDA graph")]
    full = impl == "full_iteration" or not modules
    out = []
    if impl == "transformer_engine" and "moe" in rm:
        out.append(("moe_router" not in modules, "no moe recompute with a transformer_engine moe_router graph"))
    if _m(c, "attention_dropout", 0.0) != 0.0:
        out.append((((not full and "attn" not in modules) or "core_attn" not in rm),
                    "no core_attn recompute of a graphed attention with attention_dropout"))
    if _m(c, "hidden_dropout", 0.0) != 0.0:
        out.append(((((not full and "mlp" not in modules) or "mlp" not in rm)
                     and ((not full and "moe" not in modules) or "moe" not in rm)),
                    "no mlp / moe recompute of a graphed MLP / MoE with hidden_dropout"))
    if _m(c, "moe_input_jitter_eps") is not None:
        out.append((((not full and "moe" not in modules) or "moe" not in rm),
                    "no moe recompute of a graphed MoE with moe_input_jitter_eps"))
    if ((_m(c, "gtp_weight_remat_size", 1) or 1) > 1 and impl == "local" and (_fp8(c) or _fp4(c))
            and _m(c, "moe_shared_expert_intermediate_size") is not None and not _m(c, "moe_shared_expert_overlap")
            and (full or {"moe", "moe_router"} & modules)):
        out.append(("shared_experts" not in rm, "no shared_experts recompute with GTP, fp8/fp4 and local graphs "
                                                "capturing the shared experts"))
    return out


def _graph_offload_checks(c: Context) -> list[tuple[bool, str]]:
    impl, modules = _graph_impl(c), _graph_modules(c)
    out = [("moe" not in modules, "no moe CUDA graph module (token-drop MoE)"),
           ((_m(c, "cuda_graph_warmup_steps", 1) or 0) > 0, "cuda_graph_warmup_steps > 0")]
    if impl == "local":
        out.append((bool(modules), "local graphs capture modules, not whole layers"))
    if impl == "full_iteration":
        n = _m(c, "fine_grained_offloading_max_inflight_offloads")
        out.append((n is not None and n >= 0, "fine_grained_offloading_max_inflight_offloads >= 0"))
    return out


# -- the rules -------------------------------------------------------------------------------------------

# -- what a mixed_precision preset replaces on the model ------------------------------------------------------

_NO_DEFAULT = object()


def _declared_default(c: Context, name: str) -> Any:
    """The model class's declared default of ``name`` (what an untouched model holds), or _NO_DEFAULT."""
    for f in dataclasses.fields(type(c.model)) if dataclasses.is_dataclass(c.model) else ():
        if f.name == name:
            if f.default is not dataclasses.MISSING:
                return f.default
            return f.default_factory() if f.default_factory is not dataclasses.MISSING else _NO_DEFAULT
    return _NO_DEFAULT


def _set_on_model(c: Context, name: str) -> bool:
    """``model.<name>`` is the model's own: the command line gave it (``Context.given_keys``: whatever its value, its
    class's default and null included), or it holds a value other than that default (a recipe, a config composed in
    Python or an override set it). Without the command line's keys, a value set equal to the default reads as
    unset: the final config cannot tell it from untouched."""
    if c.given(f"model.{name}"):
        return True
    value, default = getattr(c.model, name, None), _declared_default(c, name)
    return value is not None and (default is _NO_DEFAULT or _name(value) != _name(default))


def _held_or_given(c: Context, name: str) -> bool:
    """``model.<name>`` holds a value, or the command line gave it (null included: ``model.fp8=null`` asks FP8 off)."""
    return getattr(c.model, name, None) is not None or c.given(f"model.{name}")


def _family(c: Context) -> str:
    """The preset's family, its 16-bit half: fp16 or bf16."""
    return "fp16" if getattr(_mixed_precision(c), "fp16", False) else "bf16"


def _off_fix(c: Context, name: str, what: str) -> str:
    """The fix of model.<name>=null (``what`` off) given where the preset turns it on: the family's plain preset."""
    return (f"mixed_precision={_family(c)}_mixed  (the preset without {what}, as model.{name}=null asks; or drop "
            f"model.{name}=null to train {what} as mixed_precision={show(c.cfg.mixed_precision)} does)")


def _preset_value(c: Context, name: str) -> Any:
    """What the preset writes over ``model.<name>`` at setup (finalize() first: fp8_param null -> fp8_param_gather)."""
    mp = _mixed_precision(c)
    value = getattr(mp, name, None)
    if name == "fp8_param" and value is None:
        value = getattr(mp, "fp8_param_gather", False)
    return value


def _preset_fp8(c: Context) -> bool:
    return _mixed_precision(c) is not None and bool(getattr(_mixed_precision(c), "fp8", None))


def _preset_fp8_or_fp4(c: Context) -> bool:
    return _mixed_precision(c) is not None and bool(getattr(_mixed_precision(c), "fp8", None)
                                                    or getattr(_mixed_precision(c), "fp4", None))


def _preset_delayed(c: Context) -> bool:
    return _preset_fp8(c) and _name(getattr(_mixed_precision(c), "fp8_recipe", None)) == "delayed"


def _model_fp8_kept(c: Context) -> bool:
    """No model.fp8 of the model's own that the preset replaces (a format, or null given): where there is one,
    precision/preset-replaces-fp8 is the one problem (its fix names a preset with the model's FP8 recipe too, or the
    preset without FP8)."""
    fp8 = getattr(c.model, "fp8", None)
    return (not _held_or_given(c, "fp8") or not FP8_FORMAT_WORDS.admits(fp8)
            or fp8 == getattr(_mixed_precision(c), "fp8", None))


def _fp8_preset_for(c: Context) -> str | None:
    """A registered mixed_precision preset that trains FP8 in the model's own format and recipe (where set on the
    model), in the family (bf16 / fp16) of the preset given; None where none does."""
    from megatron.bridge.training.mixed_precision import MIXED_PRECISION_RECIPES

    if not _set_on_model(c, "fp8_recipe") or c.model.fp8_recipe is None:
        return None  # a format alone: the fix names the current-scaling preset (mxfp8, the one e4m3, is Blackwell's)
    want = {"fp8": getattr(c.model, "fp8", None) or None, "fp8_recipe": _name(c.model.fp8_recipe)}
    family = _family(c)
    for name, make in MIXED_PRECISION_RECIPES.items():
        if not name.startswith(family + "_with_"):  # the generic presets, no model's own (nemotron_h_, nanov2_)
            continue
        preset = make()
        if preset.fp8 and all(v is None or _name(getattr(preset, k)) == v for k, v in want.items()):
            return name
    return None


def _preset_fp8_fix(c: Context) -> str:
    """precision/preset-replaces-fp8's fix: the preset with the model's FP8 format (and recipe, where set); for
    model.fp8=null given, the preset without FP8."""
    if getattr(c.model, "fp8", None) is None:
        return _off_fix(c, "fp8", "FP8")
    name = _fp8_preset_for(c)
    if name is None:
        return ("mixed_precision=bf16_with_fp8_current_scaling_mixed  (a preset whose fp8 is the format you want, or "
                "mixed_precision.fp8=<format> where mixed_precision is a config)")
    return (f"mixed_precision={name}  (the preset with fp8={getattr(c.model, 'fp8')}"
            + (f" and fp8_recipe={_name(c.model.fp8_recipe)}" if _set_on_model(c, "fp8_recipe") else "")
            + "; or mixed_precision.fp8=<format> where mixed_precision is a config)")


def _preset_fp8_recipe_fix(c: Context) -> str:
    name, preset = _fp8_preset_for(c), _name(_preset_value(c, "fp8_recipe"))
    if c.model.fp8_recipe is None:  # null given: no recipe asked for but the preset's
        return (f"model.fp8_recipe={preset}  (what mixed_precision={show(c.cfg.mixed_precision)} writes; or drop "
                "model.fp8_recipe=null)")
    if name is not None:
        return (f"mixed_precision={name}  (the preset with fp8_recipe={_name(c.model.fp8_recipe)}; or "
                f"model.fp8_recipe={preset} to train with the preset's)")
    return (f"model.fp8_recipe={preset}  (what mixed_precision={show(c.cfg.mixed_precision)} writes; no preset has "
            f"fp8_recipe={_name(c.model.fp8_recipe)}"
            + (f" with fp8={c.model.fp8}" if getattr(c.model, "fp8", None) else "")
            + ": that needs mixed_precision as a config with it)")


_FP4_FIX = ("mixed_precision=bf16_with_nvfp4_mixed  (the preset with FP4: fp4=e2m1, fp4_recipe=nvfp4, FP4 parameters; "
            "or mixed_precision.fp4=e2m1 where mixed_precision is a config)")
_FP4_RECIPE_FIX = ("model.fp4_recipe=nvfp4  (what every mixed_precision preset writes; another FP4 recipe needs "
                   "mixed_precision as a config with that fp4_recipe)")


def _preset_value_fix(name: str) -> Callable[[Context], str]:
    return lambda c: (f"model.{name}={show(_preset_value(c, name))}  (what mixed_precision="
                      f"{show(c.cfg.mixed_precision)} writes; model.{name}={show(getattr(c.model, name))} needs "
                      f"mixed_precision as a config with {name}={show(getattr(c.model, name))})")


# The FP8 settings every preset writes over the model's besides fp8 / fp8_recipe (MixedPrecisionConfig's fields that
# TransformerConfig has too), each where Megatron Core reads it: (name, when the preset's run reads it, effect).
# fp8_margin / fp8_amax_* / fp8_wgrad / fp8_multi_head_attention only with delayed scaling (fp8_utils.py
# get_fp8_recipe: TEDelayedScaling alone takes them); first_last_layers_bf16 and its layer counts with FP8 or FP4
# (fp8_utils.py / fp4_utils.py), the counts only where the preset keeps first and last layers in BF16. A setting is
# the model's own (_set_on_model) where the command line gave it, even at Megatron Core's default, or where it holds
# another value.
PRESET_FP8_SETTINGS: tuple[tuple[str, Callable[[Context], bool], str], ...] = (
    ("fp8_param", _preset_fp8, "the parameters would be kept in the preset's precision, not the one asked for "
                               "(and the memory plan would not be the run's)"),
    ("fp8_dot_product_attention", _preset_fp8, "attention would not run as asked"),
    ("fp8_multi_head_attention", _preset_delayed, "attention would not run as asked"),
    ("fp8_amax_history_len", _preset_delayed, "delayed scaling would not use the amax history asked for"),
    ("fp8_amax_compute_algo", _preset_delayed, "delayed scaling would not use the amax algorithm asked for"),
    ("fp8_margin", _preset_delayed, "delayed scaling would not use the margin asked for"),
    ("fp8_wgrad", _preset_delayed, "the weight gradients would not be computed in the precision asked for"),
    ("first_last_layers_bf16", _preset_fp8_or_fp4, "the first and last layers would not be kept in BF16 as asked"),
    *((f"num_layers_at_{end}_in_bf16",
       lambda c: _preset_fp8_or_fp4(c) and bool(getattr(_mixed_precision(c), "first_last_layers_bf16", False)),
       f"the number of {'first' if end == 'start' else 'last'} layers kept in BF16 would not be the one asked for")
      for end in ("start", "end")),
)


# model.<name> keys with a preset rule of their own above (precision/preset-replaces-<name>)
_PRESET_MODEL_RULES = ("fp8", "fp4", "fp4_recipe", "fp8_recipe", *(name for name, _, _ in PRESET_FP8_SETTINGS))
PRESET_SECTIONS = ("model", "optimizer", "ddp")  # what MixedPrecisionConfig.setup writes its fields over


def _given_replaced_by_preset(c: Context) -> list[tuple[str, Any, Any]]:
    """(key, value given, value the preset writes) for each key the command line gave in the model, optimizer or
    DDP config that the mixed_precision preset writes over with another value at setup (update_config_with_
    precision_overrides: every field of the preset the section has, with only a debug log), besides the model keys
    that have a rule of their own."""
    mp = _mixed_precision(c)
    if mp is None or not dataclasses.is_dataclass(mp):
        return []
    preset_fields = {f.name for f in dataclasses.fields(mp)}
    out = []
    for key in sorted(c.given_keys):
        section, _, name = key.partition(".")
        if section not in PRESET_SECTIONS or name not in preset_fields or (section == "model"
                                                                           and name in _PRESET_MODEL_RULES):
            continue
        obj = getattr(c.cfg, section, None)
        if obj is None or not hasattr(obj, name):
            continue
        given, written = getattr(obj, name), _preset_value(c, name)
        if given != written:
            out.append((key, given, written))
    return out


def _given_replaced_fix(c: Context) -> str:
    replaced = _given_replaced_by_preset(c)
    keys = " ".join(f"{key}={show(given)}" for key, given, _ in replaced)
    return (f"drop {keys}  (the preset's value then trains, as it would anyway), or mixed_precision=null to train "
            f"the precision settings of the model, optimizer and ddp as they are (each then set by you)")


def _flag(c: Context, name: str) -> bool:
    return bool(_m(c, name))


RULES: tuple[Rule, ...] = guarded(
    # installed versions
    _rule("model/transformer-engine-version", MODEL, "model.transformer_impl",
          "features that need a newer Transformer Engine (moe_single_grouped_weight 2.14, fp8 moe_act/layernorm "
          "recompute 2.6, apply_rope_fusion 1.4 (2.3 with rotary_interleaved), MoE fp8 1.7 (grouped GEMM 1.11), "
          "moe_permute_fusion 2.1, fp4 2.7, delayed wgrad "
          "2.7 / 2.10 / 2.12, symmetric all-reduce 2.3) need it installed",
          lambda c: bool(_te_needs(c)),
          lambda c: all(_te_at_least(c, v) for _, v in _te_needs(c)),
          lambda c: ("uv add 'transformer-engine>=" + max((v for f, v in _te_needs(c) if not _te_at_least(c, v)),
                                                           key=_version) + "'  (or turn off: " +
                     ", ".join(f for f, v in _te_needs(c) if not _te_at_least(c, v)) + ")"),
          observed=lambda c: (f"Transformer Engine {c.installed_te or 'not installed'}; needed: "
                              + ", ".join(f"{f} >= {v}" for f, v in _te_needs(c) if not _te_at_least(c, v))),
          fix_text="install a Transformer Engine new enough, or turn the feature off"),
    _rule("model/torch-version", MODEL, "model.overlap_moe_expert_parallel_comm",
          "overlap_moe_expert_parallel_comm needs PyTorch >= 2.6 (it hangs before); symmetric_ar_type needs >= 2.7",
          lambda c: bool(_torch_needs(c)),
          lambda c: all(_version(_torch_version(c)) >= _version(v) for _, v in _torch_needs(c)),
          "model.overlap_moe_expert_parallel_comm=False model.symmetric_ar_type=null  (or a newer torch)",
          observed=lambda c: f"torch {_torch_version(c)}; needed: " + ", ".join(f"{f} >= {v}" for f, v in _torch_needs(c))),
    # attention variants
    _group("model/gated-delta-net", MODEL, "model.experimental_attention_variant",
           "experimental_attention_variant=gated_delta_net needs linear_attention_freq, linear_conv_kernel_dim, "
           "linear_key_head_dim, linear_value_head_dim, linear_num_key_heads and linear_num_value_heads set, value "
           "heads a multiple of key heads, and both a multiple of TP x CP",
           lambda c: _m(c, "experimental_attention_variant") == "gated_delta_net",
           lambda c: [*((_m(c, n) is not None, f"model.{n} set") for n in (
               "linear_attention_freq", "linear_conv_kernel_dim", "linear_key_head_dim", "linear_value_head_dim",
               "linear_num_key_heads", "linear_num_value_heads")),
               *(((_m(c, "linear_num_value_heads") % _m(c, "linear_num_key_heads") == 0,
                   "linear_num_value_heads a multiple of linear_num_key_heads"),
                  (_m(c, "linear_num_key_heads") % (c.model.tensor_model_parallel_size * c.model.context_parallel_size)
                   == 0, "linear_num_key_heads a multiple of TP x CP"),
                  (_m(c, "linear_num_value_heads") % (c.model.tensor_model_parallel_size
                                                       * c.model.context_parallel_size) == 0,
                   "linear_num_value_heads a multiple of TP x CP"))
                 if _m(c, "linear_num_key_heads") and _m(c, "linear_num_value_heads") else ())],
           "model.experimental_attention_variant=null  (or set every model.linear_* field)"),
    _group("model/dsa", MODEL, "model.experimental_attention_variant",
           "experimental_attention_variant=dsa needs add_bias_linear=False, dsa_indexer_topk_freq >= 1, "
           "dsa_indexer_skip_topk_offset >= 0, dsa_kernel_backend none / tilelang / cudnn (the fused ones with "
           "their packages and a CUDA device), no apply_rope_fusion, and cp_comm_type allgather with CP > 1",
           lambda c: _m(c, "experimental_attention_variant") == "dsa",
           lambda c: [(not _m(c, "add_bias_linear"), "add_bias_linear False"),
                      ((_m(c, "dsa_indexer_topk_freq", 1) or 0) >= 1, "dsa_indexer_topk_freq >= 1"),
                      ((_m(c, "dsa_indexer_skip_topk_offset", 0) or 0) >= 0, "dsa_indexer_skip_topk_offset >= 0"),
                      (_m(c, "dsa_kernel_backend", "none") in ("none", "tilelang", "cudnn"),
                       "dsa_kernel_backend none, tilelang or cudnn"),
                      (_m(c, "dsa_kernel_backend", "none") in (None, "none") or _dsa_kernels_available(c),
                       "the fused DSA kernels' packages and a CUDA device"),
                      (not _m(c, "apply_rope_fusion"), "apply_rope_fusion False"),
                      (c.model.context_parallel_size == 1 or all(
                          t is not None and str(t).replace("_", "").lower() == "allgather"
                          for t in (_m(c, "cp_comm_type") if isinstance(_m(c, "cp_comm_type"), list)
                                    else [_m(c, "cp_comm_type")])), "cp_comm_type allgather with CP > 1")],
           "model.add_bias_linear=False model.apply_rope_fusion=False model.dsa_kernel_backend=none"),
    _rule("model/multi-latent-attention-rope", MODEL, "model.rotary_interleaved",
          "multi_latent_attention does not work with rotary_interleaved",
          lambda c: _flag(c, "multi_latent_attention"), lambda c: not _m(c, "rotary_interleaved"),
          "model.rotary_interleaved=False"),
    _rule("model/fused-qkv-rope-gate", MODEL, "model.fused_single_qkv_rope",
          "fused_single_qkv_rope does not support gated attention (attention_output_gate)",
          lambda c: _flag(c, "fused_single_qkv_rope"), lambda c: not _m(c, "attention_output_gate"),
          "model.fused_single_qkv_rope=False"),
    _rule("model/rope-fusion-available", MODEL, "model.apply_rope_fusion",
          "apply_rope_fusion needs Transformer Engine's fused RoPE kernels", lambda c: _flag(c, "apply_rope_fusion")
          and not _m(c, "multi_latent_attention"), lambda c: c.installed_te is not None,
          "model.apply_rope_fusion=False  (or install transformer-engine)"),
    _rule("model/no-rope-freq", MODEL, "model.no_rope_freq",
          "no_rope_freq: an int must divide model.num_layers, a list needs one entry per layer; no flash_decode",
          lambda c: bool(_m(c, "no_rope_freq")),
          lambda c: not _m(c, "flash_decode") and (
              c.model.num_layers % _m(c, "no_rope_freq") == 0 if isinstance(_m(c, "no_rope_freq"), int)
              else len(_m(c, "no_rope_freq")) == c.model.num_layers),
          "model.no_rope_freq=null  (or a divisor of model.num_layers)",
          observed=lambda c: f"{show_typed(_m(c, 'no_rope_freq'))} (num_layers={c.model.num_layers}, "
                             f"flash_decode={_m(c, 'flash_decode')})"),
    _rule("model/flash-attention-version", MODEL, "model.flash_attention_version",
          "model.flash_attention_version must be 2, 3 or 4 (or null)",
          lambda c: _m(c, "flash_attention_version") is not None,
          lambda c: _m(c, "flash_attention_version") in (2, 3, 4), "model.flash_attention_version=null"),
    _group("model/batch-invariant-mode", MODEL, "model.batch_invariant_mode",
           "batch_invariant_mode needs attention_backend=flash, flash_attention_version 3 or 4, no context "
           "parallelism and attention_dropout=0",
           lambda c: _flag(c, "batch_invariant_mode"),
           lambda c: [(_name(_m(c, "attention_backend")) == "flash", "attention_backend flash"),
                      (_m(c, "flash_attention_version") in (3, 4), "flash_attention_version 3 or 4"),
                      (c.model.context_parallel_size == 1, "context_parallel_size 1"),
                      (_m(c, "attention_dropout", 0.0) == 0.0, "attention_dropout 0")],
           "model.batch_invariant_mode=False  (or model.attention_backend=flash model.flash_attention_version=3 "
           "model.context_parallel_size=1 model.attention_dropout=0.0)"),
    _group("model/inference-optimized", MODEL, "model.transformer_impl",
           "transformer_impl=inference_optimized needs RMSNorm, no zero-centered gamma, no linear / QKV bias, no "
           "kitchen; with MoE: no expert TP, dropless routing, no router padding, moe_router_dtype=fp32, no gated "
           "linear unit, fp8_param with mxfp8, inference_grouped_gemm_backend flashinfer / torch / vllm (torch for "
           "mxfp8)",
           lambda c: _m(c, "transformer_impl") == "inference_optimized",
           # a word Megatron Core does not know (rmsnorm) is choices/normalization's one problem
           lambda c: [(_m(c, "normalization") == "RMSNorm" or not NORMALIZATION_WORDS.admits(_m(c, "normalization")),
                       "normalization RMSNorm"),
                      (not _m(c, "layernorm_zero_centered_gamma"), "layernorm_zero_centered_gamma False"),
                      (not _m(c, "add_bias_linear"), "add_bias_linear False"),
                      (not _m(c, "add_qkv_bias"), "add_qkv_bias False"),
                      (not _m(c, "use_kitchen"), "use_kitchen False"),
                      *((((c.model.expert_tensor_parallel_size or 1) <= 1, "expert_tensor_parallel_size 1"),
                        (_m(c, "moe_expert_capacity_factor") is None, "moe_expert_capacity_factor null"),
                        (not _m(c, "moe_router_padding_for_quantization"), "no moe_router_padding_for_quantization"),
                        (_m(c, "moe_router_dtype") == "fp32", "moe_router_dtype fp32"),
                        (not _m(c, "gated_linear_unit"), "gated_linear_unit False"),
                        (_m(c, "fp8") != "mxfp8" or bool(_m(c, "fp8_param")), "fp8_param with mxfp8"),
                        (_name(_m(c, "inference_grouped_gemm_backend", "torch")) .lower() in
                         ("flashinfer", "torch", "vllm"), "inference_grouped_gemm_backend flashinfer, torch or vllm"),
                        (_m(c, "fp8") != "mxfp8" or _name(_m(c, "inference_grouped_gemm_backend", "torch")).lower()
                         == "torch", "inference_grouped_gemm_backend torch with mxfp8"))
                        if _m(c, "num_moe_experts") is not None else ())],
           "model.transformer_impl=transformer_engine"),
    _rule("model/inference-only-options", MODEL, "model.inference_fuse_tp_communication",
          "inference_fuse_tp_communication and inference_disable_triton_nvls_kernels need "
          "transformer_impl=inference_optimized (the first: a dense model)",
          lambda c: _flag(c, "inference_fuse_tp_communication") or _flag(c, "inference_disable_triton_nvls_kernels"),
          lambda c: _m(c, "transformer_impl") == "inference_optimized" and not (
              _m(c, "inference_fuse_tp_communication") and _m(c, "num_moe_experts") is not None),
          "model.inference_fuse_tp_communication=False model.inference_disable_triton_nvls_kernels=False"),
    # MLP activation and fusions
    _group("model/bias-activation-fusion", MODEL, "model.bias_activation_fusion",
           "bias_activation_fusion needs activation gelu, silu (swiglu) or quick_gelu (quick_gelu: gated; gelu "
           "without GLU: add_bias_linear), glu_linear_offset 0 unless quick_gelu, and use_te_activation_func=False",
           lambda c: _flag(c, "bias_activation_fusion"),
           lambda c: [(_activation(c) in ("gelu", "silu", "quick_gelu"), "activation gelu, silu or quick_gelu"),
                      (not (_activation(c) == "gelu" and not _m(c, "gated_linear_unit")
                            and not _m(c, "add_bias_linear")), "gelu without GLU needs add_bias_linear"),
                      (not (_activation(c) == "quick_gelu" and not _m(c, "gated_linear_unit")),
                       "quick_gelu needs gated_linear_unit"),
                      ((_m(c, "glu_linear_offset", 0.0) or 0.0) == 0.0 or _activation(c) == "quick_gelu",
                       "glu_linear_offset 0 unless quick_gelu"),
                      (not _m(c, "use_te_activation_func"), "use_te_activation_func False")],
           "model.bias_activation_fusion=False"),
    _rule("model/te-activation-func", MODEL, "model.use_te_activation_func",
          "use_te_activation_func needs activation gelu, silu or relu (GLU variants included)",
          lambda c: _flag(c, "use_te_activation_func"), lambda c: _activation(c) in ("gelu", "silu", "relu"),
          "model.use_te_activation_func=False", observed=lambda c: f"True (activation_func={_activation(c)})"),
    _rule("model/activation-fp8-input-store", MODEL, "model.activation_func_fp8_input_store",
          "activation_func_fp8_input_store works only for SwiGLU (activation silu, gated_linear_unit)",
          lambda c: _flag(c, "activation_func_fp8_input_store"),
          lambda c: _activation(c) == "silu" and bool(_m(c, "gated_linear_unit")),
          "model.activation_func_fp8_input_store=False"),
    _rule("model/fused-residual-rmsnorm", MODEL, "model.fused_residual_rmsnorm",
          "fused_residual_rmsnorm needs normalization=RMSNorm", lambda c: _flag(c, "fused_residual_rmsnorm"),
          # a word Megatron Core does not know (rmsnorm) is choices/normalization's one problem
          lambda c: _m(c, "normalization") == "RMSNorm" or not NORMALIZATION_WORDS.admits(_m(c, "normalization")),
          "model.fused_residual_rmsnorm=False"),
    _rule("model/mup-base-hidden-size", MODEL, "model.mup_base_hidden_size",
          "use_mup needs mup_base_hidden_size > 0 (null: the hidden size)", lambda c: _flag(c, "use_mup"),
          lambda c: (_m(c, "mup_base_hidden_size") or c.model.hidden_size) > 0, "model.mup_base_hidden_size=null"),
    # precision
    _group("precision/fp8-options", PRECISION, "model.fp8",
           "fp8_param and fp8_output_proj need fp8 on (fp8_output_proj: fp8_recipe=mxfp8); fp8_recipe=custom needs "
           "fp8_quantizer_factory; first_last_layers_bf16 needs a recipe other than delayed and "
           "num_layers_at_start/end_in_bf16 from 0 to the layers per pipeline stage",
           lambda c: bool(_fp8(c) or _m(c, "fp8_param") or _m(c, "fp8_output_proj")),
           lambda c: [(_fp8(c) or not _m(c, "fp8_param"), "fp8_param needs fp8"),
                      (_fp8(c) or not _m(c, "fp8_output_proj"), "fp8_output_proj needs fp8"),
                      (not _m(c, "fp8_output_proj") or _name(_m(c, "fp8_recipe")) == "mxfp8",
                       "fp8_output_proj needs fp8_recipe mxfp8"),
                      (not _fp8(c) or _name(_m(c, "fp8_recipe")) != "custom" or bool(_m(c, "fp8_quantizer_factory")),
                       "fp8_recipe custom needs fp8_quantizer_factory"),
                      (not (_fp8(c) and _m(c, "first_last_layers_bf16")) or _name(_m(c, "fp8_recipe")) != "delayed",
                       "first_last_layers_bf16 needs an fp8 recipe other than delayed"),
                      *(((0 <= (_m(c, f"num_layers_at_{end}_in_bf16") or 0) <= _layers_per_stage(c),
                          f"num_layers_at_{end}_in_bf16 from 0 to {_layers_per_stage(c)}") for end in ("start", "end"))
                        if _fp8(c) and _m(c, "first_last_layers_bf16") else ())],
           "mixed_precision=<an fp8 preset, e.g. bf16_with_fp8_current_scaling_mixed>  (or model.fp8_param=null "
           "model.fp8_output_proj=False)"),
    _group("precision/fp4-options", PRECISION, "model.fp4",
           "fp4 and fp8 exclude each other; fp4_param needs fp4; fp4_recipe=custom needs fp4_quantizer_factory",
           lambda c: bool(_fp4(c) or _m(c, "fp4_param")),
           lambda c: [(not (_fp4(c) and _fp8(c)), "not both fp4 and fp8"),
                      (_fp4(c) or not _m(c, "fp4_param"), "fp4_param needs fp4"),
                      (not _fp4(c) or _name(_m(c, "fp4_recipe")) != "custom" or bool(_m(c, "fp4_quantizer_factory")),
                       "fp4_recipe custom needs fp4_quantizer_factory")],
           "mixed_precision=bf16_with_nvfp4_mixed  (or model.fp4=null model.fp4_param=null)"),
    _rule("precision/preset-known", PRECISION, "mixed_precision",
          "mixed_precision must name a preset Megatron Bridge knows (or be null)",
          lambda c: isinstance(c.cfg.mixed_precision, str), lambda c: _preset_known(c.cfg.mixed_precision),
          "mixed_precision=bf16_mixed"),
    # Megatron Bridge applies every field of the preset over the model's at setup (mixed_precision.py,
    # update_config_with_precision_overrides; only a debug log says so): a precision choice made on the model alone
    # is dropped where the preset's differs.
    # A value the model holds, or null given on the command line (model.fp8=null: FP8 off, asked for).
    *(_rule(f"precision/preset-replaces-{name.replace('_', '-')}", PRECISION, f"model.{name}",
            f"model.{name} set on the model is replaced at setup by the mixed_precision preset's {name} (every field "
            f"of the preset is applied over the model's, with no message): {effect}",
            lambda c, name=name, when=when: _held_or_given(c, name) and _mixed_precision(c) is not None and when(c),
            lambda c, name=name, same=same: same(getattr(_mixed_precision(c), name, None), getattr(c.model, name, None)),
            fix, observed=lambda c, name=name: (f"{_name(getattr(c.model, name)) or None} (mixed_precision="
                                                f"{show(c.cfg.mixed_precision)} sets "
                                                f"{_name(getattr(_mixed_precision(c), name, None)) or None})"),
            fix_text=fix_text)
      for name, when, same, effect, fix, fix_text in (
          # a word Megatron Core does not know is choices/fp8-format's one problem (with its did-you-mean)
          ("fp8", lambda c: FP8_FORMAT_WORDS.admits(getattr(c.model, "fp8", None)),
           lambda preset, model: preset == model,
           "the run would not train in the FP8 format it asks for", _preset_fp8_fix,
           "mixed_precision=<a preset with your fp8 (and fp8_recipe)>  (or mixed_precision.fp8=<format> where "
           "mixed_precision is a config)"),
          # Megatron Core reads model.fp4 only as on or off (`if config.fp4`, fp4_utils.py and the layers); its one
          # format word is e2m1 (the nvfp4 presets write it), the kind of FP4 is fp4_recipe: any two set values agree.
          ("fp4", always, lambda preset, model: bool(preset) == bool(model),
           "the run would not train in FP4 (of the presets, only the nvfp4 ones have it)",
           lambda c: _off_fix(c, "fp4", "FP4") if getattr(c.model, "fp4", None) is None else _FP4_FIX, _FP4_FIX),
          # Every preset writes fp4_recipe (nvfp4 unless it says otherwise). Only where the preset turns FP4 on does
          # the recipe train: where it does not, FP4 is off (and a model.fp4 of the user's is the rule above's).
          ("fp4_recipe", lambda c: bool(getattr(_mixed_precision(c), "fp4", None)),
           lambda preset, model: _name(preset) == _name(model),
           "the run would train FP4 with the preset's recipe, not the one it asks for",
           _FP4_RECIPE_FIX, _FP4_RECIPE_FIX))),
    # fp8_recipe: every preset writes one (tensorwise unless it says otherwise); only where the preset turns FP8 on
    # does it train. The model's own (_set_on_model) is the one the command line gave, model.fp8_recipe=delayed
    # (Megatron Core's default) included, or one set apart from that default (all a config composed in Python tells).
    # Where model.fp8 is replaced too, that rule's problem is the one (its fix names a preset with this recipe too).
    _rule("precision/preset-replaces-fp8-recipe", PRECISION, "model.fp8_recipe",
          "model.fp8_recipe set on the model is replaced at setup by the mixed_precision preset's fp8_recipe (every "
          "field of the preset is applied over the model's, with no message): the run would train FP8 with the "
          "preset's scaling recipe, not the one it asks for",
          lambda c: _preset_fp8(c) and _set_on_model(c, "fp8_recipe") and _model_fp8_kept(c),
          lambda c: _name(_preset_value(c, "fp8_recipe")) == _name(c.model.fp8_recipe), _preset_fp8_recipe_fix,
          observed=lambda c: (f"{_name(c.model.fp8_recipe) or None} (mixed_precision="
                              f"{show(c.cfg.mixed_precision)} sets {_name(_preset_value(c, 'fp8_recipe'))})"),
          fix_text="mixed_precision=<the preset with your fp8_recipe>, or model.fp8_recipe=<the preset's>"),
    *(_rule(f"precision/preset-replaces-{name.replace('_', '-')}", PRECISION, f"model.{name}",
            f"model.{name} set on the model is replaced at setup by the mixed_precision preset's {name} (every field "
            f"of the preset is applied over the model's, with no message; checked where the preset's FP8"
            f"{' or FP4' if 'bf16' in name else ''}{' delayed scaling' if when is _preset_delayed else ''} reads it): "
            f"{effect}",
            lambda c, name=name, when=when: when(c) and _set_on_model(c, name) and _model_fp8_kept(c),
            lambda c, name=name: _name(_preset_value(c, name)) == _name(getattr(c.model, name)),
            _preset_value_fix(name),
            observed=lambda c, name=name: (f"{show(getattr(c.model, name))} (mixed_precision="
                                           f"{show(c.cfg.mixed_precision)} sets {show(_preset_value(c, name))})"),
            fix_text=f"model.{name}=<the preset's>  (another value needs mixed_precision as a config)")
      for name, when, effect in PRESET_FP8_SETTINGS),
    # the preset's other fields (bf16, fp16, params_dtype, the loss scaling, ddp.grad_reduce_in_fp32, ...), over the
    # model, optimizer and DDP configs alike: only a key the command line gave can be told from the recipe's own.
    _rule("precision/preset-replaces-given", PRECISION, "mixed_precision",
          "a precision key given on the command line (model., optimizer. or ddp. bf16, fp16, params_dtype, "
          "grad_reduce_in_fp32, the loss scaling, ...) is replaced at setup by the mixed_precision preset's value "
          "(every field of the preset is applied over those configs, with no message): the run would not train "
          "as the command line asks",
          lambda c: bool(c.given_keys) and _mixed_precision(c) is not None,
          lambda c: not _given_replaced_by_preset(c), _given_replaced_fix,
          observed=lambda c: (f"{show(c.cfg.mixed_precision)} (writes " + ", ".join(
              f"{key}={show(written)} over {show(given)} given" for key, given, written in _given_replaced_by_preset(c))
              + ")"),
          fix_text="drop the key given (the preset's value trains), or mixed_precision=null"),
    # MoE
    _rule("moe/ffn-hidden-size-needs-experts", MODEL, "model.moe_ffn_hidden_size",
          "model.moe_ffn_hidden_size needs num_moe_experts (unless moe_layer_freq leaves dense layers)",
          lambda c: _m(c, "num_moe_experts") is None and _m(c, "moe_ffn_hidden_size") is not None,
          lambda c: (isinstance(_m(c, "moe_layer_freq"), list) and 0 in _m(c, "moe_layer_freq")) or (
              isinstance(_m(c, "moe_layer_freq"), int) and _m(c, "moe_layer_freq") > 1),
          "model.moe_ffn_hidden_size=null"),
    _group("moe/single-grouped-weight", MODEL, "model.moe_single_grouped_weight",
           "moe_single_grouped_weight / moe_single_grouped_bias need moe_grouped_gemm; the weight needs "
           "use_transformer_engine_op_fuser and high-precision weights, fp8_recipe=mxfp8 or fp4_recipe=nvfp4; the "
           "bias needs add_bias_linear",
           lambda c: _flag(c, "moe_single_grouped_weight") or _flag(c, "moe_single_grouped_bias"),
           lambda c: [(bool(_m(c, "moe_grouped_gemm")), "moe_grouped_gemm True"),
                      *(((not (_fp8(c) and _name(_m(c, "fp8_recipe")) != "mxfp8")
                          and not (_fp4(c) and _name(_m(c, "fp4_recipe")) != "nvfp4"),
                          "fp8 only with mxfp8, fp4 only with nvfp4"),
                         (bool(_m(c, "use_transformer_engine_op_fuser")), "use_transformer_engine_op_fuser True"))
                        if _m(c, "moe_single_grouped_weight") else ()),
                      (not _m(c, "moe_single_grouped_bias") or bool(_m(c, "add_bias_linear")),
                       "moe_single_grouped_bias needs add_bias_linear")],
           "model.moe_single_grouped_weight=False model.moe_single_grouped_bias=False"),
    _group("moe/flex-dispatcher", MODEL, "model.moe_flex_dispatcher_backend",
           "the DeepEP / NCCL-EP backends need moe_token_dispatcher_type=flex; moe_enable_deepep excludes "
           "moe_flex_dispatcher_backend=hybridep; DeepEP does not pad to capacity",
           lambda c: _flag(c, "moe_enable_deepep") or _m(c, "moe_flex_dispatcher_backend") in ("ncclep", "deepep")
           or (_m(c, "moe_token_dispatcher_type") == "flex" and _flag(c, "moe_pad_expert_input_to_capacity")),
           lambda c: [(not _m(c, "moe_enable_deepep") or _m(c, "moe_token_dispatcher_type") == "flex",
                       "moe_enable_deepep needs moe_token_dispatcher_type flex"),
                      (not (_m(c, "moe_enable_deepep") and _m(c, "moe_flex_dispatcher_backend") == "hybridep"),
                       "not both moe_enable_deepep and the hybridep backend"),
                      (not (_m(c, "moe_token_dispatcher_type") == "flex" and _m(c, "moe_pad_expert_input_to_capacity")
                            and (_m(c, "moe_enable_deepep") or _m(c, "moe_flex_dispatcher_backend") == "deepep")),
                       "no moe_pad_expert_input_to_capacity with DeepEP"),
                      (_m(c, "moe_flex_dispatcher_backend") != "ncclep" or _m(c, "moe_token_dispatcher_type") == "flex",
                       "the ncclep backend needs moe_token_dispatcher_type flex")],
           "model.moe_token_dispatcher_type=flex  (or model.moe_enable_deepep=False, "
           "model.moe_pad_expert_input_to_capacity=False)"),
    _rule("moe/flex-dispatcher-num-sms", MODEL, "model.moe_flex_dispatcher_num_sms",
          "moe_deepep_num_sms and moe_hybridep_num_sms (deprecated) must agree, or moe_flex_dispatcher_num_sms be set",
          lambda c: _m(c, "moe_flex_dispatcher_num_sms") is None,
          lambda c: len({v for v in (_m(c, "moe_deepep_num_sms"), _m(c, "moe_hybridep_num_sms")) if v is not None}) <= 1,
          "model.moe_flex_dispatcher_num_sms=<SM count> model.moe_deepep_num_sms=null model.moe_hybridep_num_sms=null",
          observed=lambda c: f"null (moe_deepep_num_sms={_m(c, 'moe_deepep_num_sms')}, "
                             f"moe_hybridep_num_sms={_m(c, 'moe_hybridep_num_sms')})"),
    _rule("moe/shared-expert-size", MODEL, "model.moe_shared_expert_intermediate_size",
          "moe_shared_expert_intermediate_size must be > 0 (shared experts x their FFN size) or null",
          lambda c: _m(c, "moe_shared_expert_intermediate_size") is not None,
          lambda c: _m(c, "moe_shared_expert_intermediate_size") > 0, "model.moe_shared_expert_intermediate_size=null"),
    _rule("moe/shared-expert-overlap", MODEL, "model.moe_shared_expert_overlap",
          "moe_shared_expert_overlap needs moe_token_dispatcher_type alltoall or flex",
          lambda c: _m(c, "moe_shared_expert_intermediate_size") is not None and _flag(c, "moe_shared_expert_overlap"),
          lambda c: _m(c, "moe_token_dispatcher_type") in ("alltoall", "flex"), "model.moe_shared_expert_overlap=False"),
    # not a TransformerConfig check: SharedExpertMLP asserts it when the model is built (moe/shared_experts.py)
    _rule("moe/shared-expert-bias", MODEL, "model.add_bias_linear",
          "shared experts have no bias: add_bias_linear must be False where moe_shared_expert_intermediate_size is set",
          lambda c: bool(_m(c, "num_moe_experts")) and _m(c, "moe_shared_expert_intermediate_size") is not None,
          lambda c: not _m(c, "add_bias_linear"),
          "model.add_bias_linear=False  (or model.moe_shared_expert_intermediate_size=null)"),
    _rule("moe/aux-loss-coeff-per-type", MODEL, "model.moe_aux_loss_coeff",
          "a list moe_router_load_balancing_type needs a list moe_aux_loss_coeff of the same length",
          lambda c: isinstance(_m(c, "moe_router_load_balancing_type"), list),
          lambda c: isinstance(_m(c, "moe_aux_loss_coeff"), list) and len(_m(c, "moe_aux_loss_coeff")) == len(
              _m(c, "moe_router_load_balancing_type")),
          lambda c: "model.moe_aux_loss_coeff=[" + ",".join(["0.001"] * len(_m(c, "moe_router_load_balancing_type")))
          + "]", fix_text="model.moe_aux_loss_coeff=[<one per load-balancing type>]"),
    _rule("moe/capacity-factor-balancing", MODEL, "model.moe_router_load_balancing_type",
          "moe_expert_capacity_factor works only with load balancing aux_loss, seq_aux_loss, global_aux_loss or none",
          lambda c: _m(c, "moe_expert_capacity_factor") is not None and _m(c, "moe_expert_capacity_factor") >= 0,
          # only the words Megatron Core knows: another is choices/moe-load-balancing's one problem
          lambda c: all(t in ("aux_loss", "seq_aux_loss", "global_aux_loss", "none")
                        for t in (_m(c, "moe_router_load_balancing_type")
                                  if isinstance(_m(c, "moe_router_load_balancing_type"), list)
                                  else [_m(c, "moe_router_load_balancing_type")]) if MOE_BALANCING_WORDS.admits(t)),
          "model.moe_router_load_balancing_type=aux_loss  (or model.moe_expert_capacity_factor=null)"),
    _rule("moe/pad-needs-capacity", MODEL, "model.moe_expert_capacity_factor",
          "moe_pad_expert_input_to_capacity needs moe_expert_capacity_factor",
          lambda c: _flag(c, "moe_pad_expert_input_to_capacity"),
          lambda c: _m(c, "moe_expert_capacity_factor") is not None and _m(c, "moe_expert_capacity_factor") >= 0,
          "model.moe_expert_capacity_factor=1.0  (or model.moe_pad_expert_input_to_capacity=False)"),
    _rule("moe/rank-capacity-factor", MODEL, "model.moe_expert_rank_capacity_factor",
          "moe_expert_rank_capacity_factor needs moe_flex_dispatcher_backend hybridep (with "
          "use_transformer_engine_op_fuser) or ncclep",
          lambda c: _m(c, "moe_expert_rank_capacity_factor") is not None,
          lambda c: _m(c, "moe_flex_dispatcher_backend") == "ncclep" or (
              _m(c, "moe_flex_dispatcher_backend") == "hybridep" and bool(_m(c, "use_transformer_engine_op_fuser"))),
          "model.moe_expert_rank_capacity_factor=null"),
    _group("moe/paged-stash", MODEL, "model.moe_paged_stash",
           "moe_paged_stash needs moe_expert_rank_capacity_factor and no expert_fc1 / moe_act / fused_group_mlp in "
           "offload_modules", lambda c: _flag(c, "moe_paged_stash"),
           lambda c: [(_m(c, "moe_expert_rank_capacity_factor") is not None, "moe_expert_rank_capacity_factor set"),
                      (not ({"expert_fc1", "moe_act", "fused_group_mlp"} & _offload_modules(c)),
                       "no expert_fc1 / moe_act / fused_group_mlp offload")],
           "model.moe_paged_stash=False"),
    _rule("moe/bias-needs-etp-1", MODEL, "model.expert_tensor_parallel_size",
          "an MoE model with add_bias_linear needs expert_tensor_parallel_size 1",
          lambda c: _m(c, "num_moe_experts") is not None and _flag(c, "add_bias_linear"),
          lambda c: _etp(c) == 1, "model.expert_tensor_parallel_size=1  (or model.add_bias_linear=False)",
          observed=lambda c: f"{_etp(c)} (add_bias_linear=True)"),
    _rule("moe/expert-bias-score-function", MODEL, "model.moe_router_score_function",
          "moe_router_enable_expert_bias needs moe_router_score_function sigmoid or sqrtsoftplus",
          lambda c: _flag(c, "moe_router_enable_expert_bias"),
          lambda c: _m(c, "moe_router_score_function") in ("sigmoid", "sqrtsoftplus"),
          "model.moe_router_score_function=sigmoid  (or model.moe_router_enable_expert_bias=False)"),
    _rule("moe/router-padding-quantization", MODEL, "model.moe_router_padding_for_quantization",
          "moe_router_padding_for_quantization (or _for_fp8) needs fp8 or fp4 and a dispatcher other than "
          "allgather / alltoall_seq",
          lambda c: _flag(c, "moe_router_padding_for_quantization") or _flag(c, "moe_router_padding_for_fp8"),
          lambda c: (_m(c, "fp8") is not None or _m(c, "fp4") is not None)
          and _m(c, "moe_token_dispatcher_type") not in ("allgather", "alltoall_seq"),
          "model.moe_router_padding_for_quantization=False model.moe_router_padding_for_fp8=False"),
    _rule("moe/topk-1-pre-softmax", MODEL, "model.moe_router_pre_softmax",
          "moe_router_topk=1 with softmax scoring needs moe_router_pre_softmax (unless sinkhorn balancing)",
          lambda c: _m(c, "moe_router_topk") == 1 and _m(c, "moe_router_score_function") == "softmax"
          and _m(c, "moe_router_load_balancing_type") != "sinkhorn",
          lambda c: bool(_m(c, "moe_router_pre_softmax")), "model.moe_router_pre_softmax=True"),
    _group("moe/group-limited-routing", MODEL, "model.moe_router_group_topk",
           "group-limited routing (moe_router_group_topk) needs moe_router_num_groups dividing num_moe_experts and "
           ">= moe_router_group_topk, and not the deprecated moe_router_topk_limited_devices",
           lambda c: bool(_m(c, "moe_router_group_topk")),
           lambda c: [(not _m(c, "moe_router_topk_limited_devices"), "moe_router_topk_limited_devices unset"),
                      (bool(_m(c, "moe_router_num_groups")), "moe_router_num_groups set"),
                      *((((_m(c, "num_moe_experts") or 0) % _m(c, "moe_router_num_groups") == 0,
                         "num_moe_experts divisible by moe_router_num_groups"),
                        (_m(c, "moe_router_group_topk") <= _m(c, "moe_router_num_groups"),
                         "moe_router_group_topk <= moe_router_num_groups"))
                        if _m(c, "moe_router_num_groups") and not _m(c, "moe_router_topk_limited_devices") else ())],
           "model.moe_router_group_topk=null model.moe_router_num_groups=null"),
    _rule("moe/allgather-fixed-lengths", MODEL, "model.moe_token_dispatcher_type",
          "the allgather token dispatcher does not support variable sequence lengths (model.variable_seq_lengths)",
          lambda c: _m(c, "moe_token_dispatcher_type") == "allgather", lambda c: _m(c, "variable_seq_lengths") is not True,
          "model.moe_token_dispatcher_type=alltoall"),
    _group("moe/ep-comm-overlap", MODEL, "model.overlap_moe_expert_parallel_comm",
           "overlap_moe_expert_parallel_comm (model or comm_overlap) needs EP > 1, num_moe_experts > 1, dispatcher "
           "alltoall or flex, a bf16/fp16 model, a virtual pipeline with PP > 1, no full recompute / recompute_method "
           "/ recompute_num_layers / moe recompute, no moe_shared_expert_overlap, at most one MTP layer (and no "
           "expert_fc1 offload with ncclep, no moe/mlp graphs with TE graphs)",
           _ep_overlap, _ep_overlap_checks, "model.overlap_moe_expert_parallel_comm=False", fixes=_ep_overlap_fixes),
    _group("moe/wgrad-overlap", MODEL, "model.delay_wgrad_compute",
           "delay_wgrad_compute and ep_overlap_early_attn_memory_release need overlap_moe_expert_parallel_comm; "
           "overlap_dispatch_backward_with_experts_wgrad excludes both; delayed wgrad in attn / moe_router CUDA graphs "
           "needs gradient_accumulation_fusion and no attention bias",
           lambda c: bool(_m(c, "delay_wgrad_compute") or _m(c, "ep_overlap_early_attn_memory_release")
                          or _m(c, "overlap_dispatch_backward_with_experts_wgrad") or _co_delay_wgrad(c)),
           lambda c: [(_ep_overlap(c) or not (_m(c, "delay_wgrad_compute") or _co_delay_wgrad(c)),
                       "delay_wgrad_compute needs overlap_moe_expert_parallel_comm"),
                      (_ep_overlap(c) or not _m(c, "ep_overlap_early_attn_memory_release"),
                       "ep_overlap_early_attn_memory_release needs overlap_moe_expert_parallel_comm"),
                      (not (_m(c, "overlap_dispatch_backward_with_experts_wgrad") and _m(c, "overlap_moe_expert_parallel_comm")),
                       "overlap_dispatch_backward_with_experts_wgrad without overlap_moe_expert_parallel_comm"),
                      (not (_m(c, "overlap_dispatch_backward_with_experts_wgrad") and _m(c, "delay_wgrad_compute")),
                       "not both delay_wgrad_compute and overlap_dispatch_backward_with_experts_wgrad"),
                      *(((bool(_m(c, "gradient_accumulation_fusion")), "gradient_accumulation_fusion with graphs"),
                         (not ("attn" in _graph_modules(c) and (_m(c, "add_bias_linear") or _m(c, "add_qkv_bias"))),
                          "no attention bias with an attn graph"))
                        if _co_delay_wgrad(c) and _wgrad_in_graph(c) else ())],
           "model.delay_wgrad_compute=False model.ep_overlap_early_attn_memory_release=False"),
    # recomputation
    _rule("recompute/granularity-known", MODEL, "model.recompute_granularity",
          "model.recompute_granularity must be full, selective or null",
          lambda c: _m(c, "recompute_granularity") is not None,
          lambda c: _m(c, "recompute_granularity") in ("full", "selective"), "model.recompute_granularity=selective"),
    _rule("recompute/method-known", MODEL, "model.recompute_method",
          "model.recompute_method must be block, uniform or null",
          lambda c: _m(c, "recompute_granularity") is not None and _m(c, "recompute_method") is not None,
          lambda c: _m(c, "recompute_method") in ("block", "uniform"), "model.recompute_method=uniform"),
    _rule("recompute/distribute-saved-activations", MODEL, "model.distribute_saved_activations",
          "distribute_saved_activations does not work with sequence parallelism",
          lambda c: _m(c, "recompute_granularity") is not None and _flag(c, "distribute_saved_activations"),
          lambda c: not (_m(c, "sequence_parallel") and c.model.tensor_model_parallel_size > 1),
          "model.distribute_saved_activations=False"),
    _rule("recompute/modules-known", MODEL, "model.recompute_modules",
          "model.recompute_modules may hold core_attn, moe_act, layernorm, mla_up_proj, mlp, moe, shared_experts, "
          "gdn_norm_out", lambda c: _m(c, "recompute_granularity") == "selective",
          lambda c: set(_recompute_modules(c)) <= set(RECOMPUTE_MODULES),
          lambda c: "model.recompute_modules=[" + ",".join(m for m in _recompute_modules(c) if m in RECOMPUTE_MODULES) + "]",
          fix_text="model.recompute_modules=[<known modules>]"),
    _group("recompute/modules-need-features", MODEL, "model.recompute_modules",
           "recompute modules need their feature: moe_act moe_grouped_gemm, mla_up_proj multi_latent_attention, "
           "gdn_norm_out gated_delta_net attention, shared_experts no moe_shared_expert_overlap; with fp8, moe_act / "
           "layernorm need an fp8 recipe other than delayed",
           lambda c: _m(c, "recompute_granularity") == "selective",
           lambda c: [("moe_act" not in _recompute_modules(c) or bool(_m(c, "moe_grouped_gemm")),
                       "moe_act needs moe_grouped_gemm"),
                      ("mla_up_proj" not in _recompute_modules(c) or bool(_m(c, "multi_latent_attention")),
                       "mla_up_proj needs multi_latent_attention"),
                      ("gdn_norm_out" not in _recompute_modules(c)
                       or _m(c, "experimental_attention_variant") == "gated_delta_net",
                       "gdn_norm_out needs gated_delta_net"),
                      ("shared_experts" not in _recompute_modules(c) or not (
                          _m(c, "moe_shared_expert_intermediate_size") is not None and _m(c, "moe_shared_expert_overlap")),
                       "shared_experts recompute excludes moe_shared_expert_overlap"),
                      (not (_fp8(c) and {"moe_act", "layernorm"} & set(_recompute_modules(c))
                            and _name(_m(c, "fp8_recipe")) == "delayed"),
                       "no moe_act / layernorm recompute with delayed fp8 scaling")],
           "model.recompute_modules=[core_attn]"),
    _rule("recompute/moe-layer-not-full", MODEL, "model.moe_layer_recompute",
          "moe_layer_recompute (deprecated) cannot be combined with recompute_granularity=full",
          lambda c: _flag(c, "moe_layer_recompute"), lambda c: _m(c, "recompute_granularity") != "full",
          "model.moe_layer_recompute=False  (use model.recompute_modules=[moe] with selective)"),
    # fine-grained activation offload (the rest is in fine_grained.py)
    _rule("fine-grained/delta-offload-bytes", FINE_GRAINED, "model.delta_offload_bytes_across_pp_ranks",
          "model.delta_offload_bytes_across_pp_ranks must be >= 0", lambda c: _flag(c, "fine_grained_activation_offloading"),
          lambda c: (_m(c, "delta_offload_bytes_across_pp_ranks", 0) or 0) >= 0,
          "model.delta_offload_bytes_across_pp_ranks=0"),
    # pipeline stages
    _group("pipeline/one-layout-way", PARALLELISM, "model.pipeline_model_parallel_layout",
           "the pipeline split is given one way: pipeline_model_parallel_layout, or num_layers_in_first/"
           "last_pipeline_stage, or account_for_embedding/loss_in_pipeline_split",
           lambda c: c.model.pipeline_model_parallel_layout is not None
           or c.model.num_layers_in_first_pipeline_stage is not None
           or c.model.num_layers_in_last_pipeline_stage is not None,
           lambda c: [(not ((c.model.pipeline_model_parallel_layout is not None
                             or c.model.num_layers_in_first_pipeline_stage is not None
                             or c.model.num_layers_in_last_pipeline_stage is not None)
                            and (c.model.account_for_embedding_in_pipeline_split
                                 or c.model.account_for_loss_in_pipeline_split)),
                       "no account_for_embedding/loss_in_pipeline_split"),
                      (not (c.model.pipeline_model_parallel_layout is not None and (
                          c.model.num_layers_in_first_pipeline_stage is not None
                          or c.model.num_layers_in_last_pipeline_stage is not None)),
                       "not both a layout and first/last stage sizes")],
           "model.account_for_embedding_in_pipeline_split=False model.account_for_loss_in_pipeline_split=False"),
    _rule("pipeline/layout-valid", PARALLELISM, "model.pipeline_model_parallel_layout",
          "model.pipeline_model_parallel_layout must be a valid layout: stages a multiple of PP (the virtual size "
          "matching virtual_pipeline_model_parallel_size), embedding first and loss last once each, num_layers "
          "decoder layers, mtp_num_layers MTP layers in one last virtual stage",
          lambda c: c.model.pipeline_model_parallel_layout is not None, lambda c: not _layout_error(c),
          "model.pipeline_model_parallel_layout=null", observed=lambda c: f"{show_typed(c.model.pipeline_model_parallel_layout)} "
                                                                       f"({_layout_error(c)})"),
    _group("pipeline/uneven-stages", PARALLELISM, "model.num_layers_in_first_pipeline_stage",
           "with num_layers_in_first/last_pipeline_stage: each > 0, the remaining layers split evenly over the "
           "remaining stages (none left for none), and with a virtual pipeline every stage's layers divisible by it",
           lambda c: c.model.pipeline_model_parallel_layout is None and (
               c.model.num_layers_in_first_pipeline_stage is not None
               or c.model.num_layers_in_last_pipeline_stage is not None),
           _uneven_split_checks,
           "model.num_layers_in_first_pipeline_stage=null model.num_layers_in_last_pipeline_stage=null"),
    _rule("pipeline/embedding-loss-split", PARALLELISM, "model.pipeline_model_parallel_size",
          "with account_for_embedding/loss_in_pipeline_split, num_layers plus those 1 or 2 must be divisible by PP "
          "(and the layers per stage by the virtual pipeline size)",
          lambda c: c.model.pipeline_model_parallel_layout is None and c.model.num_layers_in_first_pipeline_stage is None
          and c.model.num_layers_in_last_pipeline_stage is None and bool(
              c.model.account_for_embedding_in_pipeline_split or c.model.account_for_loss_in_pipeline_split),
          lambda c: _embedding_loss_layers(c) % c.model.pipeline_model_parallel_size == 0 and (
              c.model.virtual_pipeline_model_parallel_size is None
              or (_embedding_loss_layers(c) // c.model.pipeline_model_parallel_size)
              % c.model.virtual_pipeline_model_parallel_size == 0),
          "model.account_for_embedding_in_pipeline_split=False model.account_for_loss_in_pipeline_split=False",
          observed=lambda c: f"{c.model.pipeline_model_parallel_size} ({_embedding_loss_layers(c)} layers with "
                             f"embedding/loss, VPP {c.model.virtual_pipeline_model_parallel_size})"),
    _rule("parallel/pipeline-dtype", PARALLELISM, "model.pipeline_dtype",
          "pipeline parallelism needs model.pipeline_dtype (null: params_dtype, which must then be set)",
          lambda c: c.model.pipeline_model_parallel_size > 1,
          lambda c: _m(c, "pipeline_dtype") is not None or _m(c, "params_dtype") is not None,
          "model.pipeline_dtype=bf16"),
    _group("parallel/defer-embedding-wgrad", PARALLELISM, "model.defer_embedding_wgrad_compute",
           "defer_embedding_wgrad_compute needs pipeline parallelism, gradient_accumulation_fusion and "
           "wgrad_deferral_limit >= 0", lambda c: _flag(c, "defer_embedding_wgrad_compute"),
           lambda c: [(c.model.pipeline_model_parallel_size > 1, "pipeline_model_parallel_size > 1"),
                      (bool(_m(c, "gradient_accumulation_fusion")), "gradient_accumulation_fusion True"),
                      ((_m(c, "wgrad_deferral_limit", 0) or 0) >= 0, "wgrad_deferral_limit >= 0")],
           "model.defer_embedding_wgrad_compute=False"),
    _rule("parallel/p2p-warmup-flush", PARALLELISM, "model.overlap_p2p_comm_warmup_flush",
          "overlap_p2p_comm_warmup_flush needs overlap_p2p_comm and not batch_p2p_comm",
          lambda c: _flag(c, "overlap_p2p_comm_warmup_flush"),
          lambda c: bool(_m(c, "overlap_p2p_comm")) and not _m(c, "batch_p2p_comm"),
          "model.overlap_p2p_comm_warmup_flush=False"),
    _rule("parallel/tp-weight-shards", PARALLELISM, "model.tensor_parallel_num_weight_shards",
          "tensor_parallel_num_weight_shards (expert_...: of expert TP) must be a multiple of the (expert) tensor "
          "parallel size, at least it",
          lambda c: _m(c, "tensor_parallel_num_weight_shards") is not None
          or _m(c, "expert_tensor_parallel_num_weight_shards") is not None,
          lambda c: all(s is None or (s >= tp and s % tp == 0) for s, tp in (
              (_m(c, "tensor_parallel_num_weight_shards"), c.model.tensor_model_parallel_size),
              (_m(c, "expert_tensor_parallel_num_weight_shards"), _etp(c)))),
          "model.tensor_parallel_num_weight_shards=null model.expert_tensor_parallel_num_weight_shards=null"),
    # CUDA graphs
    _rule("model/cuda-graph-legacy-flags", MODEL, "model.enable_cuda_graph",
          "enable_cuda_graph / external_cuda_graph (deprecated) exclude each other and cuda_graph_impl; "
          "cuda_graph_scope (deprecated) excludes cuda_graph_modules",
          lambda c: bool(_m(c, "enable_cuda_graph") or _m(c, "external_cuda_graph"))
          or _m(c, "cuda_graph_scope") is not None,
          lambda c: not ((_m(c, "enable_cuda_graph") or _m(c, "external_cuda_graph"))
                         and ((_m(c, "cuda_graph_impl") or "none") != "none"
                              or (_m(c, "enable_cuda_graph") and _m(c, "external_cuda_graph"))))
          and not (_m(c, "cuda_graph_scope") is not None and _m(c, "cuda_graph_modules") not in ("full", None, [])),
          "model.enable_cuda_graph=False model.external_cuda_graph=False model.cuda_graph_scope=null  "
          "(use model.cuda_graph_impl / model.cuda_graph_modules)"),
    _rule("model/cuda-graph-impl-known", MODEL, "model.cuda_graph_impl",
          "model.cuda_graph_impl must be none, transformer_engine, local or full_iteration", always,
          lambda c: _graph_impl(c) in ("none", "transformer_engine", "local", "full_iteration"),
          "model.cuda_graph_impl=none"),
    _rule("model/cuda-graph-modules-valid", MODEL, "model.cuda_graph_modules",
          "model.cuda_graph_modules: known module names (attn, mlp, moe, moe_router, moe_preprocess, mamba), 'full' "
          "alone, one deprecated full_iteration value, not with an implementation or inference scope it excludes; "
          "inference_cuda_graph_scope a known scope",
          lambda c: bool(_graph_module_values(c)) or _m(c, "inference_cuda_graph_scope") is not None,
          lambda c: not _graph_modules_error(c), "model.cuda_graph_modules=[]",
          observed=lambda c: f"{show_typed(_m(c, 'cuda_graph_modules'))} ({_graph_modules_error(c)})"),
    _rule("model/cuda-graph-inference-scope", MODEL, "model.inference_cuda_graph_scope",
          "inference_cuda_graph_scope layer / block needs cuda_graph_impl=local; other implementations take none",
          lambda c: _m(c, "inference_cuda_graph_scope") is not None, _inference_scope_ok,
          "model.inference_cuda_graph_scope=null"),
    _rule("model/cuda-graph-local-full-iteration", MODEL, "model.cuda_graph_impl",
          "Megatron Bridge runs cuda_graph_impl=local only as a full-iteration graph (or an inference layer/block "
          "graph); scoped capture (attn, mlp...) needs transformer_engine",
          lambda c: _graph_impl(c) == "local", lambda c: _local_graph_ok(c),
          "model.cuda_graph_impl=transformer_engine"),
    _rule("model/cuda-graph-full-iteration-modules", MODEL, "model.cuda_graph_modules",
          "cuda_graph_impl=full_iteration captures everything: cuda_graph_modules must be empty",
          lambda c: _graph_impl(c) == "full_iteration", lambda c: not _graph_modules(c), "model.cuda_graph_modules=[]"),
    _group("model/cuda-graph-moe-modules", MODEL, "model.cuda_graph_modules",
           "MoE CUDA graph modules: not both moe and moe_router, moe_preprocess only with moe_router, moe / moe_router "
           "only for MoE models, mlp only with dense layers, moe only with drop-and-pad MoE, no moe_preprocess with "
           "token dropping under alltoall",
           lambda c: _graph_impl(c) in ("local", "transformer_engine") and bool(_graph_modules(c)),
           _moe_graph_checks, "model.cuda_graph_modules=[attn]"),
    _group("model/cuda-graph-recompute", MODEL, "model.recompute_granularity",
           "recomputation under CUDA graphs: full recompute only with a full-iteration graph; no recompute of graphed "
           "modules with dropout / input jitter; no moe recompute with a TE moe_router graph",
           lambda c: _graph_impl(c) != "none" and _m(c, "recompute_granularity") is not None,
           _graph_recompute_checks, "model.recompute_granularity=null  (or model.cuda_graph_impl=none)"),
    _group("model/cuda-graph-fine-grained-offload", MODEL, "model.cuda_graph_warmup_steps",
           "fine-grained offload under CUDA graphs: no moe graph module, cuda_graph_warmup_steps > 0, local graphs "
           "for modules (not whole layers), fine_grained_offloading_max_inflight_offloads >= 0 with full-iteration",
           lambda c: _graph_impl(c) != "none" and _flag(c, "fine_grained_activation_offloading"),
           _graph_offload_checks, "model.cuda_graph_warmup_steps=3"),
    # optimizer and DDP (Megatron Core's __post_init__)
    _rule("optimizer/mxfp8-param-gather-overlap", OPTIMIZER_SECTION, "optimizer.overlap_param_gather_with_optimizer_step",
          "overlap_param_gather_with_optimizer_step does not work with reuse_grad_buf_for_mxfp8_param_ag",
          lambda c: bool(_section(c, "optimizer", "reuse_grad_buf_for_mxfp8_param_ag")),
          lambda c: not c.opt.overlap_param_gather_with_optimizer_step,
          "optimizer.overlap_param_gather_with_optimizer_step=False"),
    _rule("optimizer/precision-aware-adam", OPTIMIZER_SECTION, "optimizer.use_precision_aware_optimizer",
          "optimizer.use_precision_aware_optimizer needs optimizer=adam and use_distributed_optimizer",
          lambda c: bool(c.opt.use_precision_aware_optimizer),
          # an optimizer word Megatron Core does not know is choices/optimizer's problem alone (its did-you-mean)
          lambda c: (c.opt.optimizer == "adam" or not OPTIMIZER_WORDS.admits(c.opt.optimizer))
          and bool(c.opt.use_distributed_optimizer),
          "optimizer.use_precision_aware_optimizer=False  (or optimizer.optimizer=adam "
          "optimizer.use_distributed_optimizer=True)"),
    _rule("optimizer/dtypes-need-precision-aware", OPTIMIZER_SECTION, "optimizer.use_precision_aware_optimizer",
          "main_grads_dtype, main_params_dtype, exp_avg_dtype and exp_avg_sq_dtype other than fp32 need "
          "optimizer.use_precision_aware_optimizer", lambda c: not c.opt.use_precision_aware_optimizer,
          lambda c: all(_is_fp32(getattr(c.opt, n)) for n in _OPT_DTYPES),
          "optimizer.use_precision_aware_optimizer=True  (or set the optimizer dtypes back to fp32)",
          observed=lambda c: "False (" + ", ".join(f"{n}={_name(getattr(c.opt, n))}" for n in _OPT_DTYPES
                                                    if not _is_fp32(getattr(c.opt, n))) + ")"),
    _rule("optimizer/precision-aware-te-fused-adam", OPTIMIZER_SECTION, "optimizer.use_precision_aware_optimizer",
          "optimizer.use_precision_aware_optimizer (without optimizer CPU offload) needs Transformer Engine's FusedAdam "
          "(master_weight_dtype, exp_avg_dtype, use_decoupled_grad)",
          lambda c: bool(c.opt.use_precision_aware_optimizer) and not c.opt.optimizer_cpu_offload,
          lambda c: c.installed_te is not None and _te_fused_adam_ok(),
          "uv add transformer-engine  (or optimizer.use_precision_aware_optimizer=False)"),
    _rule("ddp/reuse-grad-buf-needs-fp8-param-gather", DISTRIBUTED, "ddp.reuse_grad_buf_for_mxfp8_param_ag",
          "ddp.reuse_grad_buf_for_mxfp8_param_ag needs fp8_param_gather (params kept in MXFP8)",
          lambda c: bool(_section(c, "ddp", "reuse_grad_buf_for_mxfp8_param_ag")),
          lambda c: bool(_section(c, "ddp", "fp8_param_gather")),
          "ddp.reuse_grad_buf_for_mxfp8_param_ag=False  (or a preset with fp8_param_gather)"),
    _rule("ddp/nccl-ub-expandable-segments", DISTRIBUTED, "env_vars.PYTORCH_CUDA_ALLOC_CONF",
          "ddp.nccl_ub (with torch < 2.11) does not work with the environment variable "
          "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True",
          lambda c: bool(c.cfg.ddp.nccl_ub) and _version(_torch_version(c)) < (2, 11),
          lambda c: "expandable_segments:True" not in (c.env("PYTORCH_CUDA_ALLOC_CONF") or "").split(","),
          "++env_vars.PYTORCH_CUDA_ALLOC_CONF=expandable_segments:False  (or ddp.nccl_ub=False)",
          observed=lambda c: f"{show(c.env('PYTORCH_CUDA_ALLOC_CONF'))} (environment variable)"),
    _rule("ddp/fp32-accumulation-patterns", DISTRIBUTED, "ddp.param_name_patterns_for_fp32_local_accumulation",
          "ddp.param_name_patterns_for_fp32_local_accumulation is only for grad_reduce_in_fp32=False",
          lambda c: bool(getattr(c.cfg.ddp, "param_name_patterns_for_fp32_local_accumulation", None)),
          lambda c: not _section(c, "ddp", "grad_reduce_in_fp32"),
          "ddp.param_name_patterns_for_fp32_local_accumulation=[]"),
    _rule("ddp/buckets", DISTRIBUTED, "ddp.num_buckets",
          "ddp.num_buckets must be > 0 and excludes ddp.bucket_size", lambda c: c.cfg.ddp.num_buckets is not None,
          lambda c: c.cfg.ddp.num_buckets > 0 and c.cfg.ddp.bucket_size is None, "ddp.num_buckets=null"),
)

RECOMPUTE_MODULES = ("core_attn", "moe_act", "layernorm", "mla_up_proj", "mlp", "moe", "shared_experts", "gdn_norm_out")
_OPT_DTYPES = ("main_grads_dtype", "main_params_dtype", "exp_avg_dtype", "exp_avg_sq_dtype")


def _is_fp32(dtype: Any) -> bool:
    return _name(dtype) == "float32"  # Megatron Core compares with torch.float32 (None is not)


def _te_fused_adam_ok() -> bool:
    import inspect

    try:
        from transformer_engine.pytorch.optimizers import FusedAdam
    except ImportError:
        return False
    params = inspect.signature(FusedAdam).parameters
    return all(n in params for n in ("master_weight_dtype", "exp_avg_dtype", "exp_avg_sq_dtype", "use_decoupled_grad"))


def _etp(c: Context) -> int:
    etp = c.model.expert_tensor_parallel_size
    if etp is None:  # Megatron Bridge: 1 under expert parallelism, else the tensor parallel size
        return 1 if c.model.expert_model_parallel_size > 1 else c.model.tensor_model_parallel_size
    return etp


def _co_delay_wgrad(c: Context) -> bool:
    co = c.cfg.comm_overlap
    return co is not None and getattr(co, "delay_wgrad_compute", None) is True


def _preset_known(name: str) -> bool:
    from megatron.bridge.training.mixed_precision import MIXED_PRECISION_RECIPES

    return name in MIXED_PRECISION_RECIPES


def _local_graph_ok(c: Context) -> bool:
    from megatron.bridge.utils.cuda_graph import _member_names, is_full_iteration_cuda_graph

    modules = _graph_modules(c)
    scopes = _member_names(_m(c, "inference_cuda_graph_scope"))
    return bool(is_full_iteration_cuda_graph(c.model)) or (not modules and bool(scopes & {"layer", "block"}))


def _dsa_kernels_available(c: Context) -> bool:
    """As Megatron Core checks it: a CUDA device here, and the backend's packages."""
    import torch
    from megatron.core import utils

    backend = _m(c, "dsa_kernel_backend", "none")
    if not torch.cuda.is_available():
        return False
    missing = getattr(utils, f"_missing_{backend}_dsa_kernel_dependencies", lambda: [])
    return not missing()
