"""`gpusched agent`: the node agent of this GPU server, whose dependencies load only for this command."""

from __future__ import annotations

import argparse


def cmd_agent(args: argparse.Namespace) -> None:
    from services.agent.app import cmd_agent as run_agent

    run_agent(args)


def add_command(sub: argparse._SubParsersAction) -> None:
    from services.agent.app import add_command as add_agent

    add_agent(sub)
    sub.choices["agent"].set_defaults(func=cmd_agent)
