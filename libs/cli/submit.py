"""`gpusched submit`: a job from flags."""

from __future__ import annotations

import argparse
from typing import Any

from rich.console import Console

from libs.cli.client import Client
from libs.cli.output import add_json_flag, print_json

console = Console()


def cmd_submit(args: argparse.Namespace) -> None:
    spec: dict[str, Any] = {"team": args.team, "queue": args.queue, "gpus": args.gpus, "replicas": args.replicas,
                            "priority": args.priority}
    optional = {"gpu_milli": args.gpu_milli, "duration_s": args.duration, "user": args.user, "name": args.name,
                "idempotency_key": args.key, "cpu_milli": args.cpu_milli, "memory_mib": args.memory_mib,
                "project": args.project, "checkpoint_interval_s": args.checkpoint_interval}
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if command:
        spec["command"] = command
    spec.update({k: v for k, v in optional.items() if v is not None})
    if args.gpu_milli:
        spec["gpus"] = 1
    if args.model:
        spec["gpu_models"] = args.model
    created = Client().submit(spec)
    if args.json:
        print_json({**created, "spec": spec})
    else:
        console.print(f"submitted [bold]{created['id']}[/bold] ({created['state']})")



def add_command(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("submit", help="submit a job")
    p.add_argument("--team", required=True)
    p.add_argument("--queue", required=True)
    p.add_argument("--gpus", type=int, default=1, help="whole GPUs per replica")
    p.add_argument("--gpu-milli", type=int, help="a fraction of one GPU per replica, 1..999")
    p.add_argument("--model", action="append", help="allowed GPU model (repeatable)")
    p.add_argument("--replicas", type=int, default=1)
    p.add_argument("--priority", default="training", help="priority class")
    p.add_argument("--duration", type=float, help="declared runtime in seconds")
    p.add_argument("--cpu-milli", type=int)
    p.add_argument("--memory-mib", type=int)
    p.add_argument("--user")
    p.add_argument("--name")
    p.add_argument("--key", help="idempotency key: the same key returns the same job")
    p.add_argument("--project", help="what the GPU time is charged to inside the team")
    p.add_argument("--checkpoint-interval", type=float, help="seconds between the job's own checkpoints")
    p.add_argument("command", nargs=argparse.REMAINDER,
                   help="after --: the command node agents run (e.g. -- python train.py --epochs 3)")
    add_json_flag(p)
    p.set_defaults(func=cmd_submit)
