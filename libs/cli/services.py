"""`gpusched inference deploy|list|show|load|delete`: inference services through the API."""

from __future__ import annotations

import argparse
import json
from typing import Any

from libs.cli.client import Client
from libs.cli.output import add_json_flag, add_table_flags, wide
from libs.cli.tables import Column, print_table
from libs.core.admission.inference_services import METRICS

SERVICE_COLUMNS: list[Column[dict[str, Any]]] = [
    Column("NAME", lambda s: s["name"]),
    Column("TEAM", lambda s: s["team"]),
    Column("QUEUE", lambda s: s["queue"]),
    Column("PRIORITY", lambda s: s.get("priority"), wide=True),
    Column("READY", lambda s: s["ready_replicas"], right=True),
    Column("DESIRED", lambda s: s["desired_replicas"], right=True),
    Column("REPLICAS", lambda s: s.get("replicas"), wide=True, right=True),
    Column("MIN-MAX", lambda s: f"{s['min_replicas']}-{s['max_replicas']}", right=True),
    Column("LOAD", lambda s: f"{s.get('load', 0.0):g}", right=True),
    Column("METRIC", lambda s: s.get("metric"), wide=True),
]


def service_spec(args: argparse.Namespace) -> dict[str, Any]:
    """The ServiceSpec the flags describe (JSON, as the API takes it)."""
    replica: dict[str, Any] = {"team": args.team, "queue": args.queue, "priority": args.priority,
                               "workload": "inference", "gpus": args.gpus}
    for flag, key in (("gpu_milli", "gpu_milli"), ("gpu_memory_mib", "gpu_memory_mib"), ("cpu_milli", "cpu_milli"),
                      ("memory_mib", "memory_mib")):
        if getattr(args, flag):
            replica[key] = getattr(args, flag)
    if args.gpu_model:
        replica["gpu_models"] = args.gpu_model
    if args.command:
        replica["command"] = args.command
    spec: dict[str, Any] = {"name": args.name, "replica": replica, "min_replicas": args.min,
                            "max_replicas": max(args.max, args.min), "spread": not args.no_spread}
    if args.target is not None:
        spec["autoscaling"] = {"metric": args.metric, "target_per_replica": args.target,
                               "scale_down_window_s": args.scale_down_window, "scale_up_cooldown_s": args.cooldown,
                               "scale_down_cooldown_s": args.cooldown}
    return spec


def cmd_deploy(args: argparse.Namespace) -> None:
    result = Client().deploy_service(service_spec(args))
    print(json.dumps(result, indent=2) if args.json else f"service {result['name']}: {result['state']}")


def cmd_list(args: argparse.Namespace) -> None:
    services = Client().services()
    if args.json:
        print(json.dumps(services, indent=2))
        return
    print_table(None, SERVICE_COLUMNS, services, wide(args))


def cmd_show(args: argparse.Namespace) -> None:
    print(json.dumps(Client().service(args.name), indent=2))


def cmd_load(args: argparse.Namespace) -> None:
    result = Client().report_load(args.name, args.value, args.metric)
    print(json.dumps(result) if args.json else f"{args.name}: {args.metric} {args.value:g} reported")


def cmd_delete(args: argparse.Namespace) -> None:
    result = Client().delete_service(args.name)
    print(json.dumps(result) if args.json else f"service {args.name}: deleting")


def add_commands(sub: argparse._SubParsersAction) -> None:
    service = sub.add_parser("inference", help="inference services: deploy, list, show, report load, delete")
    ssub = service.add_subparsers(dest="service_command", required=True)
    p = ssub.add_parser("deploy", help="create a service, or change its replica bounds and autoscaling")
    p.add_argument("name")
    p.add_argument("--team", required=True)
    p.add_argument("--queue", required=True)
    p.add_argument("--priority", default="production-inference")
    p.add_argument("--gpus", type=int, default=1, help="whole GPUs per replica (1 with --gpu-milli)")
    p.add_argument("--gpu-milli", type=int, default=0, help="a share of one GPU per replica, in thousandths")
    p.add_argument("--gpu-memory-mib", type=int, default=0)
    p.add_argument("--cpu-milli", type=int, default=0)
    p.add_argument("--memory-mib", type=int, default=0)
    p.add_argument("--gpu-model", action="append", help="an allowed GPU model (repeatable)")
    p.add_argument("--min", type=int, default=1, help="fewest replicas (0: scale to zero when idle)")
    p.add_argument("--max", type=int, default=1, help="most replicas")
    p.add_argument("--metric", default="requests_per_s", choices=METRICS)
    p.add_argument("--target", type=float, help="load per replica to aim at; without it the count is --min")
    p.add_argument("--scale-down-window", type=float, default=300.0, help="seconds a fall must last to scale down")
    p.add_argument("--cooldown", type=float, default=0.0, help="seconds between two scale-ups, and before a "
                                                              "scale-down")
    p.add_argument("--no-spread", action="store_true", help="let replicas share racks and nodes")
    add_json_flag(p)
    p.add_argument("command", nargs="*", help="after --: the command each replica runs")
    p.set_defaults(func=cmd_deploy)
    p = ssub.add_parser("list", help="every service with its replicas and load")
    add_table_flags(p)
    p.set_defaults(func=cmd_list)
    p = ssub.add_parser("show", help="one service, as JSON")
    p.add_argument("name")
    add_json_flag(p, help="accepted for symmetry: the service is always shown as one JSON document")
    p.set_defaults(func=cmd_show)
    p = ssub.add_parser("load", help="report a service's load (what its gateway would send)")
    p.add_argument("name")
    p.add_argument("value", type=float)
    p.add_argument("--metric", default="requests_per_s", choices=METRICS)
    add_json_flag(p)
    p.set_defaults(func=cmd_load)
    p = ssub.add_parser("delete", help="stop every replica and forget the service")
    p.add_argument("name")
    add_json_flag(p)
    p.set_defaults(func=cmd_delete)
