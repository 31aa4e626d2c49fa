"""Safety: what must hold at every stream sequence, checked by folding the log once in order."""

from __future__ import annotations

from collections.abc import Sequence

from contracts import (
    EventBase,
    JobCheckpointed,
    JobEvicted,
    JobFailed,
    JobFinished,
    JobPlaced,
    JobReady,
    JobSpec,
    JobStarted,
    JobSubmitted,
    NodeRegistered,
    PreemptionDecided,
    QueuePolicyChanged,
    QuotaReleased,
    QuotaReserved,
    SubmitJob,
)
from libs.audit.guarantees.capacity import Capacity
from libs.audit.guarantees.device_groups import device_group_violations
from libs.audit.guarantees.gangs import gang_violations
from libs.audit.guarantees.queue_policies import QueuePolicies
from libs.audit.guarantees.quota_limits import QuotaLimits
from libs.audit.guarantees.violation import Violation
from libs.core.kernel.runs import CurrentRuns

# Executor reports: what an executor says about its runs (a stop of runs a new node spec no longer fits among them).
EXECUTOR_REPORTS = (JobStarted, JobReady, JobCheckpointed, JobFinished, JobFailed, JobEvicted)


def check_safety(events: Sequence[tuple[int, EventBase]]) -> list[Violation]:
    """Every moment the log broke a safety guarantee, in log order: capacity (GPU share, GPU memory, MIG
    slices, host CPU, memory and RDMA NICs), double placement, gangs, quota ceilings, lending limits, parent
    quotas, the nominal quota a reclaim must leave its victims' queues, and the queues' preemption and flavor
    settings."""
    capacity = Capacity()
    quota = QuotaLimits()
    policies = QueuePolicies()
    specs: dict[str, JobSpec] = {}
    # An executor's report about a run that is over (a late finish racing an eviction, a slow agent's) does not
    # release the job's current run: the core's own rule (libs/core/kernel/runs.py).
    runs = CurrentRuns()
    out: list[Violation] = []
    # Nodes registered again whose runs are judged once the executors had their say: node -> (seq, ts).
    reregistered: dict[str, tuple[int, float]] = {}
    for seq, event in events:
        quota.seq = seq
        if reregistered and not isinstance(event, EXECUTOR_REPORTS):
            for node, (at_seq, at_ts) in list(reregistered.items()):
                if event.ts > at_ts:
                    del reregistered[node]
                    out.extend(capacity.overcommitted(seq, node, at_seq))
        if runs.is_stale(event):
            continue
        runs.fold(event)
        policies.fold(event)
        match event:
            case JobPlaced():
                spec = specs.get(event.job_id)
                out.extend(capacity.place(seq, event, spec))
                quota.placed(event)
                out.extend(gang_violations(seq, event, spec, capacity.cluster))
                out.extend(device_group_violations(seq, event, spec, capacity.cluster))
            case JobFinished() | JobFailed() | JobEvicted():
                capacity.release(event.job_id)
            case QuotaReserved():
                quota.bind_policy(event.trigger_seq or seq)  # (judged on the book before the reservation)
                out.extend(policies.reserved(seq, event, specs.get(event.job_id), quota.book, quota.held, specs))
                out.extend(quota.reserved(seq, event, specs.get(event.job_id)))
            case QuotaReleased():
                quota.released(event)
            case PreemptionDecided():
                out.extend(quota.preemption(seq, event, specs))
                out.extend(policies.preemption(seq, event, specs.get(event.preemptor_id), quota.book))
            case JobSubmitted():
                specs[event.job_id] = event.spec
            case SubmitJob():
                specs.setdefault(event.job_id, event.spec)
            case NodeRegistered():
                capacity.register(event.node)
                reregistered[event.node.name] = (seq, event.ts)
            case QueuePolicyChanged():
                quota.queue_policy(seq, event)
    return out
