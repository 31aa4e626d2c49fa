"""`gpusched queues` (the tree, per queue and GPU model) and `gpusched queue set` (change one queue)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from libs.cli.client import ApiError, Client
from libs.cli.jobs import _print_json, _table

QUEUE_FLAGS = {  # flag -> QueueSpec field
    "team": "team", "parent": "parent", "cohort": "cohort", "nominal": "nominal_gpus",
    "borrowing_limit": "borrowing_limit_gpus", "lending_limit": "lending_limit_gpus", "weight": "weight",
    "placement_policy": "placement_policy", "budget_gpu_hours": "budget_gpu_hours", "budget_period": "budget_period",
    "over_budget": "over_budget", "user_max_gpus": "user_max_gpus", "reclaim_after": "reclaim_after_s",
}
# The flags whose value may be "none" (the field unset: no limit); elsewhere "none" is just a string.
NULLABLE_FLAGS = frozenset({"nominal", "borrowing_limit", "lending_limit", "user_max_gpus", "budget_gpu_hours"})
SHORTHAND_FLAGS = ("nominal", "borrowing_limit", "lending_limit")  # the single any-model flavor's fields


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:g}"


def queue_rows(queues: list[dict[str, Any]]) -> list[list[Any]]:
    """One row per queue and flavor (a queue without quota, or a parent, gets one row)."""
    rows = []
    for q in queues:
        where = q.get("cohort") or "-"
        common = [q["pending"], q["running"], f"{q.get('fair_share', 0.0):.2f}",
                  _num(q.get("budget_left_gpu_hours"))]
        flavors = q.get("flavors") or [None]
        for f in flavors:
            if f is None:
                rows.append([q["name"], where, "-", _num(q.get("nominal_gpus")), "-", "-", "-",
                             _num(q.get("reserved_gpus")), *common])
            else:
                rows.append([q["name"], where, f["flavor"], _num(f["nominal_gpus"]),
                             _num(f.get("borrowing_limit_gpus")), _num(f["lent_gpus"]), _num(f["borrowed_gpus"]),
                             _num(f["in_use_gpus"]), *common])
    return rows


def cmd_queues(args: argparse.Namespace) -> None:
    queues = Client().queues()
    if args.json:
        _print_json(queues)
        return
    _table("queues", ["queue", "cohort", "flavor", "nominal", "borrow limit", "lent", "borrowed", "in use",
                      "pending", "running", "fair share", "budget left (GPU-h)"], queue_rows(queues))


def parse_flavor(text: str) -> dict[str, Any]:
    """MODEL=NOMINAL[:BORROWING_LIMIT[:LENDING_LIMIT]], e.g. H100=8:4:2 or A100=16."""
    model, _, limits = text.partition("=")
    parts = limits.split(":")
    usage = f"--flavor {text!r}: expected MODEL=NOMINAL[:BORROW[:LEND]]"
    if not model or not parts[0] or len(parts) > 3:
        raise ValueError(usage)
    try:
        out: dict[str, Any] = {"model": model, "nominal_gpus": int(parts[0])}
        for name, value in zip(("borrowing_limit_gpus", "lending_limit_gpus"), parts[1:], strict=False):
            if value:
                out[name] = int(value)
    except ValueError:
        raise ValueError(f"{usage}, with whole numbers of GPUs") from None
    return out


def queue_spec(current: dict[str, Any] | None, name: str, args: argparse.Namespace) -> dict[str, Any]:
    """The queue's spec after applying the flags to its current one (or to a new one)."""
    spec: dict[str, Any] = dict(current or {"name": name})
    if spec.get("flavors") and not args.flavor and any(getattr(args, f) is not None for f in SHORTHAND_FLAGS):
        if args.nominal is None:
            raise ValueError(f"queue {name} has per-model flavors: change them with --flavor "
                             "MODEL=NOMINAL[:BORROW[:LEND]] (or give --nominal to replace them by one quota)")
        spec.pop("flavors")  # --nominal replaces the per-model quotas by one quota for any model
    for flag, field in QUEUE_FLAGS.items():
        value = getattr(args, flag)
        if value is not None:
            spec[field] = None if flag in NULLABLE_FLAGS and value == "none" else value
    if args.flavor:
        spec["flavors"] = [parse_flavor(f) for f in args.flavor]
        for field in ("nominal_gpus", "borrowing_limit_gpus", "lending_limit_gpus"):
            spec.pop(field, None)
    spec.setdefault("team", name)
    return spec


def cmd_queue_set(args: argparse.Namespace) -> None:
    client = Client()
    try:
        current = client.queue(args.name).get("spec")
    except ApiError as err:
        if err.status != 404:
            raise
        current = None
    try:
        spec = queue_spec(current, args.name, args)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        raise SystemExit(2) from None
    written = client.put_queue(args.name, spec)
    if args.json:
        _print_json(written)
    else:
        print(f"queue {args.name} {'created' if current is None else 'updated'}; the change is in the log")


def _float_or_none(text: str) -> float | str:
    return "none" if text == "none" else float(text)


def _int_or_none(text: str) -> int | str:
    return "none" if text == "none" else int(text)


def add_commands(sub: argparse._SubParsersAction) -> None:
    sub.add_parser("queues", help="queues per GPU model: quota, lent, borrowed, use, fair share, budget"
                   ).set_defaults(func=cmd_queues)
    queue = sub.add_parser("queue", help="change the queue tree").add_subparsers(dest="queue_command", required=True)
    p = queue.add_parser("set", help="create or change one queue (unset flags keep their value)")
    p.add_argument("name")
    p.add_argument("--team")
    p.add_argument("--parent")
    p.add_argument("--cohort")
    p.add_argument("--nominal", type=_int_or_none, help="nominal GPUs of any model ('none': no limit)")
    p.add_argument("--borrowing-limit", type=_int_or_none, help="GPUs it may borrow above nominal ('none')")
    p.add_argument("--lending-limit", type=_int_or_none, help="GPUs of its nominal it lends ('none': all)")
    p.add_argument("--flavor", action="append", help="per GPU model: MODEL=NOMINAL[:BORROW[:LEND]] (repeatable, in "
                   "preference order); replaces --nominal")
    p.add_argument("--weight", type=float)
    p.add_argument("--placement-policy")
    p.add_argument("--budget-gpu-hours", type=_float_or_none, help="GPU-hours per period ('none': no budget)")
    p.add_argument("--budget-period", choices=["day", "week", "month"])
    p.add_argument("--over-budget", choices=["borrow", "wait"])
    p.add_argument("--user-max-gpus", type=_int_or_none)
    p.add_argument("--reclaim-after", type=float, help="seconds before borrowers are preempted to reclaim")
    # Here, after the queue's name (main adds --json only to the top-level commands). SUPPRESS when absent, so
    # that `gpusched queue --json set ...` keeps working too.
    p.add_argument("--json", action="store_true", default=argparse.SUPPRESS, help="machine-readable output")
    p.set_defaults(func=cmd_queue_set)
