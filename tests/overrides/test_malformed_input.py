"""Malformed overrides the grammar tests did not show: each is refused (never a traceback) with the override,
its key, what is wrong and a fix; the refusals of one command come together, in its order; the input config
is never changed. Real recipe configs throughout."""

from __future__ import annotations

import contextlib
import copy
import io
import tempfile
from pathlib import Path

import pytest

from overrides import OverrideErrors, apply_overrides
from mbridge_offload.describe import config_diff

DENSE = "qwen3_1b_proxy_pretrain_config"


@pytest.fixture(scope="module")
def dense(built):
    return built(DENSE)


def refusal(cfg, texts):
    """The OverrideErrors of ``texts`` on ``cfg``, checking that ``cfg`` is left as it was."""
    before = copy.deepcopy(cfg)
    with pytest.raises(OverrideErrors) as caught:
        apply_overrides(cfg, texts)
    assert config_diff(before, cfg) == []
    return caught.value


# Each: the override(s), a word of the message, a word of the fix. Several crashed (a Hydra exception out of
# apply_overrides: interval(), glob()), were applied although malformed (checkpoint.save= as an empty path,
# ${...} kept unresolved, shuffle()'s random order) or were refused with a misleading fix.
MALFORMED = {
    "optimizer.lr=interval(0,1)": ("sweep", "single value"),
    "optimizer.lr=glob(*)": ("sweep", "single value"),
    "model.offload_modules=shuffle([core_attn,moe_act])": ("random order", "model.offload_modules=[a,b]"),
    "checkpoint.save=${oc.env:HOME}": ("interpolation", "checkpoint.save=<value>"),
    "optimizer.lr=${x}": ("interpolation", "optimizer.lr=<value>"),
    "checkpoint.save=": ("no value", "checkpoint.save=null"),
    "train.train_iters=": ("no value", "train.train_iters=<value>"),
    "": ("empty override", "key=value"),
    "   ": ("empty override", "key=value"),
    "=": ("no key", "key=value"),
    "=0.5": ("no key", "key=value"),
    "+": ("no key", "+key=value"),
    "++": ("no key", "++key=value"),
    "~": ("no key", "key=value"),
    "optimizer.lr==1": ("two '='", "optimizer.lr=1"),
    "+env_vars.X==": ("two '='", "+env_vars.X=<value>"),
    "optimizer.lr = 1": ("spaces", "optimizer.lr=1"),
    "optimizer.lr =1": ("spaces", "optimizer.lr=1"),
    " optimizer.lr=1": ("spaces", "optimizer.lr=1"),
    "+ env_vars.X=1": ("spaces", "+env_vars.X=1"),
    "model.recompute_granularity=~": ("null", "model.recompute_granularity=null"),
    "optimizer/lr=1": ("'/'", "optimizer.lr=1"),
    "optimizer..lr=1": ("empty part", "optimizer.lr="),
    "optimizer.=1": ("empty part", "optimizer="),
    "ünïcode.key=1": ("not a key name", "--dry-run"),
    "optimizer.lr=1\n": ("control character", "optimizer.lr=1"),
    "optimizer.lr=\x00": ("control character", "optimizer.lr="),
    "checkpoint.save=a=b": ("syntax", "checkpoint.save='a=b'"),
    "checkpoint.save='x": ("syntax", "checkpoint.save='x'"),
    "model.offload_modules=[core_attn": ("syntax", "model.offload_modules=[core_attn]"),
    "optimizer.lr=ünï": ("syntax", "optimizer.lr='ünï'"),
    "train.global_batch_size=8 optimizer.lr=5": ("several overrides", "own argument"),
    "optimizer.lr@pkg=1": ("package", "optimizer.lr="),
    "optimizer.lr=0x10": ("float", "optimizer.lr=16"),
    "train.train_iters=0x10": ("int", "train.train_iters=16"),
    "train.train_iters='20'": ("int", "train.train_iters=20"),
    "train.train_iters=1.5": ("whole number", "train.train_iters=1 or train.train_iters=2"),
    "model.cpu_offloading=yes": ("True or False", "model.cpu_offloading=True"),
    "model.cpu_offloading=None": ("cannot be null", "model.cpu_offloading=<bool"),
    "model.cuda_graph_impl=fast": ("one of", "model.cuda_graph_impl=<one of"),
    "model.cuda_graph_impl=None": ("one of", "did you mean model.cuda_graph_impl=none"),
    "model.recompute_method=sometimes": ("or null", "model.recompute_method=null"),
    "optimizer.main_grads_dtype=float64": ("dtype", "optimizer.main_grads_dtype="),
    "model.offload_modules=[core_attn,1]": ("item 2 of 2", "'1'"),
    "model.offload_modules=[[core_attn]]": ("item 1 of 1", "model.offload_modules=[a,b]"),
    "~comm_overlap.tp_comm_overlap": ("null", "drop ~comm_overlap.tp_comm_overlap"),
    "model.offload_modules=core_attn,moe_act": ("sweep", "model.offload_modules=[core_attn,moe_act]"),
    "optimizer.optimizer_offload_fraction=AUTO": ("float", "optimizer.optimizer_offload_fraction=auto, written exactly"),
    # characters that look like ASCII ones (text pasted from a document or a chat): the fix was to quote them, which
    # keeps them (a path named \u201c/ckpt\u201d, a number that is not one) or named no character at all
    "train.train_iters=\u20135": ("EN DASH", "retype it in ASCII: train.train_iters=-5"),
    "train.train_iters=\u22125": ("MINUS SIGN", "retype it in ASCII: train.train_iters=-5"),
    "train.train_iters=\u00a05": ("NO-BREAK SPACE", "retype it in ASCII: train.train_iters=5"),
    "checkpoint.save=\u201c/ckpt\u201d": ("LEFT DOUBLE QUOTATION MARK", 'retype it in ASCII: checkpoint.save="/ckpt"'),
    "checkpoint.save=\u2018/ckpt\u2019": ("LEFT SINGLE QUOTATION MARK", "retype it in ASCII: checkpoint.save='/ckpt'"),
    "checkpoint.save=/data/run\u20131": ("EN DASH", "checkpoint.save=/data/run-1; to keep the characters as typed, "
                                                    "quote the value: checkpoint.save='/data/run\u20131'"),
    "tr\u0430in.train_iters=5": ("CYRILLIC SMALL LETTER A", "retype it in ASCII: train.train_iters=5"),
    "\uff54rain.train_iters=5": ("FULLWIDTH LATIN SMALL LETTER T", "retype it in ASCII: train.train_iters=5"),
    "train.train_iters=\uff15": ("FULLWIDTH DIGIT FIVE", "retype it in ASCII: train.train_iters=5"),
    "train.train_iters\u200b=5": ("ZERO WIDTH SPACE", "retype it in ASCII: train.train_iters=5"),
    "\ufefftrain.train_iters=5": ("invisible", "retype it in ASCII: train.train_iters=5"),
    "train\u2024train_iters=5": ("ONE DOT LEADER", "retype it in ASCII: train.train_iters=5"),
    "train.train_iters\uff1d5": ("FULLWIDTH EQUALS SIGN", "retype it in ASCII: train.train_iters=5"),
    "+env_vars.A\u00e9=1": ("LATIN SMALL LETTER E WITH ACUTE", "--dry-run"),
    # prefixes Hydra does not know, options written as overrides, YAML's ':'
    "+++train.train_iters=5": ("not a prefix", "++train.train_iters=5"),
    "~~train.train_iters": ("not a prefix", "~train.train_iters"),
    "+~train.train_iters": ("mixes '+' and '~'", "~train.train_iters to reset it"),
    "--train.train_iters=5": ("no dashes", "write it without dashes: train.train_iters=5"),
    "-tp=2": ("option of the command", "-tp 2  (a space, not '='), or model.tensor_model_parallel_size=2"),
    "train.train_iters:5": ("YAML", "write train.train_iters=5"),
    "model.": ("empty part", "write model=<value>"),
    "model.offload_modules=[core_attn,]": ("syntax", "drop the empty item"),
    "model.offload_modules=[core_attn,,moe_act]": ("syntax", "model.offload_modules=[core_attn,moe_act]"),
    "env_vars={A:1,A:2}": ("'A' twice", "give 'A' once"),
    # numbers Hydra reads as text, or that a float cannot hold
    "train.train_iters=007": ("int", "write it without the leading zeros: train.train_iters=7"),
    "optimizer.lr=1e400": ("largest float", "optimizer.lr=inf if infinity is meant"),
    "optimizer.lr=-1e400": ("largest float", "optimizer.lr=-inf if infinity is meant"),
    "optimizer.lr=1e-400": ("smallest float", "optimizer.lr=0 if zero is meant"),
}


@pytest.mark.parametrize("text", sorted(MALFORMED), ids=repr)
def test_malformed_override_is_refused_with_key_rule_and_fix(dense, text):
    errors = refusal(dense, [text])
    assert len(errors.errors) == 1, errors.format()
    error = errors.errors[0]
    word, fix = MALFORMED[text]
    assert word in error.message, error.format()
    assert fix in error.fix, error.format()
    assert "Traceback" not in errors.format()


def test_every_refusal_names_the_key_and_a_fix(dense):
    errors = refusal(dense, sorted(MALFORMED))
    assert len(errors.errors) == len(MALFORMED)
    for error in errors.errors:
        assert error.message and error.fix, error.format()
        if error.key:
            assert error.key in error.format()


def test_spaces_that_split_one_override_into_arguments_are_one_error(dense):
    for argv in (["optimizer.lr", "=", "1e-4"], ["optimizer.lr", "=1e-4"], ["optimizer.lr=", "1e-4"]):
        errors = refusal(dense, argv + ["train.train_iters=x"])
        assert [e.key for e in errors.errors] == ["optimizer.lr", "train.train_iters"], errors.format()
        assert errors.errors[0].fix.endswith("optimizer.lr=1e-4")
    # a delete is a whole override: not joined with its neighbour
    errors = refusal(dense, ["~optimizer.nope", "=1"])
    assert len(errors.errors) == 2


def test_errors_are_listed_in_the_order_of_the_command(dense):
    texts = ["train.train_iters=x", "optimizer.lr==1", "model.cpu_offload=True", "", "optimizer.lr=interval(0,1)",
             "rng.seed=abc"]
    assert [e.text for e in refusal(dense, texts + ["train.global_batch_size=16"]).errors] == texts


def test_control_characters_are_shown_escaped_and_long_overrides_shortened(dense):
    errors = refusal(dense, ["optimizer.lr=1\x1b[2J", "x" * 20000 + "=1", "optimizer.lr=" + "9" * 3000 + "x"])
    text = errors.format()
    assert "\x1b" not in text and "\\x1b" in text
    assert len(text) < 3000 and "characters)" in text
    assert [e.key for e in errors.errors][2] == "optimizer.lr"
    # spaces at the ends of an override are shown in quotes, so they are seen
    assert "' optimizer.lr=1'" in refusal(dense, [" optimizer.lr=1"]).format()


@pytest.mark.parametrize("key,allowed", [
    ("model.fp4", "e2m1"),  # a Literal
    ("model.params_dtype", "bf16"),  # a dtype
    ("model.attention_backend", "flash"),  # an enum
])
def test_a_100000_character_wrong_value_is_refused_quickly(dense, key, allowed):
    """A wrong word's did-you-mean (facts/spelling.close_words: difflib, on no word over 200 letters) costs nothing
    on a pasted blob: it is refused at once, with the key, the value shown shortened and the allowed words."""
    import random
    import time

    letters = random.Random(0)
    value = "".join(letters.choice("abcdefghijklmnopqrstuvwxyz0123456789_") for _ in range(100_000))
    for word in (value, "bfloat16" * 12_500):
        started = time.perf_counter()
        with pytest.raises(OverrideErrors) as caught:
            apply_overrides(dense, [f"{key}={word}"])
        elapsed = time.perf_counter() - started
        assert elapsed < 2.0, f"{key}: {elapsed:.1f} s"
        errors = caught.value
        (error,) = errors.errors
        assert error.key == key and "did you mean" not in error.fix and allowed in error.fix
        assert "characters)" in errors.format() and len(errors.format()) < 3000


def test_a_sweep_of_a_number_is_not_offered_as_a_list(dense):
    fix = refusal(dense, ["optimizer.optimizer_offload_fraction=0,0.5"]).errors[0].fix
    assert "sweep_offload" in fix and "[" not in fix


def test_a_str_field_gets_the_value_as_typed(dense):
    cases = {"1e-4": "1e-4", "true": "true", "1_000": "1_000", "007": "007", "0.50": "0.50"}
    for typed, expected in cases.items():
        cfg = apply_overrides(dense, [f"tokenizer.tokenizer_model={typed}"])
        assert cfg.tokenizer.tokenizer_model == expected, typed


def test_unquoted_none_is_null_where_the_field_may_be_null_and_quoted_none_is_text(dense):
    cfg = apply_overrides(dense, ["checkpoint.save=None", "model.recompute_granularity=None",
                                  "tokenizer.tokenizer_model='None'"])
    assert cfg.checkpoint.save is None and cfg.model.recompute_granularity is None
    assert cfg.tokenizer.tokenizer_model == "None"


def test_a_whole_number_in_exponent_form_is_exact(dense):
    cfg = apply_overrides(dense, ["train.train_iters=1e30", "rng.seed=1_000", "train.global_batch_size=-0"])
    assert cfg.train.train_iters == 10**30
    assert cfg.rng.seed == 1000 and cfg.train.global_batch_size == 0


def test_dtype_names_are_read_in_any_case(dense):
    import torch

    cfg = apply_overrides(dense, ["optimizer.main_grads_dtype=BF16", "optimizer.main_params_dtype=torch.Float32"])
    assert cfg.optimizer.main_grads_dtype is torch.bfloat16 and cfg.optimizer.main_params_dtype is torch.float32


def test_enum_member_may_be_written_with_its_class(dense):
    cfg = apply_overrides(dense, ["model.attention_backend=AttnBackend.flash"])
    assert cfg.model.attention_backend.name == "flash"


def test_creating_a_null_section_does_not_depend_on_the_order(dense):
    # CommOverlapConfig needs tp_comm_overlap to be made: given after the other field, it used to be refused.
    texts = ["+comm_overlap.tp_comm_bootstrap_backend=mpi", "+comm_overlap.tp_comm_overlap=True"]
    forward = apply_overrides(dense, texts)
    backward = apply_overrides(dense, list(reversed(texts)))
    assert config_diff(forward, backward) == []
    assert forward.comm_overlap.tp_comm_bootstrap_backend == "mpi" and forward.comm_overlap.tp_comm_overlap is True
    # alone, the section cannot be made: the fix names the field it needs
    errors = refusal(dense, ["+comm_overlap.tp_comm_bootstrap_backend=mpi"])
    assert "+comm_overlap.tp_comm_overlap=" in errors.errors[0].fix
    # the needed field refused for its own value: its own error, and the other says why it cannot be made
    errors = refusal(dense, ["+comm_overlap.tp_comm_overlap=maybe", "+comm_overlap.tp_comm_bootstrap_backend=mpi"])
    assert "True or False" in errors.errors[0].message
    assert "+comm_overlap.tp_comm_overlap=maybe is refused" in errors.errors[1].message


def test_overlapping_keys_are_refused_in_either_order(dense):
    # ~env_vars then +env_vars.X kept X; the other order dropped it: the result depended on the order.
    for texts in (["~env_vars", "+env_vars.X=1"], ["+env_vars.X=1", "~env_vars"],
                  ["comm_overlap=null", "+comm_overlap.tp_comm_overlap=True"]):
        errors = refusal(dense, texts)
        assert len(errors.errors) == 1 and "overlaps" in errors.errors[0].message, errors.format()
        assert errors.errors[0].text == texts[1]


def test_did_you_mean_corrects_a_typo_in_the_middle_of_a_path(dense):
    cases = {"optimzer.lr=1e-4": "optimizer.lr", "modle.cpu_offloading=True": "model.cpu_offloading",
             "trian.train_iters=5": "train.train_iters", "model.cpu_offloding.x=1": "model.cpu_offloading"}
    for text, expected in cases.items():
        fix = refusal(dense, [text]).errors[0].fix
        assert fix.startswith(f"did you mean {expected}"), (text, fix)


def test_an_override_that_is_not_text_is_refused(dense):
    errors = refusal(dense, [5, None, "train.train_iters=x"])
    assert len(errors.errors) == 3 and "is text" in errors.errors[0].message


def test_the_commands_refuse_malformed_overrides_with_exit_2_and_no_traceback(dense, monkeypatch):
    """run_recipe --dry-run, plan_offload and sweep_offload (its launch replaced by a stub that fails the
    test): every error of the command at once, exit 2, nothing launched."""
    import mbridge_offload.cli.plan_offload as plan_offload
    import mbridge_offload.cli.run_recipe as run_recipe
    import mbridge_offload.cli.sweep_offload as sweep_offload

    def launched(*args, **kwargs):
        raise AssertionError("a refused command launched")

    monkeypatch.setattr(sweep_offload, "run_sweep", launched)
    bad = ["optimizer.lr=interval(0,1)", "optimizer.lr", "=", "1", "checkpoint.save=", "model.cpu_offload=True"]
    out = Path(tempfile.mkdtemp(prefix="malformed-")) / "out"
    for main, argv in ((run_recipe.main, ["--recipe", DENSE, "--dry-run", *bad]),
                       (plan_offload.main, ["--recipe", DENSE, *bad]),
                       (sweep_offload.main, ["--recipe", DENSE, "--out", str(out), *bad])):
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed), contextlib.redirect_stderr(printed):
            try:
                code = main(argv)
            except SystemExit as stop:
                code = stop.code
        text = printed.getvalue()
        assert code == 2, (argv, text)
        assert "Traceback" not in text
        for typed in ("optimizer.lr=interval(0,1)", "optimizer.lr = 1", "checkpoint.save=", "model.cpu_offload=True"):
            assert typed in text, (argv[0], typed, text)
    assert not out.exists()


@pytest.mark.parametrize("word,meant", [("yes", True), ("on", True), ("1", True), ("y", True), ("no", False),
                                        ("off", False), ("0", False)])
def test_a_bool_written_as_yaml_words_is_refused_with_the_value_it_means(dense, word, meant):
    (error,) = refusal(dense, [f"model.cpu_offloading={word}"]).errors
    assert error.fix == f"model.cpu_offloading={meant}", error.format()


def test_the_same_key_twice_is_refused_saying_what_hydra_would_do(dense):
    """Hydra applies both and keeps the last; here the command takes each key once: the refusal says so and names
    both, so the user keeps the one meant."""
    (error,) = refusal(dense, ["train.train_iters=5", "train.train_iters=6"]).errors
    assert "Hydra would apply both and keep the last" in error.message
    assert error.fix == "keep the one you mean: train.train_iters=5 or train.train_iters=6"


def test_a_dict_given_over_a_dict_is_merged_as_hydra_merges_it(dense):
    """env_vars={A:1} replaced the recipe's whole env_vars (its NCCL settings dropped without a word); Hydra merges a
    dict into the dict it is given over (OmegaConf.update with merge=True): so does the override now."""
    from omegaconf import OmegaConf

    hydra = OmegaConf.create({"env_vars": dict(dense.env_vars)})
    first = next(iter(dense.env_vars))
    OmegaConf.update(hydra, "env_vars", {"A": 1, first: "changed"}, merge=True)
    cfg = apply_overrides(dense, [f"env_vars={{A:1,{first}:changed}}"])
    assert cfg.env_vars == OmegaConf.to_container(hydra)["env_vars"]
    assert set(dense.env_vars) < set(cfg.env_vars)


def test_an_escaped_interpolation_is_the_text_as_omegaconf_reads_it(dense):
    """checkpoint.save=\\${x} is Hydra's way to write the text ${x}: it was kept with its backslash."""
    from omegaconf import OmegaConf

    cfg = apply_overrides(dense, ["checkpoint.save=/ckpt/\\${x}"])
    assert cfg.checkpoint.save == OmegaConf.create({"save": "/ckpt/\\${x}"}).save == "/ckpt/${x}"


def test_look_alike_characters_inside_quotes_are_the_texts_own(dense):
    cfg = apply_overrides(dense, ["checkpoint.save='/data/run\u20131 \u201cfinal\u201d'"])
    assert cfg.checkpoint.save == "/data/run\u20131 \u201cfinal\u201d"


@pytest.mark.parametrize("text", ["train.train_iters=-0", "train.train_iters=+5", "train.train_iters=1_000",
                                  "train.train_iters=1e3", "optimizer.lr=inf", "optimizer.lr=.5",
                                  "model.cpu_offloading=TRUE", "checkpoint.save=NULL"])
def test_numbers_bools_and_null_as_hydra_reads_them(dense, text):
    """What Hydra's grammar reads as a number, a bool or null is that value here too (-0 is 0, +5 is 5, 1_000 is
    1000, TRUE is True, NULL is null), the override layer typing it for the field."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    hydra = OverridesParser.create().parse_override(text).value()
    key = text.split("=", 1)[0]
    section, name = key.split(".")
    assert getattr(getattr(apply_overrides(dense, [text]), section), name) == hydra


def test_a_number_longer_than_python_reads_is_refused_by_key(dense):
    """Hydra's parser raised Python's own 'Exceeds the limit (4300 digits)' and the fix was to quote the value."""
    (error,) = refusal(dense, ["train.train_iters=" + "9" * 5000]).errors
    assert error.key == "train.train_iters" and "5000 digits" in error.message
    assert error.fix == "give the value itself: train.train_iters=<value>"



@pytest.mark.parametrize("text, meant", [("checkpoint.save='it''s'", "it's"),
                                         ('checkpoint.save="say ""hi"" now"', 'say "hi" now'),
                                         ("checkpoint.save='/a''b''c'", "/a'b'c"),
                                         ("checkpoint.save='it''s", "it's")], ids=repr)
def test_a_quote_doubled_inside_quotes_gets_hydras_escaping_as_the_fix(dense, text, meant):
    """SQL's and YAML's way to put a quote in a quoted text ('it''s') is two quoted texts to Hydra: the fix is the
    text meant, written as Hydra reads it (in the other quotes, or the quote escaped by a backslash); each form of
    the fix applies, giving the text meant."""
    (error,) = refusal(dense, [text]).errors
    assert "not doubled" in error.fix, error.format()
    forms = error.fix.split(": ", 1)[1].split("  or  ")
    assert forms and all(apply_overrides(dense, [form]).checkpoint.save == meant for form in forms), error.fix


def test_an_escaped_colon_in_a_dict_key_is_the_keys_own_text(dense):
    """Hydra reads {a\\:b:1,a\\:c:2} as the keys 'a:b' and 'a:c': two keys, not 'a\\' twice."""
    cfg = apply_overrides(dense, ["env_vars={X\\:b:1,X\\:c:2}"])
    assert {"X:b", "X:c"} <= set(cfg.env_vars)
    (error,) = refusal(dense, ["env_vars={X\\:b:1,X\\:b:2}"]).errors
    assert "twice" in error.message, error.format()
