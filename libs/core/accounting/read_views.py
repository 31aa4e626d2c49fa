"""The ledger's node and queue views, read off its books as of the last event folded: what the projector writes
and the API answers. Reading a view changes nothing but naming a queue (its empty counters)."""

from __future__ import annotations

from contracts.views import FlavorUsage, NodeView, QueueView
from libs.core.accounting.state import LedgerState
from libs.core.accounting.view_books import HELD, UNPLACED
from libs.core.cluster.nodes import Gpu
from libs.core.kernel.accelerators import kind_of
from libs.core.kernel.gpu_units import FULL


def node_view(books: LedgerState, name: str) -> NodeView:
    node = books.cluster.nodes[name]
    free = tuple(gpu.free_milli for gpu in node.gpus)
    modes = tuple(_gpu_mode(books, name, gpu) for gpu in node.gpus)
    cordon, reason = books.cordons.get(name, ("", ""))
    view = NodeView(cordon=cordon, cordon_reason=reason,
        name=name, online=node.online, gpus=len(node.gpus),
        models=tuple(sorted({gpu.model for gpu in node.gpus})),
        kinds=tuple(sorted({kind_of(gpu.model) for gpu in node.gpus})),
        allocated_gpus=sum(FULL - milli for milli in free) / FULL,
        healthy_gpus=sum(1 for gpu in node.gpus if gpu.healthy), gpu_free_milli=free, gpu_modes=modes,
        seq=books.last_seq)
    # Free capacity by the kind of work each GPU takes: a MIG-enabled GPU's free share is free MIG slices,
    # which no whole-GPU job or fraction can use (nor the other way round).
    for gpu, mode in zip(node.gpus, modes, strict=True):
        if not gpu.healthy:
            continue
        if mode == "mig":
            view.mig_gpus += 1
            view.mig_slices += gpu.mig_product.slices if gpu.mig_product is not None else 0
            view.mig_free_slices += gpu.free_slices
        elif mode == "split":
            view.split_gpus += 1
            view.split_free_milli += gpu.free_milli
        elif gpu.idle:
            view.idle_gpus += 1
    return view


def _gpu_mode(books: LedgerState, node: str, gpu: Gpu) -> str:
    """mig (MIG-enabled, or MIG instances still on it), split (fractions hold it) or whole."""
    if gpu.mig_enabled or gpu.mig_instances:
        return "mig"
    return "split" if books.split_gpus.is_split(node, gpu.index) else "whole"


def queue_view(books: LedgerState, name: str) -> QueueView:
    """The queue's counters with its quota figures as of the last event folded."""
    counters = books.queue(name)
    quota, book = books.quota, books.quota.book
    spec = quota.policy.queues.get(name)
    flavors = []
    for flavor, lim in book.limits.get(name, {}).items():
        flavors.append(FlavorUsage(
            flavor=flavor, nominal_gpus=lim.nominal / FULL,
            borrowing_limit_gpus=None if lim.borrow is None else lim.borrow / FULL,
            lending_limit_gpus=None if lim.lend == lim.nominal else lim.lend / FULL,
            in_use_gpus=book.usage(name, flavor) / FULL, borrowed_gpus=book.borrowed(name, flavor) / FULL,
            lent_gpus=book.lent(name, flavor) / FULL, held_gpus=books.holds.gpus(name, HELD, flavor),
            unplaced_gpus=books.holds.gpus(name, UNPLACED, flavor)))
    governed = book.governed(name) or bool(book.children.get(name))
    left = quota.budget_left_s(name, books.last_ts)
    return QueueView(
        name=name, team=counters.team, nominal_gpus=book.nominal_of(name) // FULL if governed else None,
        reserved_gpus=counters.reserved_gpus, held_gpus=books.holds.gpus(name, HELD),
        unplaced_gpus=books.holds.gpus(name, UNPLACED), pending=counters.pending, running=counters.running,
        parent=spec.parent if spec else "", cohort=book.cohort.get(name, ""),
        weight=spec.weight if spec else 1.0, flavors=flavors,
        fair_share=round(quota.fair_share(name, books.last_ts), 4) if spec else 0.0,
        budget_gpu_hours=spec.budget_gpu_hours if spec else None,
        budget_left_gpu_hours=None if left is None else round(left / 3600, 3), spec=spec, seq=counters.seq)
