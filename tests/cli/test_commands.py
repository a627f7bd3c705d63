"""The ``warehouse`` command line as a newcomer reads it: every option says what it is for."""

from __future__ import annotations

import argparse

from warehouse_assets.cli.main import build_parser


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:  # argparse keeps its subcommands there: no public accessor
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def test_every_option_of_every_command_has_help_text() -> None:
    commands = _subcommands(build_parser())
    assert {"dev", "why", "status", "engine", "ingest", "materialize", "simulate", "capture"} <= set(commands)
    missing = [
        f"warehouse {name} {'/'.join(action.option_strings) or action.dest}"
        for name, command in commands.items()
        for action in command._actions
        if not isinstance(action, argparse._HelpAction) and not action.help
    ]
    assert missing == []
