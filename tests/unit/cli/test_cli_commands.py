"""The CLI's command table: every command a module adds is in it (so it can be loaded alone), and a command
loads only its own module."""

from __future__ import annotations

import argparse
import subprocess
import sys

import pytest

from libs.cli.main import COMMANDS, build_parser


def choices(parser: argparse.ArgumentParser) -> set[str]:
    return {name for a in parser._actions if isinstance(a, argparse._SubParsersAction) for name in a.choices}


def test_the_table_names_every_command_and_each_loads_alone() -> None:
    assert choices(build_parser()) == set(COMMANDS)
    for command in COMMANDS:
        assert command in choices(build_parser([command, "--help"]))


@pytest.mark.parametrize("command", ["jobs", "job", "explain", "wait", "usage", "queues", "nodes", "logs", "submit",
                                     "cancel", "node"])
def test_an_api_command_loads_no_decision_core_nor_the_bus(command: str) -> None:
    probe = (f"import sys; from libs.cli.main import build_parser; build_parser([{command!r}]); "
             "print(sorted(m for m in sys.modules if m.startswith(('libs.core', 'nats', 'aiohttp', 'libs.bus'))))")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True)
    assert done.stdout.strip() == "[]"
