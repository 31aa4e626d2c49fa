"""`gpusched nodes`, `gpusched node cordon|drain|uncordon|remove|fault`, `gpusched logs`,
`gpusched checkpoint`."""

from __future__ import annotations

import argparse
import asyncio
import getpass
import json
import sys
from typing import Any

from libs.cli import logs
from libs.cli.client import Client
from libs.cli.output import add_json_flag, add_table_flags, print_json, wide
from libs.cli.tables import Column, print_table


def node_status(node: dict[str, Any]) -> str:
    """offline, draining, cordoned or ready (what an operator acts on first)."""
    if not node.get("online", True):
        return "offline"
    return node.get("cordon") or "ready"


def _by_mode(node: dict[str, Any], free: str, total: str, scale: float = 1.0) -> str | None:
    """"free/total" of one sharing mode ("-" without such GPUs, or from an API without the figures)."""
    if "gpu_modes" not in node or not node.get(total):
        return None
    return f"{node.get(free, 0) / scale:g}/{node[total]}"


def _modes(node: dict[str, Any]) -> str:
    modes = node.get("gpu_modes") or []
    return ", ".join(f"{modes.count(m)} {m}" for m in ("whole", "split", "mig") if m in modes)


# Free GPUs by how they are shared, since each takes other work: an idle GPU takes whole-GPU jobs and fractions, a
# split GPU more fractions, a MIG-enabled GPU MIG instances only (its free share is no free GPU for anyone else).
NODES_HELP = ("KIND: GPU (NVIDIA) or NPU (Ascend); DEVICES: its GPUs or NPUs; "
              "IDLE: healthy devices nothing holds (whole-GPU jobs or fractions); "
              "SPLIT-FREE: GPU share free/GPUs split into fractions (0.75/1: a quarter of one GPU is held); "
              "MIG-FREE: free/all compute slices of the "
              "MIG-enabled GPUs (MIG instances only; 1g takes one slice)")
NODE_COLUMNS: list[Column[dict[str, Any]]] = [
    Column("NAME", lambda n: n["name"]),
    Column("STATUS", node_status),
    Column("KIND", lambda n: "+".join(k.upper() for k in n.get("kinds", [])) or None, wide=True),
    Column("MODELS", lambda n: ",".join(n.get("models", []))),
    Column("DEVICES", lambda n: n.get("gpus", 0), right=True),
    Column("ALLOCATED", lambda n: f"{n.get('allocated_gpus', 0.0):g}", wide=True, right=True),
    Column("HEALTHY", lambda n: n.get("healthy_gpus", 0), right=True),
    Column("IDLE", lambda n: n.get("idle_gpus") if "gpu_modes" in n else None, right=True),
    Column("SPLIT-FREE", lambda n: _by_mode(n, "split_free_milli", "split_gpus", 1000.0), right=True),
    Column("MIG-FREE", lambda n: _by_mode(n, "mig_free_slices", "mig_slices"), right=True),
    Column("MODES", _modes, wide=True),
    Column("FREE", lambda n: f"{sum(n.get('gpu_free_milli', [])) / 1000:g}", wide=True, right=True),
    Column("ONLINE", lambda n: n.get("online", True), wide=True),
    Column("CORDON-REASON", lambda n: n.get("cordon_reason"), wide=True, fit="cut"),
]


def cmd_nodes(args: argparse.Namespace) -> None:
    nodes = Client().nodes()
    if args.json:
        print_json(nodes)
        return
    print_table(f"{len(nodes)} node(s)", NODE_COLUMNS, nodes, wide(args))


def cmd_node_action(args: argparse.Namespace) -> None:
    result = Client().node_action(args.name, args.node_command, args.reason, args.operator or getpass.getuser())
    print(json.dumps(result, indent=2) if args.json else f"{args.node_command} {args.name}: accepted")


async def _send_fault(node: str, command: dict[str, object]) -> dict[str, object]:

    from libs.cli.audit import connect_live  # the bus client loads only for this command

    bus = await connect_live("gpusched-cli")
    try:
        reply = await bus.nc.request(f"{bus.config.subject_prefix}.agent.{node}.fault", json.dumps(command).encode(),
                                     timeout=3.0)
        return dict(json.loads(reply.data))
    finally:
        await bus.close()


def cmd_fault(args: argparse.Namespace) -> None:
    """Inject a fault into a node agent running the simulated backend (tests and demos)."""
    if args.xid is not None or args.ecc is not None:
        if args.gpu is None:
            raise ValueError("--xid and --ecc need --gpu INDEX")
        kind, code = ("xid", args.xid) if args.xid is not None else ("ecc", args.ecc)
        command: dict[str, object] = {"kind": kind, "gpu": args.gpu, "code": code}
    elif args.stop_heartbeats or args.resume_heartbeats or args.heartbeat_s is not None:
        command = {"kind": "heartbeats", "stop": bool(args.stop_heartbeats)}
        if args.heartbeat_s is not None:
            command["every_s"] = args.heartbeat_s
    else:
        raise ValueError("say which fault: --xid N, --ecc N, --stop-heartbeats, --resume-heartbeats or --heartbeat-s S")
    answer = asyncio.run(_send_fault(args.name, command))
    print(json.dumps(answer))
    if not answer.get("ok"):
        sys.exit(1)


def cmd_logs(args: argparse.Namespace) -> None:
    logs.cmd_logs(args)  # its last lines, or followed until the job is final (libs/cli/logs.py)


def cmd_checkpoint(args: argparse.Namespace) -> None:
    from libs.jobkit import checkpoint  # the bus client loads only for this command

    checkpoint(args.progress, args.ref)


def add_commands(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("nodes", help="list nodes: status, GPU models, healthy GPUs, free GPUs by sharing mode (idle, "
                                     "split into fractions, MIG)", description=NODES_HELP)
    add_table_flags(p)
    p.set_defaults(func=cmd_nodes)
    node = sub.add_parser("node", help="operate nodes: cordon, drain, uncordon, remove, inject simulated faults")
    nsub = node.add_subparsers(dest="node_command", required=True)
    for action, text in (("cordon", "no new jobs on the node"),
                         ("drain", "cordon, and stop its jobs (checkpointing) so they run elsewhere"),
                         ("uncordon", "take new jobs again"),
                         ("remove", "take the node out of the inventory (decommissioned, or nobody serves it): its "
                                    "jobs are requeued; it is back only when it registers again")):
        p = nsub.add_parser(action, help=text)
        p.add_argument("name")
        p.add_argument("--reason", default="")
        p.add_argument("--operator", help="who (default: your user name)")
        add_json_flag(p)
        p.set_defaults(func=cmd_node_action)
    p = nsub.add_parser("fault", help="inject a fault into a simulated node agent")
    p.add_argument("name")
    p.add_argument("--gpu", type=int)
    p.add_argument("--xid", type=int, help="an XID error on --gpu (79: fallen off the bus)")
    p.add_argument("--ecc", type=int, help="uncorrectable ECC errors on --gpu")
    p.add_argument("--stop-heartbeats", action="store_true")
    p.add_argument("--resume-heartbeats", action="store_true")
    p.add_argument("--heartbeat-s", type=float, help="heartbeat period (a slow node)")
    add_json_flag(p, help="accepted for symmetry: the agent's answer is always one JSON document")
    p.set_defaults(func=cmd_fault)
    p = sub.add_parser("logs", help="a job's output, from the node agent that ran it (-f: until it ends)")
    logs.add_arguments(p)
    add_json_flag(p, help="the lines shown and where they came from as one JSON document")
    p.set_defaults(func=cmd_logs)
    p = sub.add_parser("checkpoint", help="inside a job: record that its state is saved")
    p.add_argument("--progress", type=float, required=True, help="seconds of the job's work the state holds")
    p.add_argument("--ref", default="", help="where the checkpoint is (path or URI)")
    p.set_defaults(func=cmd_checkpoint)
