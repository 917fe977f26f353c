"""The one walker over a config's keys: sections before their keys, a depth limit, dicts entered only
where asked, ``_``-prefixed fields only when asked."""

from __future__ import annotations

from dataclasses import dataclass, field

from mbridge_offload.facts.config_tree import walk


@dataclass
class Inner:
    size: int = 1
    deeper: dict = field(default_factory=lambda: {"x": {"y": 1}})


@dataclass
class Root:
    inner: Inner = field(default_factory=Inner)
    env_vars: dict = field(default_factory=lambda: {"A": "1"})
    _state: int = 0


def test_sections_come_before_their_keys_and_private_fields_only_when_asked():
    assert list(walk(Root(), levels=4)) == [
        ("inner", Inner(), True), ("inner.size", 1, False), ("inner.deeper", {"x": {"y": 1}}, True),
        ("inner.deeper.x", {"y": 1}, True), ("inner.deeper.x.y", 1, False),
        ("env_vars", {"A": "1"}, True), ("env_vars.A", "1", False)]
    assert "_state" in [key for key, _, _ in walk(Root(), levels=1, private=True)]


def test_levels_cut_the_depth_and_into_dict_chooses_the_dicts():
    keys = [key for key, _, _ in walk(Root(), levels=2, into_dict=lambda key: key == "env_vars")]
    assert keys == ["inner", "inner.size", "inner.deeper", "env_vars", "env_vars.A"]
    assert [(key, section) for key, _, section in walk(Root(), levels=1)] == [("inner", False), ("env_vars", False)]
