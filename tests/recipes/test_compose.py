"""Composition in Python: transforms are pure, state only their deltas, commute, log each change once."""

from __future__ import annotations

import copy
import logging

import pytest

from recipes import (with_activation_offload, with_fine_grained_offload, with_optimizer_offload,
                     without_optimizer_offload)
from mbridge_offload.describe import config_diff

DENSE = "qwen3_1b_proxy_pretrain_config"
MOE = "qwen3_30b_a3b_proxy_pretrain_config"


def test_transforms_never_mutate_their_argument(built):
    cfg = built(DENSE)
    before = copy.deepcopy(cfg)
    with_optimizer_offload(cfg, fraction=0.3, overlap=False)
    with_activation_offload(cfg, num_layers=4)
    with_fine_grained_offload(cfg, modules=["core_attn"])
    without_optimizer_offload(cfg)
    assert config_diff(before, cfg) == []


def test_each_transform_states_only_its_deltas(built):
    cfg = built(DENSE)
    changed = {key for key, _, _ in config_diff(cfg, with_optimizer_offload(cfg, fraction=0.25))}
    assert changed == {"optimizer.optimizer_cpu_offload", "optimizer.optimizer_offload_fraction"}
    changed = {key for key, _, _ in config_diff(cfg, with_optimizer_offload(cfg, fraction=0.25, overlap=True))}
    assert changed == {"optimizer.optimizer_cpu_offload", "optimizer.optimizer_offload_fraction",
                       "optimizer.overlap_cpu_optimizer_d2h_h2d"}
    changed = {key for key, _, _ in config_diff(cfg, with_activation_offload(cfg, num_layers=3))}
    assert changed == {"model.cpu_offloading", "model.cpu_offloading_num_layers"}
    changed = {key for key, _, _ in config_diff(cfg, with_fine_grained_offload(cfg, modules=["core_attn"]))}
    assert changed == {"model.fine_grained_activation_offloading", "model.offload_modules",
                       "env_vars.NVTE_CPU_OFFLOAD_V1"}


@pytest.mark.parametrize("name", [DENSE, MOE])
def test_transforms_commute(built, name):
    cfg = built(name)
    a = lambda c: with_optimizer_offload(c, fraction=0.75, overlap=True)  # noqa: E731
    b = lambda c: with_activation_offload(c, num_layers=1, weights=True)  # noqa: E731
    f = lambda c: with_fine_grained_offload(c, modules=["core_attn", "attn_proj"], fraction=0.5)  # noqa: E731
    assert config_diff(a(b(cfg)), b(a(cfg))) == []
    assert config_diff(a(f(cfg)), f(a(cfg))) == []
    assert config_diff(b(f(cfg)), f(b(cfg))) == []


def test_each_change_is_logged_once_in_words(built, caplog):
    cfg = built(DENSE)
    with caplog.at_level(logging.INFO, logger="mbridge_offload"):
        once = with_optimizer_offload(cfg, fraction=0.5, overlap=True)
        with_optimizer_offload(once, fraction=0.5, overlap=True)  # nothing changes: nothing logged
    lines = [r.getMessage() for r in caplog.records]
    assert lines == [
        "optimizer.optimizer_cpu_offload: False -> True (optimizer offload: 50% of optimizer states on the CPU)",
        "optimizer.optimizer_offload_fraction: 0.0 -> 0.5 (optimizer offload: 50% of optimizer states on the CPU)",
        "optimizer.overlap_cpu_optimizer_d2h_h2d: False -> True (optimizer offload: 50% of optimizer states on the CPU)",
    ]


def test_transform_arguments_are_checked_against_the_rule_table(built, caplog):
    cfg = built(DENSE)
    with caplog.at_level(logging.INFO, logger="mbridge_offload"):
        with pytest.raises(ValueError, match="optimizer.optimizer_offload_fraction=1.5: must be a number from 0 to 1"):
            with_optimizer_offload(cfg, fraction=1.5)
        with pytest.raises(ValueError, match=r"0 <= cpu_offloading_num_layers < model.num_layers"):
            with_activation_offload(cfg, num_layers=16)
        with pytest.raises(ValueError, match="each module must be one of"):
            with_fine_grained_offload(cfg, modules=["expert_fc2"])
    assert caplog.records == []  # a refused transform logs nothing
    with pytest.raises(TypeError):
        with_optimizer_offload(cfg, fraction="0.5")
    with pytest.raises(TypeError):
        with_fine_grained_offload(cfg, modules="expert_fc1")
    assert with_activation_offload(cfg, num_layers=15).model.cpu_offloading_num_layers == 15


def test_sweep_in_python(built):
    """Users sweep fractions by composing: every config differs from the base only in the fraction."""
    base = built(DENSE)
    configs = {f: with_optimizer_offload(base, fraction=f) for f in (0.25, 0.5, 0.75, 1.0)}
    for fraction, cfg in configs.items():
        assert cfg.optimizer.optimizer_offload_fraction == fraction
    assert base.optimizer.optimizer_cpu_offload is False


def test_readme_python_example_runs(capsys):
    """The README's composition example, executed as written."""
    import re
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    example = re.findall(r"```python\n(.*?)```", readme, re.S)[0]
    namespace: dict = {}
    exec(compile(example, "README.md", "exec"), namespace)  # noqa: S102
    assert "Validation for 1 GPU: OK" in capsys.readouterr().out
    assert namespace["moe"].model.fine_grained_activation_offloading
    assert sorted(namespace["sweep"]) == [0.25, 0.5, 0.75, 1.0]


def test_transform_switches_must_be_booleans(built):
    """``bool("false")`` is True: a string switch is refused by name, never read as on."""
    cfg = built(DENSE)
    with pytest.raises(TypeError, match="overlap must be True or False, got 'no'"):
        with_optimizer_offload(cfg, fraction=0.5, overlap="no")
    with pytest.raises(TypeError, match="weights must be True or False, got 'false'"):
        with_activation_offload(cfg, num_layers=2, weights="false")
    with pytest.raises(TypeError, match="modules must be a list of module names"):
        with_fine_grained_offload(cfg, modules=None)
    with pytest.raises(TypeError, match=r"got \[1\]"):
        with_fine_grained_offload(cfg, modules=[1])


def test_transform_takes_numpy_numbers_as_python_ones(built):
    import numpy as np

    layers = with_activation_offload(built(DENSE), num_layers=np.int64(2)).model.cpu_offloading_num_layers
    assert layers == 2 and type(layers) is int


def test_transform_of_a_registry_entry_says_to_build_it(built):
    from recipes import get_recipe

    entry = get_recipe(DENSE)
    with pytest.raises(TypeError, match=rf"got Recipe .*get_recipe\('{DENSE}'\)\.build\(\)"):
        with_optimizer_offload(entry, fraction=0.5)
    with pytest.raises(TypeError, match="got NoneType"):
        with_activation_offload(None, num_layers=1)


def test_numpy_bools_are_switches_and_an_engine_is_named_by_a_string(built):
    """A comparison of arrays gives numpy's bool, which means what True means; an engine given as anything but its
    name is refused naming the argument (it was Python's 'unhashable type: list')."""
    import numpy as np

    from recipes import with_offload_engine

    cfg = built(DENSE)
    assert with_optimizer_offload(cfg, fraction=0.5, overlap=np.bool_(True)).optimizer.overlap_cpu_optimizer_d2h_h2d
    with pytest.raises(TypeError, match=r"mode must be the name of an offload engine, one of .*got \['exact'\]"):
        with_offload_engine(cfg, ["exact"])
    with pytest.raises(TypeError, match="overlap must be True or False"):
        with_optimizer_offload(cfg, fraction=0.5, overlap=np.int64(1))


def test_a_recipe_function_passed_uncalled_is_told_to_be_called():
    from recipes import get_recipe
    from recipes.qwen3_dense import qwen3_0p6b_pretrain_config

    with pytest.raises(TypeError, match=r"qwen3_0p6b_pretrain_config is the recipe function, call it first: "
                                        r"qwen3_0p6b_pretrain_config\(\)"):
        with_optimizer_offload(qwen3_0p6b_pretrain_config, fraction=0.5)
    with pytest.raises(TypeError, match=rf"call it first: get_recipe\('{DENSE}'\)\.build\(\)"):
        with_activation_offload(get_recipe(DENSE).build, num_layers=2)
