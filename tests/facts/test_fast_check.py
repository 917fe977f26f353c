"""The fast path (mbridge_offload/fast_check): a recipe's snapshot answers exactly as the real config does,
the cache is keyed by everything that could change an answer (never stale), and run_recipe's dry run and
refusals from the cache print what the slow path prints."""

from __future__ import annotations

import contextlib
import dataclasses
import io
import sys

import pytest

from recipes import registry
from mbridge_offload.fast_check import snapshot, store
from mbridge_offload.validation import installed
from mbridge_offload.validation.installed import DeviceFacts, Gpu, MachineFacts

OVERRIDES = (
    ["optimizer.optimizer_offload_fraction=1.5"], ["optimizer.optimizer_ofload_fraction=0.5"],
    ["model.num_layers=abc", "train.micro_batch_size=0"], ["+model.foo=1"], ["~model.num_layers"],
    ["++env_vars.NVTE_CPU_OFFLOAD_V1=1"], ["model.offload_modules=[expert_fc1,bogus]"],
    ["model.recompute_granularity=full", "model.cpu_offloading=True"], ["train.global_batch_size=null"],
    ["optimizer.optimizer_cpu_offload=maybe"], ["model.tensor_model_parallel_size=0"],
)


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MBRIDGE_OFFLOAD_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("MBRIDGE_OFFLOAD_NO_CACHE", raising=False)
    return tmp_path / "cache"


def _outcome(cfg, overrides):
    from overrides import OverrideErrors, apply_overrides

    try:
        return apply_overrides(cfg, overrides)
    except OverrideErrors as errors:
        return errors.format()


@pytest.mark.parametrize("name", [r.name for r in registry.RECIPES])
def test_snapshot_answers_as_the_real_config(built, name):
    from mbridge_offload.describe import offload_summary, topology
    from mbridge_offload.planning import format_plan, plan_with_recommendation
    from mbridge_offload.validation import validate

    real = built(name)
    look_alike = snapshot.load(snapshot.dump(real))
    assert snapshot.fingerprint(look_alike) == snapshot.fingerprint(real)
    gpus = registry.get(name).num_gpus
    assert validate(look_alike, gpus, environ={}, upstream=False) == validate(real, gpus, environ={}, upstream=False)
    assert format_plan(plan_with_recommendation(look_alike, gpus)) == format_plan(plan_with_recommendation(real, gpus))
    assert (offload_summary(look_alike), topology(look_alike, gpus)) == (offload_summary(real), topology(real, gpus))
    for overrides in OVERRIDES:
        if not all(snapshot.answerable(look_alike, o.lstrip("+~").split("=")[0]) for o in overrides):
            continue
        a, b = _outcome(real, overrides), _outcome(look_alike, overrides)
        if isinstance(a, str) or isinstance(b, str):
            assert a == b, overrides
        else:
            assert snapshot.fingerprint(a) == snapshot.fingerprint(b), overrides


def test_what_the_snapshot_cannot_answer_takes_the_slow_path(built):
    look_alike = snapshot.load(snapshot.dump(built("qwen3_1b_proxy_pretrain_config")))
    assert not snapshot.answerable(look_alike, "model.params_dtype")  # a torch dtype
    assert not snapshot.answerable(look_alike, "model.init_method")  # a function
    assert snapshot.answerable(look_alike, "model.no_such_key")  # an unknown key: the same refusal
    assert snapshot.answerable(look_alike, "optimizer.optimizer_offload_fraction")


def test_the_cache_is_keyed_by_versions_and_sources(cache, built, monkeypatch, tmp_path):
    name = "qwen3_1b_proxy_pretrain_config"
    store.stack_key.cache_clear()
    store.store_base(name, built(name))
    assert store.load_base(name) is not None
    # another installed version: another key, nothing found
    real_versions = store._versions
    monkeypatch.setattr(store, "_versions", lambda: real_versions() + ["megatron-core==99"])
    store.stack_key.cache_clear()
    assert store.load_base(name) is None
    monkeypatch.setattr(store, "_versions", real_versions)
    store.stack_key.cache_clear()
    assert store.load_base(name) is not None
    # a changed source of the plugin: another key
    source = tmp_path / "src"
    (source / "recipes").mkdir(parents=True)
    (source / "recipes" / "a.py").write_text("x = 1\n")
    monkeypatch.setattr(store, "ROOT", source)
    monkeypatch.setattr(store, "SOURCES", ("recipes",))
    store.stack_key.cache_clear()
    before = store.stack_key()
    (source / "recipes" / "a.py").write_text("x = 2\n")
    store.stack_key.cache_clear()
    assert store.stack_key() != before
    store.stack_key.cache_clear()


def test_validation_is_keyed_by_values_gpus_and_environment(built):
    cfg = built("qwen3_1b_proxy_pretrain_config")
    key = store.validation_key(cfg, 1, {"A": "1"})
    assert key == store.validation_key(cfg, 1, {"A": "1", "PWD": "/elsewhere"})
    assert key != store.validation_key(cfg, 2, {"A": "1"})
    assert key != store.validation_key(cfg, 1, {"A": "2"})
    from overrides import apply_overrides

    assert key != store.validation_key(apply_overrides(cfg, ["train.train_iters=7"]), 1, {"A": "1"})
    resumed = apply_overrides(cfg, ["checkpoint.load=/some/where"])
    assert store.validation_key(resumed, 1, {"A": "1"}) is None  # reads files: never cached


_H100 = Gpu(name="NVIDIA H100 80GB HBM3", memory_bytes=85_520_809_984, capability=(9, 0))
# device facts a validation may be run under: each pair differs in one thing the validator reads of the GPU
DEVICES = {
    "no GPU (a login node)": DeviceFacts(),
    "no GPU, CUDA build of PyTorch": DeviceFacts(torch_cuda="12.8"),
    "H100": DeviceFacts(gpus=(_H100,), driver="550.54.15", torch_cuda="12.8"),
    "H100, another driver": DeviceFacts(gpus=(_H100,), driver="570.86.10", torch_cuda="12.8"),
    "H100, CPU build of PyTorch": DeviceFacts(gpus=(_H100,), driver="550.54.15"),
    "two H100": DeviceFacts(gpus=(_H100, _H100), driver="550.54.15", torch_cuda="12.8"),
    "H100 94 GB": DeviceFacts(gpus=(Gpu(name="NVIDIA H100 NVL", memory_bytes=100_485_038_080, capability=(9, 0)),),
                              driver="550.54.15", torch_cuda="12.8"),
    "H200": DeviceFacts(gpus=(Gpu(name="NVIDIA H200", memory_bytes=150_754_820_096, capability=(9, 0)),),
                        driver="550.54.15", torch_cuda="12.8"),
    "A100": DeviceFacts(gpus=(Gpu(name="NVIDIA A100-SXM4-80GB", memory_bytes=85_899_345_920, capability=(8, 0)),),
                        driver="550.54.15", torch_cuda="12.8"),
    "same name, another capability": DeviceFacts(gpus=(Gpu(name="NVIDIA H100 80GB HBM3", memory_bytes=85_520_809_984,
                                                           capability=(10, 0)),), driver="550.54.15", torch_cuda="12.8"),
}


def test_a_cached_validation_is_keyed_by_the_machines_gpus(built):
    """A cache in a home directory shared by a login node and a GPU node: a validation on one never answers the other
    (the validator's GPU checks, env/flex-dispatcher-gpu-unchecked among them, answer differently there)."""
    cfg = built("qwen3_1b_proxy_pretrain_config")
    modules = installed.importable_modules()
    keys = {name: store.validation_key(cfg, 1, {}, machine=MachineFacts(devices=devices, modules=modules))
            for name, devices in DEVICES.items()}
    assert None not in keys.values()
    assert len(set(keys.values())) == len(keys), keys


def test_a_cached_validation_is_keyed_by_what_this_machine_has(built):
    """Without a machine stated, the key reads this machine's facts with the validator's own function: the same key
    as those facts stated, another key for any other GPU or another package importable."""
    cfg = built("qwen3_1b_proxy_pretrain_config")
    here = installed.machine_facts()
    assert store.validation_key(cfg, 1, {}) == store.validation_key(cfg, 1, {}, machine=here)
    another_gpu = dataclasses.replace(here, devices=dataclasses.replace(here.devices,
                                                                        gpus=here.devices.gpus + (_H100,)))
    assert store.validation_key(cfg, 1, {}) != store.validation_key(cfg, 1, {}, machine=another_gpu)
    folder, names = here.modules[0]
    apex_installed = dataclasses.replace(here, modules=((folder, tuple(sorted(
        names + ("apex-0.1.dist-info", "fused_weight_gradient_mlp_cuda.cpython-312-x86_64-linux-gnu.so")))),
        *here.modules[1:]))
    assert store.validation_key(cfg, 1, {}) != store.validation_key(cfg, 1, {}, machine=apex_installed)


def test_the_machines_facts_are_read_without_pytorch():
    """The fast path answers without importing PyTorch (~3 s): the device facts come from the driver's library and
    the installed torch/version.py, in a fresh interpreter."""
    import subprocess
    import sys

    code = ("import sys; from mbridge_offload.validation.installed import machine_facts; f = machine_facts(); "
            "assert 'torch' not in sys.modules, 'torch imported'; "
            "assert f.modules and all(isinstance(g.name, str) for g in f.devices.gpus); print(f.devices)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=store.ROOT, timeout=60)
    assert done.returncode == 0, done.stderr
    import torch

    assert done.stdout.strip().endswith(f"torch_cuda='{torch.version.cuda or ''}')")


def _run(argv):
    from mbridge_offload.cli.run_recipe import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            rc = main(argv)
        except SystemExit as stop:
            rc = stop.code
    return rc, out.getvalue(), err.getvalue()


def test_dry_run_from_the_cache_prints_what_the_slow_path_prints(cache, monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    store.stack_key.cache_clear()
    argv = ["--recipe", "qwen3_30b_a3b_pretrain_config", "--dry-run", "optimizer.optimizer_offload_fraction=0.75"]
    rc1, out1, err1 = _run(argv)  # builds, validates, fills the cache
    assert rc1 == 0 and "built and validated" in err1
    rc2, out2, err2 = _run(argv)
    assert (rc2, out2) == (rc1, out1) and "answered from the cache" in err2
    # a refusal: at once, naming the key
    rc3, out3, err3 = _run(argv[:3] + ["optimizer.optimizer_ofload_fraction=0.5"])
    assert rc3 == 2 and "optimizer.optimizer_ofload_fraction" in out3 + err3
    assert "did you mean optimizer.optimizer_offload_fraction" in out3 + err3
    rc4, out4, err4 = _run(argv[:3] + ["-tp", "0"])
    assert rc4 == 2 and "model.tensor_model_parallel_size" in out4 and "Traceback" not in err4


def test_no_cache_when_turned_off(cache, monkeypatch, built):
    monkeypatch.setenv("MBRIDGE_OFFLOAD_NO_CACHE", "1")
    store.store_base("qwen3_1b_proxy_pretrain_config", built("qwen3_1b_proxy_pretrain_config"))
    assert store.load_base("qwen3_1b_proxy_pretrain_config") is None
    assert not cache.exists()


@pytest.mark.parametrize("cached", [False, True])
def test_overrides_that_fail_outside_the_override_errors_are_refused_before_any_training(cache, monkeypatch, cached):
    """A fault of apply_overrides (here made to raise what is not an OverrideErrors) is refused in one line that
    names it, from the real config or after the look-alike's failure sent the check to it: the sweeping commands
    must not start runs that would each fail on it."""
    import overrides.apply
    from mbridge_offload import fast_check

    recipe = registry.get("qwen3_1b_proxy_pretrain_config")
    if cached:
        assert fast_check.override_errors(recipe, ["train.train_iters=5"], build=True) is None  # fills the cache
        assert store.load_base(recipe.name) is not None

    def faulty(config, overrides):
        raise RuntimeError("a fault in the override layer")

    monkeypatch.setattr(overrides.apply, "apply_overrides", faulty)
    message = fast_check.override_errors(recipe, ["train.train_iters=5"], build=True)
    assert message and "RuntimeError: a fault in the override layer" in message and "--dry-run" in message
    # without leave to build the real config, the look-alike's failure answers nothing: each run validates itself
    assert fast_check.override_errors(recipe, ["train.train_iters=5"], build=False) is None


def test_validation_is_keyed_by_the_keys_the_command_line_gave(built):
    """The same values from another command line may be another answer (a key given at its default, that the preset
    replaces, is refused): the keys given are part of a validation's key."""
    cfg = built("qwen3_1b_proxy_pretrain_config")
    key = store.validation_key(cfg, 1, {})
    assert key == store.validation_key(cfg, 1, {}, frozenset())
    assert key != store.validation_key(cfg, 1, {}, frozenset({"model.fp8_recipe"}))


def test_the_fast_path_refuses_a_key_given_at_the_default_that_the_recipes_preset_replaces(cache, built):
    """A recipe of the user's own with an FP8 preset (composed in Python): its validation, cached by a dry run without
    overrides, is not the answer for model.fp8_recipe=delayed (the same values, given on the command line). The fast
    path refuses it as the slow path does."""
    import copy

    from mbridge_offload import fast_check
    from mbridge_offload.prepare import prepare

    class Fp8Recipe:
        name, module, num_gpus, summary = "dense_proxy_fp8_current_scaling", "tests", 1, ""

        def build(self):
            cfg = copy.deepcopy(built("qwen3_1b_proxy_pretrain_config"))
            cfg.mixed_precision = "bf16_with_fp8_current_scaling_mixed"
            return cfg

    recipe, given = Fp8Recipe(), ["model.fp8_recipe=delayed"]
    options = dict(num_gpus=1, num_gpus_from="the recipe's GPU count", plan_options={}, offload_tuning="stock")
    store.stack_key.cache_clear()
    with fast_check.recording(recipe) as building:
        assert prepare(building, [], validator=building.validator, **options).report.ok  # cached, validation too
    cached = fast_check.prepare_fast(recipe, [], **options)
    assert cached is not None and cached.complete and cached.prepared.report.ok
    fast = fast_check.prepare_fast(recipe, given, **options)
    assert fast is not None and fast.refusal is None
    assert [p.rule_id for p in fast.prepared.report.errors] == ["precision/preset-replaces-fp8-recipe"]
    with fast_check.recording(recipe) as building:
        slow = prepare(building, given, validator=building.validator, **options)
    assert slow.report.errors == fast.prepared.report.errors


def test_the_packages_importable_do_not_change_when_python_writes_its_bytecode(tmp_path, monkeypatch):
    """A fresh environment's first import writes site-packages/__pycache__: the next command must get the same key
    (else it never finds the checking worker the first one started), while a package installed changes it."""
    (tmp_path / "pkg-1.0.dist-info").mkdir()
    (tmp_path / "pkg").mkdir()
    (tmp_path / "single_module.py").write_text("")
    monkeypatch.setattr(sys, "path", [str(tmp_path)])

    def listing():
        installed.importable_modules.cache_clear()
        try:
            return installed.importable_modules()
        finally:
            installed.importable_modules.cache_clear()

    before = listing()
    (tmp_path / "__pycache__").mkdir()
    (tmp_path / ".lock_dir").mkdir()
    assert listing() == before
    (tmp_path / "other-2.0.dist-info").mkdir()
    (tmp_path / "other").mkdir()
    assert listing() != before


def test_the_packages_importable_do_not_change_when_a_package_puts_its_vendored_copies_on_sys_path(tmp_path,
                                                                                                   monkeypatch):
    """Importing setuptools puts setuptools/_vendor (with .dist-info folders of its own) on sys.path: a process that
    imported it and one that did not must key the same installation alike, or the command never finds the worker
    (and a validation cached by one is never found by the other)."""
    site = tmp_path / "site-packages"
    vendored = site / "setuptools" / "_vendor"
    (site / "setuptools-80.0.dist-info").mkdir(parents=True)
    (vendored / "packaging-24.2.dist-info").mkdir(parents=True)
    (vendored / "packaging").mkdir()
    project = tmp_path  # the working folder (or an editable project) above the installation: not one itself

    def listing(path):
        monkeypatch.setattr(sys, "path", [str(p) for p in path])
        installed.importable_modules.cache_clear()
        try:
            return installed.importable_modules()
        finally:
            installed.importable_modules.cache_clear()

    before = listing([project, site])
    assert [folder for folder, _ in before] == [str(site.resolve())]
    assert listing([project, site, vendored]) == before
    (site / "other-1.0.dist-info").mkdir()
    assert listing([project, site, vendored]) != before
