"""What the validator tells the user about values the user gave: a number given as text is shown as text (its type
seen), a key the command line gave that Megatron Bridge replaces at setup (the tokenizer's vocabulary, the
mixed_precision preset) is refused by key, and a check skipped for want of a GPU says so. Real recipe configs."""

from __future__ import annotations

import copy

import pytest

from mbridge_offload.facts.config_tree import set_path
from mbridge_offload.validation import RULES_BY_ID, Context, check_rules

DENSE = "qwen3_1b_proxy_pretrain_config"  # NullTokenizer with the model's 151936, bf16_mixed
MOE = "qwen3_30b_a3b_proxy_pretrain_config"


def _problems(cfg, overrides=(), **context):
    from overrides.grammar import given_keys

    return check_rules(Context(cfg, 1, environ={}, given_keys=given_keys(list(overrides)), **context))


# -- a value given as text where a number is expected --------------------------------------------------------------

@pytest.mark.parametrize("key,text,rule_id", [
    ("train.micro_batch_size", "16", "parallel/micro-batch-range"),
    ("model.num_layers", "16", "parallel/num-layers-range"),
    ("model.tensor_model_parallel_size", "1", "parallel/tp-range"),
    ("optimizer.optimizer_offload_fraction", "0.5", "optimizer-offload/fraction-range"),
    ("model.cpu_offloading_num_layers", "2", "activation-offload/num-layers-range"),
    ("model.activation_offload_fraction", "abc", "fine-grained/fraction-range"),
])
def test_a_number_set_as_text_is_refused_showing_the_text_and_its_type(recipe, key, text, rule_id):
    """train.micro_batch_size='16' (a recipe, YAML or Python that set the text) is refused by its range: the value is
    shown as the string '16', not as 16, so the user sees why a 16 is refused."""
    cfg = recipe(DENSE)
    set_path(cfg, key, text)
    (problem,) = [p for p in _problems(cfg) if p.rule_id == rule_id]
    assert problem.key == key
    assert problem.value.startswith(f"the string {text!r}"), problem.value
    assert f"{key} = the string {text!r}" in problem.format()


def test_a_number_is_shown_as_it_is_and_text_that_reads_as_text_is_not_quoted(recipe):
    from mbridge_offload.facts.key_ranges import show_typed

    assert [show_typed(v) for v in (16, 0.5, None, True, "adam", ["core_attn", "1"])] == [
        "16", "0.5", "null", "True", "adam", "[core_attn,'1']"]
    assert [show_typed(v) for v in ("16", "True", "null", "None", "", " x", "[1]")] == [
        "the string '16'", "the string 'True'", "the string 'null'", "the string 'None'", "the string ''",
        "the string ' x'", "the string '[1]'"]
    cfg = recipe(DENSE)
    set_path(cfg, "train.micro_batch_size", 0)  # a number out of range is shown as the number
    (problem,) = [p for p in _problems(cfg) if p.rule_id == "parallel/micro-batch-range"]
    assert problem.value == "0"


# -- model.vocab_size given, replaced by the tokenizer's vocabulary -------------------------------------------------

def _bridge_vocab(model_vocab, tokenizer_vocab, use_tokenizer):
    from megatron.bridge.training.setup import _validate_and_set_vocab_size

    return _validate_and_set_vocab_size(model_vocab_size=model_vocab, tokenizer_vocab_size=tokenizer_vocab,
                                        use_tokenizer_vocab_size=use_tokenizer)[0]


GIVEN = "model/given-vocab-replaced-by-tokenizer"
VALUES = "model/vocab-replaced-by-tokenizer"


def test_a_vocabulary_given_that_the_null_tokenizers_replaces_is_refused_by_key(recipe):
    from overrides import apply_overrides

    overrides = ["model.vocab_size=200000", "tokenizer.use_tokenizer_vocab_size=True"]
    cfg = apply_overrides(recipe(DENSE), overrides)
    assert _bridge_vocab(200000, cfg.tokenizer.vocab_size, True) == 151936  # what trains is not what was given
    (problem,) = [p for p in _problems(cfg, overrides) if p.key == "model.vocab_size"]
    assert (problem.rule_id, problem.severity) == (GIVEN, "error")
    assert problem.rule == RULES_BY_ID[GIVEN].text
    assert problem.value.startswith("200000 (given; ") and "151936" in problem.value
    fixed = apply_overrides(cfg, [problem.fix.split()[0]])
    fixed_overrides = overrides + [problem.fix.split()[0]]
    assert _bridge_vocab(200000, 151936, fixed.tokenizer.use_tokenizer_vocab_size) == 200000
    assert not [p for p in _problems(fixed, fixed_overrides) if p.key == "model.vocab_size"]
    # the same values with no command line (a recipe set both): the values-alone warning, as before
    assert [p.rule_id for p in _problems(cfg) if p.key == "model.vocab_size"] == [VALUES]


def test_a_vocabulary_given_with_a_tokenizer_known_only_at_launch_is_refused_and_the_recipes_own_is_not(recipe):
    """A Hugging Face tokenizer's vocabulary is known at launch: the one given on the command line is replaced by it
    whatever it is. The recipe's own model.vocab_size with the same tokenizer is not the user's: nothing to say."""
    from overrides import apply_overrides

    base = apply_overrides(recipe(DENSE), ["tokenizer.tokenizer_type=HuggingFaceTokenizer",
                                           "tokenizer.tokenizer_model=/models/tokenizer",
                                           "tokenizer.use_tokenizer_vocab_size=True"])
    assert _bridge_vocab(151936, 32000, True) == 32000  # Bridge takes the tokenizer's, whatever the model says
    overrides = ["model.vocab_size=151936"]
    cfg = apply_overrides(base, overrides)
    (problem,) = [p for p in _problems(cfg, overrides) if p.key == "model.vocab_size"]
    assert (problem.rule_id, problem.severity) == (GIVEN, "error")
    assert "known at launch" in problem.value and "/models/tokenizer" in problem.value
    assert problem.fix.startswith("tokenizer.use_tokenizer_vocab_size=False  (model.vocab_size=151936 then trains")
    fixed = apply_overrides(cfg, [problem.fix.split()[0]])
    assert not [p for p in _problems(fixed, overrides + [problem.fix.split()[0]]) if p.key == "model.vocab_size"]
    assert not [p for p in _problems(cfg) if p.key == "model.vocab_size"]  # the recipe's own: not refused


def test_a_vocabulary_given_equal_to_the_tokenizers_passes(recipe):
    from overrides import apply_overrides

    overrides = ["model.vocab_size=151936", "tokenizer.use_tokenizer_vocab_size=True"]
    cfg = apply_overrides(recipe(DENSE), overrides)
    assert not [p for p in _problems(cfg, overrides) if p.key == "model.vocab_size"]


# -- a precision key given that the mixed_precision preset replaces -------------------------------------------------

def _after_setup(cfg):
    """The model, optimizer and DDP configs as Megatron Bridge leaves them at setup (the preset applied over them)."""
    from megatron.bridge.training.mixed_precision import get_mixed_precision_config

    model, opt, ddp = copy.deepcopy(cfg.model), copy.deepcopy(cfg.optimizer), copy.deepcopy(cfg.ddp)
    preset = get_mixed_precision_config(cfg.mixed_precision)
    preset.finalize()
    preset.setup(model, opt, ddp)
    return {"model": model, "optimizer": opt, "ddp": ddp}


@pytest.mark.parametrize("override", ["ddp.grad_reduce_in_fp32=False", "optimizer.loss_scale=128.0",
                                      "model.params_dtype=fp32", "optimizer.bf16=False"])
def test_a_precision_key_given_that_the_preset_replaces_is_refused_by_key(recipe, override):
    from overrides import apply_overrides

    key = override.split("=", 1)[0]
    section, name = key.split(".")
    cfg = apply_overrides(recipe(DENSE), [override])
    asked = getattr(getattr(cfg, section), name)
    assert getattr(_after_setup(cfg)[section], name) != asked  # Megatron Bridge drops it at setup
    problems = [p for p in _problems(cfg, [override]) if p.rule_id == "precision/preset-replaces-given"]
    (problem,) = problems
    assert problem.severity == "error" and f"{key}=" in problem.value and "given" in problem.value
    assert f"drop {key}=" in problem.fix and "mixed_precision=null" in problem.fix
    assert not [p for p in _problems(cfg) if p.rule_id == "precision/preset-replaces-given"]  # the recipe's own
    fixed_overrides = [override, "mixed_precision=null"]
    fixed = apply_overrides(recipe(DENSE), fixed_overrides)
    assert not [p for p in _problems(fixed, fixed_overrides) if p.rule_id == "precision/preset-replaces-given"]


def test_a_precision_key_given_at_the_presets_value_passes(recipe):
    from overrides import apply_overrides

    overrides = ["ddp.grad_reduce_in_fp32=True", "model.bf16=True", "optimizer.bf16=True"]
    cfg = apply_overrides(recipe(DENSE), overrides)
    assert not [p for p in _problems(cfg, overrides) if p.rule_id == "precision/preset-replaces-given"]


# -- the flex dispatcher's GPU check, skipped without a GPU -----------------------------------------------------------

def test_the_flex_dispatcher_check_skipped_without_a_gpu_is_said_once(recipe):
    from overrides import apply_overrides

    rule_id = "env/flex-dispatcher-gpu-unchecked"
    cfg = apply_overrides(recipe(MOE), ["model.moe_token_dispatcher_type=flex",
                                        "model.moe_flex_dispatcher_backend=deepep"])
    (notice,) = [p for p in _problems(cfg, has_cuda=lambda: False) if p.rule_id == rule_id]
    assert notice.severity == "warning" and notice.key == "model.moe_flex_dispatcher_backend"
    assert "no CUDA device" in notice.value and "deepep" in notice.value
    assert "launch" in notice.rule and "GPU" in notice.fix
    assert not [p for p in _problems(cfg, has_cuda=lambda: True) if p.rule_id == rule_id]  # checked on a GPU
    assert not [p for p in _problems(recipe(MOE), has_cuda=lambda: False) if p.rule_id == rule_id]  # not flex


def test_validate_without_a_gpu_reports_the_skipped_flex_check(recipe):
    from overrides import apply_overrides
    from mbridge_offload.validation import validate
    from mbridge_offload.validation.installed import cuda_available

    if cuda_available():
        pytest.skip("on a GPU the check runs")
    cfg = apply_overrides(recipe(MOE), ["model.moe_token_dispatcher_type=flex"])
    report = validate(cfg, 8, environ={})
    assert [p.rule_id for p in report.warnings].count("env/flex-dispatcher-gpu-unchecked") == 1, report.format()


# -- a scheduler value given that Megatron Bridge or Megatron Core replaces or ignores ------------------------------

def _scheduled(cfg):
    """The config as validate() leaves it and the learning-rate scheduler Megatron Bridge's setup builds from it, over
    a one-parameter torch optimizer (what the scheduler sets on every parameter group is read back from it)."""
    import torch
    from megatron.bridge.training.config import runtime_config_update
    from megatron.bridge.training.optim import _get_scheduler

    trial = copy.deepcopy(cfg)
    runtime_config_update(trial)
    optimizer = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], lr=trial.optimizer.lr,
                                  weight_decay=trial.optimizer.weight_decay)
    return trial, optimizer, _get_scheduler(trial.optimizer, trial.scheduler, optimizer)


def _given_problems(cfg, overrides):
    from overrides import apply_overrides

    applied = apply_overrides(cfg, overrides)
    return applied, _problems(applied, overrides)


def test_a_weight_decay_given_that_the_scheduler_replaces_is_refused_with_the_fix_that_trains_it(recipe):
    cfg, problems = _given_problems(recipe(DENSE), ["optimizer.weight_decay=0.05"])
    _, optimizer, _ = _scheduled(cfg)
    assert optimizer.param_groups[0]["weight_decay"] != 0.05  # what upstream trains: the scheduler's value
    (problem,) = [p for p in problems if p.rule_id == "scheduler/weight-decay-replaces-given"]
    fixed, after = _given_problems(cfg, problem.fix.split())
    assert _scheduled(fixed)[1].param_groups[0]["weight_decay"] == 0.05
    assert "scheduler/weight-decay-replaces-given" not in {p.rule_id for p in after}


def test_a_decay_length_given_that_max_steps_replaces_is_refused(recipe):
    cfg, problems = _given_problems(recipe(DENSE), ["scheduler.max_steps=1000", "scheduler.lr_decay_iters=500"])
    trial, _, _ = _scheduled(cfg)
    assert trial.scheduler.lr_decay_iters == 1000  # validate() replaced the 500 given
    (problem,) = [p for p in problems if p.rule_id == "scheduler/max-steps-replaces-decay-iters"]
    assert "500" in problem.value and problem.fix.startswith("scheduler.max_steps=null")
    # the recipe's own lr_decay_iters (not given) is not the command line's concern
    assert "scheduler/max-steps-replaces-decay-iters" not in {
        p.rule_id for p in _given_problems(recipe(DENSE), ["scheduler.max_steps=1000"])[1]}


def test_a_warmup_given_longer_than_the_decay_is_refused_where_validate_would_cut_it(recipe):
    cfg, problems = _given_problems(recipe(DENSE), ["scheduler.lr_warmup_iters=200"])  # 100 iterations to decay
    trial, _, _ = _scheduled(cfg)
    assert trial.scheduler.lr_warmup_steps == trial.scheduler.lr_decay_steps - 1 != 200 * trial.train.global_batch_size
    (problem,) = [p for p in problems if p.rule_id == "scheduler/warmup-capped"]
    fixed, after = _given_problems(cfg, [problem.fix.split()[0]])
    assert "scheduler/warmup-capped" not in {p.rule_id for p in after}
    trial, _, _ = _scheduled(fixed)
    assert trial.scheduler.lr_warmup_steps == trial.scheduler.lr_warmup_iters * trial.train.global_batch_size


def test_a_constant_weight_decay_with_two_ends_is_refused_before_the_scheduler_asserts(recipe):
    cfg = recipe(DENSE)
    set_path(cfg, "scheduler.end_weight_decay", 0.1)
    with pytest.raises(AssertionError):
        _scheduled(cfg)  # after validate() passed: at the scheduler's first step, on every rank
    assert "scheduler/constant-weight-decay-equal" in {p.rule_id for p in _problems(cfg)}


@pytest.mark.parametrize("overrides, rule_id", [
    (["scheduler.lr_wsd_decay_iters=50"], "scheduler/wsd-given-without-wsd"),
    (["scheduler.lr_decay_style=constant", "optimizer.min_lr=1e-6"], "scheduler/constant-lr-ignores-given"),
])
def test_a_scheduler_value_given_that_the_schedule_never_reads_is_warned(recipe, overrides, rule_id):
    """The learning rate at every step is the same with the value given as without it: said, as a warning."""
    cfg, problems = _given_problems(recipe(DENSE), overrides)
    without, _ = _given_problems(recipe(DENSE), overrides[:-1])
    rates = []
    for config in (cfg, without):
        _, _, scheduler = _scheduled(config)
        rates.append([scheduler.get_lr({}) for scheduler.num_steps in range(0, 900, 37)])
    assert rates[0] == rates[1]
    (problem,) = [p for p in problems if p.rule_id == rule_id]
    assert problem.severity == "warning" and overrides[-1].split("=")[0] in problem.value
