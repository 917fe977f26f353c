"""Property tests of apply_overrides on the seed's real config: whatever text a command line holds, the answer
is a new config or OverrideErrors (never another exception), the input config is unchanged either way, every
refusal quotes its override, names a key where there is one and gives a fix, and the refusals come in the
command's order."""

from __future__ import annotations

import copy
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).parent))  # tests are imported by path (--import-mode=importlib)
from cmdline_strategies import SEED, override_texts  # noqa: E402

SETTINGS = settings(max_examples=150, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

# Any character at all, control characters and other scripts included, with the grammar's own more often.
ANY_TEXT = st.text(alphabet=st.one_of(st.sampled_from("abc.=+~[]{}(),:'\"\\ $@/0129-_\t\n"), st.characters()),
                   max_size=30)


@pytest.fixture(scope="module")
def seed_config(built):
    return built(SEED)


def check(cfg, texts: list[str]) -> None:
    from mbridge_offload.describe import config_diff
    from overrides import OverrideErrors, apply_overrides

    before = copy.deepcopy(cfg)
    try:
        new = apply_overrides(cfg, texts)
    except OverrideErrors as errors:
        report = errors.format()
        assert errors.errors, texts
        assert [e.index for e in errors.errors] == sorted(e.index for e in errors.errors), report
        for error in errors.errors:
            assert error.message and error.fix, (texts, error.format())
            assert "\n" not in error.format().split("\n", 1)[0]  # the override's own line stays one line
        assert all(c.isprintable() or c == "\n" for c in report), repr(report)
    else:
        assert new is not cfg
    assert config_diff(before, cfg) == [], texts


@SETTINGS
@given(data=st.data())
def test_typed_overrides_never_raise_and_never_change_the_input(seed_config, config_keys, data):
    check(seed_config, data.draw(st.lists(override_texts(config_keys), max_size=4), label="overrides"))


@SETTINGS
@given(texts=st.lists(ANY_TEXT, max_size=4))
def test_any_text_never_raises_and_never_changes_the_input(seed_config, texts):
    check(seed_config, texts)


# ASCII characters of a key and the characters drawn like them that text pasted from a document or chat brings
LOOKALIKES = {"a": "\u0430", "e": "\u0435", "o": "\u043e", "p": "\u0440", "c": "\u0441", "x": "\u0445",
              "i": "\u0456", "s": "\u0455", ".": "\u2024", "_": None, "t": "\uff54", "n": "\uff4e"}
INVISIBLE = ("\u200b", "\u200d", "\u2060", "\ufeff", "\u00a0", "\u202e")


@SETTINGS
@given(data=st.data())
def test_a_look_alike_or_invisible_character_in_a_key_is_named_and_the_fix_is_the_override_in_ascii(seed_config,
                                                                                                      data):
    """Whatever key of the seed's config, one of its characters swapped for a character drawn like it (or an invisible
    one slipped in) is refused: the character is named by its code point and the fix is the override as meant."""
    from hypothesis import assume

    from overrides import OverrideErrors, apply_overrides
    from cmdline_strategies import HOT_KEYS

    key = data.draw(st.sampled_from(HOT_KEYS), label="key")
    meant = f"{key}=1"
    spots = [i for i, c in enumerate(key) if LOOKALIKES.get(c)]
    if data.draw(st.booleans(), label="invisible") or not spots:
        at = data.draw(st.integers(min_value=1, max_value=len(key)), label="at")
        char = data.draw(st.sampled_from(INVISIBLE), label="char")
        typed = key[:at] + char + key[at:] + "=1"
    else:
        at = data.draw(st.sampled_from(spots), label="at")
        char = LOOKALIKES[key[at]]
        typed = key[:at] + char + key[at + 1:] + "=1"
    assume(typed != meant)
    try:
        apply_overrides(seed_config, [typed])
    except OverrideErrors as errors:
        (error,) = errors.errors
        assert f"U+{ord(char):04X}" in error.message, error.format()
        assert error.fix.startswith(f"retype it in ASCII: {meant}"), error.format()
    else:
        raise AssertionError(f"{typed!r} was accepted")
