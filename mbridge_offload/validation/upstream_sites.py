"""Where upstream's pre-launch validation can refuse a config: every ``raise`` and ``assert`` of
``runtime_config_update`` / ``ConfigContainer.validate()`` and of the functions and methods of
``megatron.bridge.training.config`` they call, and of what they reach outside that module (``EXTERNAL_ROOTS``:
the model's ``TransformerConfig.__post_init__``, run by ``model.finalize()``, and what it calls; Megatron
Core's optimizer and DDP ``__post_init__``; the CUDA-graph, mixed-precision and comm-overlap checks), read
from the installed source (``inspect`` + ``ast``).

Each site is named by a normalized text: its message with formatted values as ``{}`` and whitespace
collapsed (``NCCL_ALGO must be one of {}.``), or, for a bare ``assert``, ``assert <condition>``. The
site table of ``upstream_rules.py`` maps each of these texts to the rule of the table that states the
same constraint (or to why no user can reach it); tests/validation/test_upstream_sites.py fails when an
upgrade of Megatron Bridge brings a site the table does not know.

Imports Megatron Bridge only when called.
"""

from __future__ import annotations

import ast
import functools
import inspect
import re
import textwrap
from dataclasses import dataclass

CONFIG_MODULE = "megatron.bridge.training.config"
ROOTS = ("runtime_config_update", "ConfigContainer.validate")

# What runtime_config_update / validate() reach outside CONFIG_MODULE (read in its source): (module, function).
# From each, the walk follows the calls it makes within its own module (``self.m()``, ``Class.m()``, module
# functions); calls into other modules are listed here themselves. MLATransformerConfig.__post_init__ is not:
# every recipe here builds a GPTModelProvider (no MLA), and an override cannot change a section's type.
_TC = "megatron.core.transformer.transformer_config"
_LAYOUT = "megatron.core.transformer.pipeline_parallel_layer_layout"
_GRAPHS = "megatron.core.transformer.cuda_graph_config"
EXTERNAL_ROOTS: tuple[tuple[str, str], ...] = (
    # validate(): self.model.finalize() -> MCore TransformerConfig.__post_init__ -> ModelParallelConfig's
    (_TC, "TransformerConfig.__post_init__"),
    ("megatron.core.model_parallel_config", "ModelParallelConfig.__post_init__"),
    (_LAYOUT, "PipelineParallelLayerLayout.from_str"),  # model.pipeline_model_parallel_layout (a str)
    (_LAYOUT, "PipelineParallelLayerLayout.__init__"),  # ... (a list)
    (_LAYOUT, "PipelineParallelLayerLayout.validate_layer_layout"),
    (_GRAPHS, "normalize_cuda_graph_modules"),
    (_GRAPHS, "normalize_inference_cuda_graph_scope"),
    (_GRAPHS, "validate_deprecated_cuda_graph_modules_migration_inputs"),
    ("megatron.core.utils", "_validate_dsa_kernel_backend_dependencies"),
    # validate(): validate_cuda_graph_configuration(self.model), before and after model.finalize()
    ("megatron.bridge.utils.cuda_graph", "validate_cuda_graph_configuration"),
    # validate(): self.optimizer.finalize() / self.ddp.finalize() -> Megatron Core's __post_init__
    ("megatron.core.optimizer.optimizer_config", "OptimizerConfig.__post_init__"),
    ("megatron.core.distributed.distributed_data_parallel_config", "DistributedDataParallelConfig.__post_init__"),
    # runtime_config_update: the mixed_precision preset resolved, finalized and applied; comm_overlap's
    ("megatron.bridge.training.mixed_precision", "get_mixed_precision_config"),
    ("megatron.bridge.training.mixed_precision", "MixedPrecisionConfig.finalize"),
    ("megatron.bridge.training.mixed_precision", "MixedPrecisionConfig.setup"),
    ("megatron.bridge.training.comm_overlap", "CommOverlapConfig.finalize"),
    ("megatron.bridge.training.comm_overlap", "CommOverlapConfig.setup"),
    # validate(): _enable_safe_hybridep_dispatch(model) before the model's finalize
    ("megatron.bridge.models.transformer_config", "_enable_safe_hybridep_dispatch"),
    # model.finalize() (Megatron Bridge's TransformerConfig) first resolves activation / dtype names given as strings
    ("megatron.bridge.utils.activation_map", "str_to_callable"),
    ("megatron.bridge.utils.activation_map", "str_to_dtype"),
)


@dataclass(frozen=True)
class Site:
    function: str  # qualified name in CONFIG_MODULE, e.g. "SchedulerConfig.finalize"
    lineno: int  # in the module's file
    kind: str  # "assert" or "raise"
    text: str  # normalized message (or "assert <condition>")
    module: str = CONFIG_MODULE  # the module whose source holds it

    @property
    def section(self) -> str:
        """The config section the site checks, as a user names it ('scheduler', 'train', ...)."""
        return section_of(self.function)


# The section each config class of the module is, in a ConfigContainer.
_SECTION_OF_CLASS = {
    "SchedulerConfig": "scheduler", "TrainingConfig": "train", "CheckpointConfig": "checkpoint",
    "LoggerConfig": "logger", "ProfilingConfig": "profiling", "TensorInspectConfig": "tensor_inspect",
    "NVRxStragglerDetectionConfig": "nvrx_straggler", "GPTDatasetConfig": "dataset",
    "MockGPTDatasetConfig": "dataset", "GPTFIMDatasetConfig": "dataset", "OptimizerConfig": "optimizer",
    "DistributedDataParallelConfig": "ddp", "DistributedInitConfig": "dist",
    # outside CONFIG_MODULE
    "TransformerConfig": "model", "ModelParallelConfig": "model", "PipelineParallelLayerLayout": "model",
    "MixedPrecisionConfig": "mixed_precision", "CommOverlapConfig": "comm_overlap",
}
_SECTION_OF_FUNCTION = {
    "apply_environment_variables": "env_vars", "_validate_and_apply_deterministic_mode": "deterministic mode",
    "_validate_and_apply_megatron_fsdp_configs": "megatron fsdp", "_validate_training_scheduler_compatibility":
    "train / scheduler", "_calculate_scheduler_steps": "scheduler", "_validate_cp_comm_type": "context parallel",
    "_validate_mixed_precision_consistency": "precision", "_validate_fine_grained_activation_offloading":
    "fine-grained activation offload", "_validate_hf_checkpoint_export_source": "checkpoint",
    "get_data_parallel_size": "parallelism", "_validate_and_sync_distributed_optimizer_settings": "optimizer / ddp",
    # outside CONFIG_MODULE
    "normalize_cuda_graph_modules": "model", "normalize_inference_cuda_graph_scope": "model",
    "validate_deprecated_cuda_graph_modules_migration_inputs": "model", "validate_cuda_graph_configuration": "model",
    "_validate_dsa_kernel_backend_dependencies": "model", "_enable_safe_hybridep_dispatch": "model",
    "get_mixed_precision_config": "mixed_precision", "str_to_callable": "model", "str_to_dtype": "model",
    "resolve_tensor_parallel_weight_shards": "model",
}


def section_of(function: str) -> str:
    cls, _, name = function.rpartition(".")
    if name in _SECTION_OF_FUNCTION:
        return _SECTION_OF_FUNCTION[name]
    return _SECTION_OF_CLASS.get(cls, "")


def normalize(node: ast.AST | None) -> str:
    """A message expression as text: string parts kept, formatted values as ``{}``, spaces collapsed."""
    if node is None:
        return ""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        text = node.value
    elif isinstance(node, ast.JoinedStr):
        text = "".join(v.value if isinstance(v, ast.Constant) else "{}" for v in node.values)
    elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        text = normalize(node.left) + normalize(node.right)
    elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "format":
        text = re.sub(r"\{[^}]*\}", "{}", normalize(node.func.value))
    else:
        text = "{}"
    return re.sub(r"\s+", " ", text).strip()


def site_text(node: ast.Assert | ast.Raise) -> str:
    if isinstance(node, ast.Assert):
        return normalize(node.msg) if node.msg is not None else f"assert {ast.unparse(node.test)}"
    exc = node.exc
    if isinstance(exc, ast.Call):
        name = ast.unparse(exc.func)
        return f"{name}: {normalize(exc.args[0]) if exc.args else ''}".rstrip(": ")
    return f"raise {ast.unparse(exc) if exc is not None else ''}".strip()


def message_pattern(text: str) -> re.Pattern[str]:
    """A site text as a pattern that matches the message upstream raises from it."""
    if text.startswith("assert "):
        return re.compile(r"\A\Z")  # a bare assert raises without a message: matched by line, not text
    body = text.split(": ", 1)[1] if re.match(r"^\w+: ", text) else text
    parts = [re.escape(p) for p in body.split("{}")]
    spaced = [re.sub(r"(\\ )+", r"\\s+", p) for p in parts]
    return re.compile(r"(?s)\s*" + r".*?".join(spaced))


@functools.lru_cache(maxsize=None)
def _module_tree(name: str = CONFIG_MODULE) -> tuple[ast.Module, str]:
    import importlib

    module = importlib.import_module(name)
    source = inspect.getsource(module)
    return ast.parse(source), inspect.getsourcefile(module) or ""


def _modules() -> tuple[str, ...]:
    return tuple(dict.fromkeys([CONFIG_MODULE, *(module for module, _ in EXTERNAL_ROOTS)]))


def _functions(tree: ast.Module) -> dict[str, ast.FunctionDef]:
    """Every function and method of the module by qualified name."""
    out = {}
    for node in tree.body:
        if isinstance(node, ast.FunctionDef):
            out[node.name] = node
        elif isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, ast.FunctionDef):
                    out[f"{node.name}.{item.name}"] = item
    return out


def _callees(qualname: str, fn: ast.FunctionDef, functions: dict[str, ast.FunctionDef],
             module: str = CONFIG_MODULE) -> set[str]:
    in_config = module == CONFIG_MODULE
    cls = qualname.rpartition(".")[0] or ("ConfigContainer" if in_config else "")
    classes = {name.partition(".")[0] for name in functions if "." in name}
    out = set()
    for node in ast.walk(fn):
        if not isinstance(node, ast.Call):
            continue
        f = node.func
        if isinstance(f, ast.Name) and f.id in functions:
            out.add(f.id)
        elif isinstance(f, ast.Name) and f.id in classes and f"{f.id}.__init__" in functions:
            out.add(f"{f.id}.__init__")  # Class(...) within the module
        elif isinstance(f, ast.Attribute):
            owners = ("self", "cfg", "config") if in_config else ("self", "cls")
            if isinstance(f.value, ast.Name) and f.value.id in owners:
                target = f"{cls if f.value.id in ('self', 'cls') else 'ConfigContainer'}.{f.attr}"
                if target in functions:
                    out.add(target)
            elif isinstance(f.value, ast.Name) and f.value.id in classes:
                if f"{f.value.id}.{f.attr}" in functions:
                    out.add(f"{f.value.id}.{f.attr}")
            elif in_config and f.attr == "finalize":  # self.<section>.finalize(): every section class
                out.update(name for name in functions if name.endswith(".finalize"))
    return out


def _walk(module: str, roots: tuple[str, ...]) -> dict[str, ast.FunctionDef]:
    """The functions of ``module`` reachable from ``roots`` through calls within the module."""
    tree, _ = _module_tree(module)
    functions = _functions(tree)
    seen, todo = set(), list(roots)
    while todo:
        name = todo.pop()
        if name in seen or name not in functions:
            continue
        seen.add(name)
        todo.extend(_callees(name, functions[name], functions, module) - seen)
    return {name: functions[name] for name in seen}


@functools.lru_cache(maxsize=None)
def walked_functions() -> dict[str, dict[str, ast.FunctionDef]]:
    """module -> the functions the walk reaches in it (for CONFIG_MODULE from ROOTS, else EXTERNAL_ROOTS)."""
    out = {CONFIG_MODULE: _walk(CONFIG_MODULE, ROOTS)}
    for module in _modules()[1:]:
        out[module] = _walk(module, tuple(name for m, name in EXTERNAL_ROOTS if m == module))
    return out


@functools.lru_cache(maxsize=None)
def upstream_sites() -> tuple[Site, ...]:
    """Every raise/assert site reachable from ROOTS (within CONFIG_MODULE) and EXTERNAL_ROOTS: those of
    CONFIG_MODULE first, in source order, then those of each other module."""
    sites = []
    for module, functions in walked_functions().items():
        found = []
        for name, fn in functions.items():
            for node in ast.walk(fn):
                if isinstance(node, (ast.Assert, ast.Raise)):
                    found.append(Site(name, node.lineno, "assert" if isinstance(node, ast.Assert) else "raise",
                                      site_text(node), module))
        sites.extend(sorted(found, key=lambda s: s.lineno))
    return tuple(sites)


def _module_of_file(filename: str) -> str | None:
    for module in _modules():
        if _module_tree(module)[1] == filename:
            return module
    return None


def site_at(filename: str, lineno: int) -> Site | None:
    """The site whose statement spans ``lineno`` of ``filename`` (a traceback frame)."""
    module = _module_of_file(filename) if filename else None
    if module is None:
        return None
    tree, _ = _module_tree(module)
    spans = {n.lineno: getattr(n, "end_lineno", n.lineno) for n in ast.walk(tree) if isinstance(n, (ast.Assert, ast.Raise))}
    for site in upstream_sites():
        if site.module == module and site.lineno <= lineno <= spans.get(site.lineno, site.lineno):
            return site
    return None


def site_for_message(message: str) -> Site | None:
    """The site whose message template matches ``message`` (when no traceback line is at hand)."""
    for site in upstream_sites():
        if not site.text.startswith("assert ") and message_pattern(site.text).match(message):
            return site
    return None


def function_at(filename: str, lineno: int) -> str | None:
    """The qualified name of the function holding ``lineno`` of ``filename``: any function of CONFIG_MODULE,
    a function the walk reaches in another module."""
    module = _module_of_file(filename) if filename else None
    if module is None:
        return None
    tree, _ = _module_tree(module)
    functions = _functions(tree) if module == CONFIG_MODULE else walked_functions()[module]
    for name, fn in functions.items():
        if fn.lineno <= lineno <= (fn.end_lineno or fn.lineno):
            return name
    return None


def describe_sites() -> str:  # for a person updating the site table after an upgrade
    return "\n".join(f"{s.module.rsplit('.', 1)[-1]:26} {s.lineno:5} {s.function:45} {textwrap.shorten(s.text, 100)}"
                     for s in upstream_sites())
