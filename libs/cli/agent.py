"""`gpusched agent`: the node agent of this GPU server. The CLI starts the edge's processes by module name, as
`gpusched service` does (libs import nothing of services/), and the agent's dependencies load only here."""

from __future__ import annotations

import argparse
import importlib

AGENT_APP = "services.agent.app"


def cmd_agent(args: argparse.Namespace) -> None:
    importlib.import_module(AGENT_APP).cmd_agent(args)


def add_command(sub: argparse._SubParsersAction) -> None:
    importlib.import_module(AGENT_APP).add_command(sub)
    sub.choices["agent"].set_defaults(func=cmd_agent)
