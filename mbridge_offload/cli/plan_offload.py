"""Plan GPU and host memory of a recipe before queueing it, and pick the offload fraction.

Usage, examples and exit codes: scripts/plan_offload.py. The config is prepared as run_recipe prepares
it (mbridge_offload/prepare.py), without the offload tuning and the validation.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from overrides.short_flags import SHORT_FLAGS, dest, to_overrides
from recipes import registry
from mbridge_offload.cli.parsing import (CommandParser, at_least_one, not_prepared_problems, problem_json, readable_dir,
                                         recipe_or_exit)
from mbridge_offload.facts.import_notices import quiet_import_notices
from mbridge_offload.planning import add_plan_arguments

EXIT_OK, EXIT_INVALID = 0, 2


def build_parser() -> argparse.ArgumentParser:
    parser = CommandParser(prog="plan_offload.py", description=__doc__.split("\n\n")[0], json_flag="--json",
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--recipe", metavar="NAME")
    parser.add_argument("--compare", type=readable_dir, nargs="+", metavar="SWEEP_DIR",
                        help="compare the plan with the peak memory measured by sweep_offload.py runs "
                             "(markdown table) instead of planning one recipe")
    parser.add_argument("--num-gpus", type=at_least_one("GPU"), metavar="N", help="default: the recipe's GPU count")
    parser.add_argument("--json", action="store_true",
                        help='print the plan as JSON ("ok": false and "refused": true when it exits 2; a refusal '
                             'without a plan prints {"ok": false, "refused": true, "error": ..., "problems": [...]})')
    add_plan_arguments(parser)
    for flag in SHORT_FLAGS:
        parser.add_argument(*flag.flags, dest=dest(flag), type=flag.type, help=argparse.SUPPRESS)
    parser.add_argument("overrides", nargs="*", metavar="key=value")
    return parser


def _option_action(parser: argparse.ArgumentParser, token: str) -> argparse.Action | None:
    """The option ``token`` names: exactly, or as the one long option it abbreviates (argparse's allow_abbrev)."""
    actions = parser._option_string_actions
    if token in actions:
        return actions[token]
    if token.startswith("--") and parser.allow_abbrev:
        matches = {actions[o] for o in actions if o.startswith(token)}
        return matches.pop() if len(matches) == 1 else None
    return None


def argument_errors(parser: argparse.ArgumentParser, argv: list[str]) -> list[str]:
    """What argparse would say of every option value its type refuses ("argument --x: ..."), and of an unknown
    --recipe (with did-you-mean), in the order given. argparse stops at the first; a command line with several bad
    values gets them all at once."""
    errors, tokens, i = [], list(argv), 0
    while i < len(tokens):
        token = str(tokens[i])
        i += 1
        if token == "--":
            break
        if not token.startswith("-") or token == "-":
            continue
        flag, has_value, value = token.partition("=")
        action = _option_action(parser, flag)
        recipe = action is not None and action.dest == "recipe"
        if action is None or (action.type is None and not recipe) or action.nargs is not None:
            continue
        if not has_value:
            if i >= len(tokens):
                continue  # argparse says the value is missing
            value = str(tokens[i])
            i += 1
        try:
            registry.get(value) if recipe else action.type(value)
        except registry.UnknownRecipe as unknown:
            errors.append(f"argument --recipe: {unknown}")
        except argparse.ArgumentTypeError as error:
            errors.append(f"argument {'/'.join(action.option_strings)}: {error}")
        except (TypeError, ValueError):
            errors.append(f"argument {'/'.join(action.option_strings)}: invalid "
                          f"{getattr(action.type, '__name__', 'value')} value: {value!r}")
    return errors


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    errors = argument_errors(parser, argv)
    if len(errors) > 1:  # one alone: argparse (or the recipe's did-you-mean) says it, as for any other command
        parser.error(f"{len(errors)} invalid arguments: " + "; ".join(errors))
    args = parser.parse_intermixed_args(argv)
    if args.compare:
        quiet_import_notices()
        from mbridge_offload.bench.planner_accuracy import compare_host_markdown, compare_markdown, heldout_markdown

        print("PyTorch's peak allocation:\n" + compare_markdown(args.compare)
              + "\n\nThe whole device (where the runs recorded it, NVML):\n" + heldout_markdown(args.compare)
              + "\n\nHost memory:\n" + compare_host_markdown(args.compare))
        return EXIT_OK
    if not args.recipe:
        parser.error("--recipe NAME is required (or --compare SWEEP_DIR ...)")
    recipe = recipe_or_exit(parser, args.recipe)
    num_gpus = args.num_gpus or recipe.num_gpus

    from mbridge_offload import fast_check
    from mbridge_offload.planning import format_plan, plan_kwargs

    overrides = list(args.overrides) + to_overrides(vars(args), list(args.overrides))
    # the plan of the config as the recipe and the overrides make it: no offload tuning, no validation
    options = dict(num_gpus=num_gpus, num_gpus_from="--num-gpus" if args.num_gpus else "the recipe's GPU count",
                   plan_options=plan_kwargs(args), offload_tuning="stock",
                   step_time_budget_s=args.step_time_budget_s, validated=False)
    fast = fast_check.prepare_fast(recipe, overrides, **options)  # from the cache of this recipe, when there
    if fast is not None and fast.refusal is not None:
        return parser.refuse(fast.refusal.message, not_prepared_problems(fast.refusal))
    if fast is not None:
        prepared = fast.prepared
    else:
        from mbridge_offload.fast_check import warm_worker

        code = warm_worker.ask("plan_offload", argv)  # Megatron Bridge loaded already: answers in seconds
        if code is not None:
            return code
        quiet_import_notices()
        from mbridge_offload.prepare import NotPrepared, prepare

        try:
            with fast_check.recording(recipe) as building:
                prepared = prepare(building, overrides, validator=building.validator, **options)
        except NotPrepared as refusal:
            return parser.refuse(refusal.message, not_prepared_problems(refusal))
    result, problems = prepared.memory, prepared.report.problems
    if args.json:  # the plan's fields in their order; ok and refused as a refusal without a plan has them
        print(json.dumps({"ok": not problems, "refused": bool(problems), **result.to_json(),
                          "problems": [problem_json(p) for p in problems]}, indent=2))
    else:
        print(f"Memory plan for {recipe.name} on {num_gpus} GPU{'s' if num_gpus != 1 else ''}"
              + (" (fraction=auto)" if prepared.auto_fraction is not None else "") + ":")
        print(format_plan(result))
        for p in problems:
            print(f"  {p.severity.upper()} {p.key} = {p.value}\n        rule: {p.rule}\n        fix:  {p.fix}")
    return EXIT_INVALID if problems else EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
