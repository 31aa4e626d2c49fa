"""Least privilege on the bus: one NATS user per service, each allowed to publish only its own decisions.

The NATS server checks every publish against the publishing user's permissions, so a compromised or buggy
placement service cannot write a `QuotaReserved`, and an auditor cannot write at all. `render_config` turns
the map below into the server's `authorization` block (`gpusched nats-config`); passwords stay out of it as
`$GPUSCHED_NATS_<USER>_PASSWORD` references the server resolves from its environment.

`PUBLISHES` is declared rather than discovered: it is security policy and is reviewed like code. Two tests
keep it equal to what the code does: tests/unit/runtime/test_nats_permissions_render.py finds, in each service's
source, every event type it constructs or emits, and tests/integration/test_nats_permissions.py runs the
platform under the rendered config and fails on any refused publish.

The stream is created by the operator user (`gpusched nats-setup`), once: services may only look it up, so
none of them can create it with weaker settings (without deny-delete, say) or change it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Final

from contracts.events import (
    SUBJECT_PREFIX,
    AuditCheckpoint,
    CancelJob,
    ClockTick,
    CordonNode,
    DeleteService,
    DeployService,
    EventBase,
    GpuFault,
    GpuHealthChanged,
    JobAdmitted,
    JobCancelled,
    JobCheckpointed,
    JobEvicted,
    JobFailed,
    JobFinished,
    JobPlaced,
    JobReady,
    JobRejected,
    JobStarted,
    JobSubmitted,
    NodeCordoned,
    NodeLost,
    NodeRegistered,
    NodeUncordoned,
    PlacementDeferred,
    PreemptionDecided,
    PriorityClassesChanged,
    QueuePolicyChanged,
    QuotaDeferred,
    QuotaRecalled,
    QuotaReleased,
    QuotaReserved,
    RemoveNode,
    ReportServiceLoad,
    SchedulingSettingsChanged,
    ServiceDeleted,
    ServiceDeployed,
    ServiceRejected,
    ServiceScaled,
    SubmitJob,
    UncordonNode,
    subject_for_type,
)
from libs.bus.fencing import fence_subject
from libs.bus.jetstream import DEFAULT_STREAM, inbox_prefix
from libs.bus.lease import lease_bucket_name
from libs.bus.snapshot_store import snapshot_stream_name, snapshot_subjects

OPERATOR: Final = "operator"  # sets the server up (creates the streams); may do anything
AUDITOR: Final = "auditor"  # reads the log and the dead letters; publishes nothing
AGENT: Final = "agent"  # the node agents' shared user (or one user per node: `agent_nodes`)

_EXECUTOR_REPORTS: frozenset[type[EventBase]] = frozenset({JobStarted, JobReady, JobFinished, JobFailed, JobEvicted,
                                                           JobCheckpointed})

# What each service writes to the log. A service whose decisions form a hash chain also writes its signed
# AuditCheckpoints (libs/runtime/reactor.py); accounting and the agents keep no chain.
PUBLISHES: Final[Mapping[str, frozenset[type[EventBase]]]] = {
    # Its API's commands and queue changes, and its own decisions.
    "admission": frozenset({SubmitJob, CancelJob, CordonNode, UncordonNode, RemoveNode, QueuePolicyChanged,
                            DeployService, DeleteService, ReportServiceLoad, JobSubmitted, JobAdmitted, JobRejected,
                            JobCancelled, ServiceDeployed, ServiceRejected, ServiceScaled, ServiceDeleted,
                            AuditCheckpoint}),
    # Its decisions, and the policy file's changes it publishes at start (libs/runtime/policy_file.py).
    "quota": frozenset({QuotaReserved, QuotaReleased, QuotaRecalled, QuotaDeferred, QueuePolicyChanged,
                        PriorityClassesChanged, SchedulingSettingsChanged, AuditCheckpoint}),
    "placement": frozenset({JobPlaced, PlacementDeferred, AuditCheckpoint}),
    "preemption": frozenset({PreemptionDecided, AuditCheckpoint}),
    "accounting": frozenset(),  # reads everything, writes Redis views and metrics only
    # The clock, the node-health decisions, the simulated cluster's inventory and executor, the nodes it
    # removes because nobody serves them, and the evictions it reports for jobs on nodes nobody serves.
    "node-telemetry": frozenset({ClockTick, NodeRegistered, NodeLost, GpuHealthChanged, NodeCordoned,
                                 NodeUncordoned, AuditCheckpoint, *_EXECUTOR_REPORTS}),
    AGENT: frozenset({NodeRegistered, GpuFault, *_EXECUTOR_REPORTS}),
}

SERVICES: Final[tuple[str, ...]] = tuple(name for name in PUBLISHES if name != AGENT)

_TOKEN = re.compile(r"[^.*>\s]+")  # one subject token: no dots, wildcards or white space


@dataclass(frozen=True, slots=True)
class Permissions:
    publish: tuple[str, ...]
    publish_deny: tuple[str, ...] = ()
    subscribe: tuple[str, ...] = ()
    # May answer requests it received (on their reply subjects) without a grant to publish on `_INBOX.>`.
    allow_responses: bool = False


@dataclass(frozen=True, slots=True)
class User:
    name: str
    comment: str
    permissions: Permissions | None  # None: no restriction (the operator)


def password_env(user: str) -> str:
    """The server-side environment variable holding `user`'s password."""
    return "GPUSCHED_NATS_" + re.sub(r"[^A-Z0-9]", "_", user.upper()) + "_PASSWORD"


def agent_user(node: str) -> str:
    return f"{AGENT}-{node}"


def log_subject(prefix: str, event_type: type[EventBase]) -> str:
    """`<prefix>.c.<Command>` or `<prefix>.e.<Event>`, as Bus.subject_for_type."""
    return prefix + subject_for_type(event_type)[len(SUBJECT_PREFIX):]


# --- JetStream API ------------------------------------------------------------------------------


def _consumer_api(stream: str, action: str, consumer: str) -> str:
    return f"$JS.API.CONSUMER.{action}.{stream}.{consumer}"


def _reader_rights(stream: str) -> list[str]:
    # Readers (replay, catch-up, audit) are ephemeral consumers the client names at random, so creating
    # one and pulling from it cannot be tied to a name: `*`, with the other users' durables denied.
    return [_consumer_api(stream, "CREATE", "*"), _consumer_api(stream, "MSG.NEXT", "*")]


def _replica_rights(prefix: str, stream: str, service: str) -> list[str]:
    """Its snapshots (libs/bus/snapshot_store.py: write its own, read any), its lease (libs/bus/lease.py) and its
    epoch marker (libs/bus/fencing.py). The snapshot stream, the lease bucket and the epoch subjects are made by
    `gpusched nats-setup`, so the services only look them up."""
    snaps, leases = snapshot_stream_name(stream), lease_bucket_name(stream)
    return [*snapshot_subjects(prefix, service), f"$JS.API.STREAM.INFO.{snaps}", f"$JS.API.DIRECT.GET.{snaps}",
            f"$JS.API.DIRECT.GET.{snaps}.{prefix}.snap.{service}.manifest", fence_subject(prefix, service),
            f"$JS.API.STREAM.MSG.GET.{stream}", f"$KV.{leases}.{service}", f"$JS.API.STREAM.INFO.KV_{leases}",
            f"$JS.API.DIRECT.GET.KV_{leases}.$KV.{leases}.{service}"]


def _consumer_rights(stream: str, durable: str) -> list[str]:
    """Look the log up, run its durable consumer (look up, re-create, pull, acknowledge) and readers. The
    reactor names a service's durable after the service, and a node agent's `agent-<node>`, like its user."""
    return [f"$JS.API.STREAM.INFO.{stream}", f"$JS.API.STREAM.INFO.{stream}_DLQ", *_reader_rights(stream),
            _consumer_api(stream, "INFO", durable), _consumer_api(stream, "DELETE", durable),
            f"$JS.ACK.{stream}.{durable}.>"]


# What could disturb another user's durable consumer: re-creating it (it would start over), pulling from
# it (its messages would go elsewhere), deleting it, acknowledging on it (its service would skip them).
DISTURBING: Final = ("CREATE", "MSG.NEXT", "DELETE", "ACK")


def _others_denied(stream: str, durables: Iterable[str], actions: Sequence[str]) -> list[str]:
    return [f"$JS.ACK.{stream}.{d}.>" if action == "ACK" else _consumer_api(stream, action, d)
            for d in sorted(durables) for action in actions]


# --- users --------------------------------------------------------------------------------------


def _service_user(service: str, prefix: str, stream: str, durables: frozenset[str]) -> User:
    publish = sorted(log_subject(prefix, t) for t in PUBLISHES[service])
    publish += [f"{prefix}.dlq.{service}", *_consumer_rights(stream, service),
                *_replica_rights(prefix, stream, service)]
    subscribe = [f"{inbox_prefix(service)}.>"]
    if service == "admission":
        publish.append(f"{prefix}.logs")  # asks the agents for a job's log (plain NATS request)
    if service == "node-telemetry":
        subscribe.append(f"{prefix}.hb.*")  # the agents' heartbeats
    # Its own durable is named exactly; only the readers' wildcards need the others fenced off.
    deny = _others_denied(stream, durables - {service}, ("CREATE", "MSG.NEXT"))
    return User(service, f"{service}: its decisions, its dead letters, its consumer",
                Permissions(tuple(publish), tuple(deny), tuple(subscribe)))


def _agent(prefix: str, stream: str, node: str | None, durables: frozenset[str]) -> User:
    """One node's agent, or (node None) the user all agents share. The shared one cannot be tied to its
    durable (`agent-<node>`: a wildcard matches whole tokens only), its heartbeat or its fault subject, so
    it gets wildcards with every known other durable denied; per-node users narrow all three."""
    name = agent_user(node) if node is not None else AGENT
    durable = name if node is not None else "*"
    publish = sorted(log_subject(prefix, t) for t in PUBLISHES[AGENT])
    publish += [f"{prefix}.dlq.{durable}", f"{prefix}.hb.{node or '*'}", *_consumer_rights(stream, durable)]
    subscribe = [f"{inbox_prefix(name)}.>", f"{prefix}.logs", f"{prefix}.agent.{node or '*'}.fault"]
    others = durables - {name}
    if node is not None:
        deny = _others_denied(stream, others, ("CREATE", "MSG.NEXT"))
    else:
        deny = [f"{prefix}.dlq.{d}" for d in sorted(others)] + _others_denied(stream, others, DISTURBING)
    what = f"the agent of node {node}" if node is not None else "the node agents"
    return User(name, f"{what}: inventory, faults, job reports, heartbeats; answers log and fault requests",
                Permissions(tuple(publish), tuple(deny), tuple(subscribe), allow_responses=True))


def _auditor(stream: str, durables: frozenset[str]) -> User:
    dlq = f"{stream}_DLQ"
    publish = [f"$JS.API.STREAM.INFO.{stream}", f"$JS.API.STREAM.INFO.{dlq}", *_reader_rights(stream),
               *_reader_rights(dlq)]
    deny = _others_denied(stream, durables, ("CREATE", "MSG.NEXT"))
    return User(AUDITOR, "auditor: reads the log and the dead letters, publishes nothing",
                Permissions(tuple(publish), tuple(deny), (f"{inbox_prefix(AUDITOR)}.>",)))


def users(prefix: str = SUBJECT_PREFIX, stream: str = DEFAULT_STREAM, agent_nodes: Sequence[str] = ()) -> list[User]:
    """Every user of one platform (prefix and stream): the operator, the six services, the agents (shared,
    or one per node when `agent_nodes` names them) and the auditor."""
    _check_subject(prefix, "subject prefix")
    for name, what in [(stream, "stream"), *((n, "node") for n in agent_nodes)]:
        _check_subject(name, what, tokens=1)
    durables = frozenset({*SERVICES, *(agent_user(n) for n in agent_nodes)})
    agents = [_agent(prefix, stream, n, durables) for n in sorted(set(agent_nodes))] or [
        _agent(prefix, stream, None, durables)]
    return [User(OPERATOR, "operator: setup and administration (creates the streams)", None),
            *(_service_user(s, prefix, stream, durables) for s in SERVICES), *agents, _auditor(stream, durables)]


def _check_subject(value: str, what: str, tokens: int = 0) -> None:
    parts = value.split(".")
    if not all(_TOKEN.fullmatch(p) for p in parts) or (tokens and len(parts) != tokens):
        raise ValueError(f"{what} {value!r} cannot be used in NATS subjects")


# --- rendering ----------------------------------------------------------------------------------


def _list(key: str, items: Sequence[str], indent: str) -> list[str]:
    inner = indent + "  "
    return [f"{indent}{key}: [", *(f"{inner}{json.dumps(i)}" for i in items), f"{indent}]"]


def _render_permissions(p: Permissions) -> list[str]:
    out = ["      permissions: {", "        publish: {", *_list("allow", p.publish, "          ")]
    if p.publish_deny:
        out += _list("deny", p.publish_deny, "          ")
    out += ["        }", "        subscribe: {", *_list("allow", p.subscribe, "          "), "        }"]
    if p.allow_responses:
        out.append("        allow_responses: true")
    return [*out, "      }"]


def _render_user(user: User) -> list[str]:
    # `$NAME` unquoted is a variable the server resolves from its environment (and refuses to start
    # without), so no password is ever written here.
    out = [f"    # {user.comment}", "    {", f"      user: {json.dumps(user.name)}",
           f"      password: ${password_env(user.name)}"]
    if user.permissions is not None:
        out += _render_permissions(user.permissions)
    return [*out, "    }"]


def render_config(prefix: str = SUBJECT_PREFIX, stream: str = DEFAULT_STREAM, agent_nodes: Sequence[str] = ()) -> str:
    """The `authorization` block for one platform: a file of its own that nats-server takes with `-c` (plus
    `-js` and the rest on the command line) or that a server config `include`s."""
    all_users = users(prefix, stream, agent_nodes)
    head = [
        f"# NATS users of gpusched (subject prefix {prefix!r}, stream {stream!r}); written by",
        f"# `gpusched nats-config{_args(prefix, stream, agent_nodes)}`: edit the code, not this file.",
        "# Each user may publish only its own subjects; the server reads each password from its environment:",
        *(f"#   {password_env(u.name)}" for u in all_users),
        "# Unauthenticated clients are refused (there is no no_auth_user).",
        "authorization {",
        "  users: [",
    ]
    body = [line for u in all_users for line in _render_user(u)]
    return "\n".join([*head, *body, "  ]", "}", ""])


def _args(prefix: str, stream: str, agent_nodes: Sequence[str]) -> str:
    parts = [] if prefix == SUBJECT_PREFIX else [f" --prefix {prefix}"]
    parts += [] if stream == DEFAULT_STREAM else [f" --stream {stream}"]
    return "".join(parts + [f" --agent-node {n}" for n in sorted(set(agent_nodes))])
