"""Answers at the speed of typing: override errors, rule problems and dry runs from a cache, without
importing Megatron Bridge (~35 s on two cores) when the answer does not need it.

The first command that builds a recipe stores a snapshot of its built config (``snapshot``: plain data,
rebuilt as look-alike dataclasses) and every full validation it runs (``store``: keyed by the installed
versions, the plugin's sources, the config's values, the GPU count and the environment). A later command
with the same recipe then runs ``prepare`` on the look-alike:

- an override that cannot be applied is refused at once, in the same words;
- a config that breaks a rule of the table is refused at once (upstream ``validate()`` is the only check
  not run then, and is said so);
- a config whose full validation is cached gets the whole answer (dry run, plan) from the cache;
- anything else (a valid config never validated before, an override the snapshot cannot answer exactly,
  a launch) takes the slow path, which fills the cache.

``prepare_fast`` and ``recording`` are the two call sites (the commands of mbridge_offload/cli use them).
"""

from __future__ import annotations

import contextlib
import copy
import os
import sys
import types
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Mapping, Sequence

from mbridge_offload.fast_check import store
from mbridge_offload.fast_check.snapshot import answerable

PARTIAL_NOTE = ("(answered from the cache of this recipe in {seconds:.1f} s without loading Megatron Bridge: the "
                "problems above refuse the command already, so Megatron Bridge's own ConfigContainer.validate() "
                "was not run; it runs once they are fixed)")


SLOW_PARTIAL_NOTE = ("(Megatron Bridge's own ConfigContainer.validate() was not run: sizes above are out of their "
                     "ranges, and its own arithmetic divides by them; it runs once they are fixed)")


@dataclass
class FastAnswer:
    prepared: Any = None  # a Prepared (mbridge_offload/prepare.py), its report from the cache or the rules
    refusal: Any = None  # or the NotPrepared the command line gives
    complete: bool = True  # False: the rule table only (upstream validate() not run; the answer is a refusal)


class _CachedRecipe:
    """A registry Recipe whose build() hands out the cached look-alike."""

    def __init__(self, recipe: Any, base: Any):
        self._recipe, self._base = recipe, base
        self.name, self.module, self.num_gpus = recipe.name, recipe.module, recipe.num_gpus
        self.summary = getattr(recipe, "summary", "")

    def build(self) -> Any:
        return copy.deepcopy(self._base)


class _RecordingRecipe(_CachedRecipe):
    """The real recipe, whose built config is stored for the next command."""

    def __init__(self, recipe: Any):
        super().__init__(recipe, None)

    def build(self) -> Any:
        cfg = self._recipe.build()
        store.store_base(self.name, cfg)
        return cfg


class _Validator:
    """``validate`` for prepare: a cached full validation where there is one; else (fast) the rule table
    alone, marked partial, or (recording) the full validation, stored. Upstream ``validate()`` is not run on
    sizes out of their ranges (its own arithmetic divides by them; the rule table reports them), and an
    exception out of it becomes a problem of the report, never a traceback."""

    def __init__(self, real, record: bool):
        self.real, self.record, self.partial = real, record, False

    def _rules_only(self, cfg: Any, num_gpus: int, environ: Mapping[str, str] | None, kwargs: dict):
        self.partial = True
        return self.real(cfg, num_gpus, environ, **{**kwargs, "upstream": False})

    def __call__(self, cfg: Any, num_gpus: int, environ: Mapping[str, str] | None = None, **kwargs: Any):
        from mbridge_offload.facts.key_ranges import grid_sane, is_count
        from mbridge_offload.validation import Problem, Report

        if kwargs.get("upstream", True) is False:
            return self.real(cfg, num_gpus, environ, **kwargs)
        if not (is_count(num_gpus, 1) and grid_sane(cfg)):
            return self._rules_only(cfg, num_gpus, environ, kwargs)
        env = dict(store.START_ENVIRON if environ is None else environ)
        # the keys the command line gave change the answer (a value given at its default): they are in the key
        key = store.validation_key(cfg, num_gpus, env, kwargs.get("given_keys", frozenset()))
        if not self.record:
            cached = store.load_validation(key)
            if cached is not None:
                return Report(num_gpus=num_gpus, problems=tuple(cached))
            return self._rules_only(cfg, num_gpus, environ, kwargs)
        try:
            report = self.real(cfg, num_gpus, environ, **kwargs)
        except Exception as error:  # noqa: BLE001 - said in the report, with the rule table's own problems
            report = self._rules_only(cfg, num_gpus, environ, kwargs)
            return Report(num_gpus=num_gpus, problems=report.problems + (Problem(
                key="(Megatron Bridge validate())", value=type(error).__name__,
                rule=f"ConfigContainer.validate() raised {type(error).__name__}: {str(error)[:300]}",
                fix="fix the problems above first; if none is listed, report this with the command line",
                severity="error", source="upstream"),))
        store.store_validation(key, report.problems)
        return report


@contextlib.contextmanager
def _standing_in(module: types.ModuleType) -> Iterator[None]:
    """``module`` importable under its name while the fast path runs, removed afterwards (unless the real
    module replaced it meanwhile)."""
    sys.modules[module.__name__] = module
    try:
        yield
    finally:
        if sys.modules.get(module.__name__) is module:
            del sys.modules[module.__name__]


PRESETS_MODULE = "megatron.bridge.training.mixed_precision"


@contextlib.contextmanager
def _cached_presets(presets: dict[str, Any] | None) -> Iterator[None]:
    """While the fast path runs: rules that resolve ``mixed_precision=NAME`` (``get_mixed_precision_config``)
    get the preset from the cache instead of importing Megatron Bridge for it. The stand-in module holds
    exactly the presets the installed Megatron Bridge built (the cache key has its version)."""
    if presets is None or PRESETS_MODULE in sys.modules:
        yield
        return
    module = types.ModuleType(PRESETS_MODULE)
    module.__doc__ = "Megatron Bridge's mixed-precision presets, from mbridge_offload's cache."

    def get_mixed_precision_config(name: Any) -> Any:
        if not isinstance(name, str):
            return name
        name = name.replace("-", "_")
        if name not in presets:
            valid = ", ".join(sorted(presets))
            raise ValueError(f"Unknown mixed-precision recipe '{name}'. Available recipes: {valid}.")
        return copy.deepcopy(presets[name])

    module.get_mixed_precision_config = get_mixed_precision_config  # type: ignore[attr-defined]
    module.MIXED_PRECISION_RECIPES = {name: (lambda n=name: get_mixed_precision_config(n))  # type: ignore[attr-defined]
                                      for name in presets}
    with _standing_in(module):
        yield


CUDA_GRAPH_MODULE = "megatron.bridge.utils.cuda_graph"


@contextlib.contextmanager
def _cuda_graph_shim() -> Iterator[None]:
    """While the fast path runs: ``is_full_iteration_cuda_graph(config)`` answered without importing Megatron
    Core where upstream's own first lines decide it (``cuda_graph_impl`` other than ``local``); for ``local``
    the real function answers (imported then)."""
    if CUDA_GRAPH_MODULE in sys.modules:
        yield
        return
    module = types.ModuleType(CUDA_GRAPH_MODULE)

    def is_full_iteration_cuda_graph(config: Any) -> bool:
        impl = getattr(config, "cuda_graph_impl", "none")
        if impl == "full_iteration":
            return True
        if impl != "local":
            return False
        del sys.modules[CUDA_GRAPH_MODULE]
        import importlib

        return importlib.import_module(CUDA_GRAPH_MODULE).is_full_iteration_cuda_graph(config)

    module.is_full_iteration_cuda_graph = is_full_iteration_cuda_graph  # type: ignore[attr-defined]
    with _standing_in(module):
        yield


def prepare_fast(recipe: Any, overrides: Sequence[str], **kwargs: Any) -> FastAnswer | None:
    """``prepare(recipe, overrides, **kwargs)`` answered from the cache, or None when the cache cannot
    answer it exactly (then call prepare within ``recording``)."""
    if not store.enabled():
        return None
    cached = store.load_base(recipe.name)
    if cached is None:
        return None
    base, presets = cached
    from overrides.grammar import key_of
    from mbridge_offload.facts.import_notices import quiet_import_notices
    from mbridge_offload.planning import AUTO_OVERRIDE

    quiet_import_notices()  # what the look-alike's validation and what_would_fit import may print otherwise

    if not all(answerable(base, key_of(o)) for o in overrides if o != AUTO_OVERRIDE):
        return None
    import mbridge_offload.prepare as prepare_module
    from mbridge_offload.validation import validate

    validator = _Validator(validate, record=False)
    try:
        with _cached_presets(presets), _cuda_graph_shim():
            prepared = prepare_module.prepare(_CachedRecipe(recipe, base), overrides, validator=validator, **kwargs)
    except prepare_module.NotPrepared as refusal:
        return FastAnswer(refusal=refusal, complete=not validator.partial)
    except Exception:  # noqa: BLE001 - whatever the look-alike cannot do, the real config answers
        return None
    if validator.partial and prepared.report.ok:
        return None  # the rules pass: only upstream validate() can tell, and it needs Megatron
    return FastAnswer(prepared=prepared, complete=not validator.partial)


@contextlib.contextmanager
def recording(recipe: Any) -> Iterator[Any]:
    """Around the slow path's prepare: yields the recipe to hand it, with the validator to pass it
    (``prepare(building, ..., validator=building.validator)``; its ``partial`` says whether upstream validate()
    was left out); stores its built config and every full validation that validator runs, for the next
    command."""
    from mbridge_offload.validation import validate

    building = _RecordingRecipe(recipe)
    building.validator = _Validator(validate, record=True)
    yield building


def override_errors(recipe: Any, overrides: Sequence[str], build: bool = False, cached_first: bool = True,
                    before_build: Callable[[], None] | None = None) -> str | None:
    """For commands that start trainings (sweeps, benchmarks): the refusal of overrides that cannot be
    applied to the recipe, from the cache; None when they apply. Without a cached recipe (or with
    ``cached_first`` False): None, or with ``build`` the recipe is built here (loading Megatron Bridge once, and
    filling the cache). Anything else the overrides raise is refused too, in one line, rather than let the runs
    start and each fail on it. ``before_build`` runs just before the recipe is built here (what can be said
    without it, at once)."""
    if not overrides:
        return None
    cached = store.load_base(recipe.name) if store.enabled() and cached_first else None
    real = False
    if cached is None and build:
        from mbridge_offload.facts.import_notices import quiet_import_notices

        if before_build is not None:
            before_build()
        quiet_import_notices()
        built = recipe.build()
        store.store_base(recipe.name, built)
        cached, real = (built, None), True
    if cached is None:
        return None
    base = cached[0]
    from overrides import OverrideErrors, apply_overrides
    from overrides.grammar import key_of

    if not real and not all(answerable(base, key_of(o)) for o in overrides):
        return None  # the look-alike cannot answer these exactly (the real config can)
    try:
        apply_overrides(base, list(overrides))
    except OverrideErrors as errors:
        return errors.format()
    except Exception as error:  # noqa: BLE001
        if not real:  # the look-alike failed where the real config may not: ask it, when this command may build it
            return (override_errors(recipe, overrides, build=True, cached_first=False, before_build=before_build)
                    if build else None)
        # the real config failed outside the override errors: a fault, said before any training starts
        return (f"the overrides could not be applied to {recipe.name} ({type(error).__name__}: {error}); "
                f"run_recipe.py --recipe {recipe.name} --dry-run with the same overrides shows the same")
    return None
