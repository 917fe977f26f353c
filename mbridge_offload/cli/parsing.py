"""What every command that starts trainings does first: parse its line, then refuse an unknown recipe
(with suggestions) before anything heavy is imported."""

from __future__ import annotations

import argparse

from recipes import registry


def parse_command(parser: argparse.ArgumentParser, argv: list[str] | None) -> argparse.Namespace:
    args = parser.parse_intermixed_args(argv)
    registry.get_or_exit(parser, args.recipe)
    return args
