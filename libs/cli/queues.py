"""`gpusched queues` (the tree, per queue and GPU model) and `gpusched queue set` (change one queue)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Any

from contracts.model import QUEUE_POLICY_CHOICES as POLICY_CHOICES
from libs.cli.client import ApiError, Client
from libs.cli.output import add_json_flag, add_table_flags, print_json, wide
from libs.cli.tables import Column, print_table

QUEUE_FLAGS = {  # flag -> QueueSpec field
    "team": "team", "parent": "parent", "cohort": "cohort", "nominal": "nominal_gpus",
    "borrowing_limit": "borrowing_limit_gpus", "lending_limit": "lending_limit_gpus", "weight": "weight",
    "placement_policy": "placement_policy", "budget_gpu_hours": "budget_gpu_hours", "budget_period": "budget_period",
    "over_budget": "over_budget", "user_max_gpus": "user_max_gpus", "reclaim_after": "reclaim_after_s",
    "las_threshold_gpu_hours": "las_threshold_gpu_hours", "reclaim_within_cohort": "reclaim_within_cohort",
    "within_queue_preemption": "within_queue_preemption", "borrow_within_cohort": "borrow_within_cohort",
    "borrow_within_cohort_max_priority": "borrow_within_cohort_max_priority", "when_can_borrow": "when_can_borrow",
    "when_can_preempt": "when_can_preempt",
}
# The flags whose value may be "none" (the field unset: no limit); elsewhere "none" is just a string.
NULLABLE_FLAGS = frozenset({"nominal", "borrowing_limit", "lending_limit", "user_max_gpus", "budget_gpu_hours",
                            "las_threshold_gpu_hours", "borrow_within_cohort_max_priority"})
SHORTHAND_FLAGS = ("nominal", "borrowing_limit", "lending_limit")  # the single any-model flavor's fields


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:g}"


QueueRow = tuple[dict[str, Any], dict[str, Any] | None]  # a queue, and one of its flavors (None: no quota)


def queue_rows(queues: list[dict[str, Any]]) -> list[QueueRow]:
    """One row per queue and flavor (a queue without quota, or a parent, gets one row)."""
    return [(q, f) for q in queues for f in (q.get("flavors") or [None])]


def _flavor(key: str) -> Callable[[QueueRow], str]:
    """A flavor's figure; "-" on a queue's row without flavors."""
    return lambda r: "-" if r[1] is None else _num(r[1].get(key))


def _quota(key: str, queue_key: str | None = None) -> Callable[[QueueRow], str]:
    """A figure of the row's flavor, or (a queue without per-model quota) of the queue; "-" where the API gives
    none (an older one)."""
    return lambda r: _num(r[0].get(queue_key or key) if r[1] is None else r[1].get(key))


# `gpusched queues`: quota per model, split into what placed jobs hold and what waiting jobs reserved, the jobs and
# the fair share by default; the tree, limits, lending, total use and budgets with -o wide.
QUEUE_COLUMNS: list[Column[QueueRow]] = [
    Column("QUEUE", lambda r: r[0]["name"]),
    Column("PARENT", lambda r: r[0].get("parent"), wide=True),
    Column("COHORT", lambda r: r[0].get("cohort"), wide=True),
    Column("MODEL", lambda r: "-" if r[1] is None else r[1]["flavor"]),
    Column("NOMINAL", lambda r: _num(r[0].get("nominal_gpus") if r[1] is None else r[1].get("nominal_gpus")),
           right=True),
    Column("BORROW-LIMIT", _flavor("borrowing_limit_gpus"), wide=True, right=True),
    Column("LEND-LIMIT", _flavor("lending_limit_gpus"), wide=True, right=True),
    Column("HELD", _quota("held_gpus"), right=True),
    Column("UNPLACED", _quota("unplaced_gpus"), right=True),
    Column("USED", _quota("in_use_gpus", "reserved_gpus"), wide=True, right=True),
    Column("BORROWED", _flavor("borrowed_gpus"), right=True),
    Column("LENT", _flavor("lent_gpus"), wide=True, right=True),
    Column("PEND", lambda r: r[0]["pending"], right=True),
    Column("RUN", lambda r: r[0]["running"], right=True),
    Column("WEIGHT", lambda r: _num(r[0].get("weight", 1.0)), wide=True, right=True),
    Column("SHARE", lambda r: f"{r[0].get('fair_share', 0.0):.2f}", right=True),
    Column("BUDGET", lambda r: _num(r[0].get("budget_gpu_hours")), wide=True, right=True),
    Column("BUDGET-LEFT", lambda r: _num(r[0].get("budget_left_gpu_hours")), wide=True, right=True),
]
# What the quota columns mean (the command's help and the README say the same).
QUEUE_COLUMNS_HELP = ("HELD: quota (GPUs) held by the queue's jobs that have their GPUs (placed or running); "
                      "UNPLACED: quota reserved by its jobs that wait for a node to take them (a job holds its quota "
                      "while it waits for GPUs); -o wide: USED, their sum as quota counts it")


def cmd_queues(args: argparse.Namespace) -> None:
    queues = Client().queues()
    if args.json:
        print_json(queues)
        return
    print_table("queues (GPUs)", QUEUE_COLUMNS, queue_rows(queues), wide(args))


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
        print_json(written)
    else:
        print(f"queue {args.name} {'created' if current is None else 'updated'}; the change is in the log")


def _float_or_none(text: str) -> float | str:
    return "none" if text == "none" else float(text)


def _int_or_none(text: str) -> int | str:
    return "none" if text == "none" else int(text)


def add_commands(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("queues", help="queues per GPU model: quota, held and unplaced, borrowed, jobs, fair share "
                                      "(-o wide: the tree, limits, lent, weight, budget)",
                       description=QUEUE_COLUMNS_HELP)
    add_table_flags(p)
    p.set_defaults(func=cmd_queues)
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
    p.add_argument("--las-threshold-gpu-hours", type=_float_or_none,
                   help="least attained service: a job past this many GPU-hours waits behind, and may be preempted "
                        "for, the queue's jobs of its priority below it ('none': off)")
    # Kueue's ClusterQueue preemption and flavorFungibility, by gpusched's names (libs/core/kernel/queue_policies.py).
    for name, choices in POLICY_CHOICES.items():
        p.add_argument(f"--{name.replace('_', '-')}", choices=choices, help=f"default {choices[0]}")
    p.add_argument("--borrow-within-cohort-max-priority", type=_int_or_none,
                   help="the highest priority a borrowing preemptor may evict ('none': below its own)")
    add_json_flag(p)  # after the queue's name; `gpusched queue --json set ...` works too (see libs/cli/output.py)
    p.set_defaults(func=cmd_queue_set)
