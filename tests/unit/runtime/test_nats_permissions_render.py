"""The NATS permissions as rendered, and as checked against the code: what each service may publish is what
its source constructs or emits, the committed example is what the generator writes, and credentials come
from the environment without ever showing in a repr."""

from __future__ import annotations

import ast
import stat
from pathlib import Path

import pytest

from contracts.events import ALL_EVENT_TYPES, AuditCheckpoint, EventBase, QuotaReserved
from libs.bus.jetstream import NatsAuth
from libs.bus.permissions import (
    AGENT,
    AUDITOR,
    OPERATOR,
    PUBLISHES,
    SERVICES,
    Permissions,
    log_subject,
    password_env,
    render_config,
    users,
)
from libs.cli.nats_config import PASSWORD, SERVER_ENV, new_password, write_secrets
from libs.runtime.settings import REPO_ROOT, Settings, nats_auth_from_env
from libs.runtime.settings import SERVICES as RUNTIME_SERVICES

EVENT_NAMES = {t.__name__: t for t in ALL_EVENT_TYPES}
PACKAGES = {**{s: s.replace("-", "_") for s in SERVICES}, AGENT: "agent"}


def _module_path(module: str) -> Path | None:
    path = REPO_ROOT.joinpath(*module.split(".")).with_suffix(".py")
    return path if path.exists() else None


def _published_in(path: Path) -> set[type[EventBase]]:
    """Event types a module constructs (`JobPlaced(...)`) or hands to a call (`out.emit(JobPlaced, ...)`,
    `self._publish(CordonNode, ...)`); isinstance checks and annotations are not publishing."""
    found: set[type[EventBase]] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        if isinstance(func, ast.Name) and func.id in ("isinstance", "issubclass"):
            continue
        names = [func, *node.args]
        found |= {EVENT_NAMES[n.id] for n in names if isinstance(n, ast.Name) and n.id in EVENT_NAMES}
    return found


def _core_service(path: Path) -> str | None:
    """A decider module's SERVICE, the source of its decisions; a module beside a decider (`quota/reserve.py`
    beside `quota/decider.py`) is a part of that decider."""
    for node in ast.parse(path.read_text()).body:
        if (isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "SERVICE" for t in node.targets)
                and isinstance(node.value, ast.Constant)):
            return str(node.value.value)
    owner = path.with_name("decider.py")
    return _core_service(owner) if owner != path and owner.exists() else None


def _scanned(user: str) -> set[type[EventBase]]:
    """What the service's own package builds, plus what the non-decider modules it imports build for it
    (the policy file, the simulated executor). Deciders count for their SERVICE only: preemption imports the
    quota core to simulate, and does not publish quota's decisions."""
    package = REPO_ROOT / "services" / PACKAGES[user]
    found: set[type[EventBase]] = set()
    for path in package.glob("*.py"):
        found |= _published_in(path)
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("libs.") \
                    and not node.module.startswith("libs.core"):
                helper = _module_path(node.module)
                found |= _published_in(helper) if helper else set()
    from services.node_telemetry.handler import NodeTelemetry  # it runs the node-health decider

    runs = {user, NodeTelemetry.chain_source} if user == "node-telemetry" else {user}
    for path in (REPO_ROOT / "libs" / "core").glob("**/*.py"):
        if _core_service(path) in runs:
            found |= _published_in(path)
    return found


def _keeps_a_chain(user: str) -> bool:
    """The reactor publishes signed AuditCheckpoints for a handler with a decision chain."""
    from libs.runtime.handler import DeciderHandler
    from libs.views.projector import Projector
    from services.agent.executor import ProcessExecutor
    from services.node_telemetry.handler import NodeTelemetry

    handlers = {"accounting": Projector, "node-telemetry": NodeTelemetry, AGENT: ProcessExecutor}
    return hasattr(handlers.get(user, DeciderHandler), "chain")


def test_every_service_has_a_user() -> None:
    assert SERVICES == RUNTIME_SERVICES


@pytest.mark.parametrize("user", [*SERVICES, AGENT])
def test_each_user_may_publish_exactly_what_its_code_publishes(user: str) -> None:
    expected = _scanned(user) | ({AuditCheckpoint} if _keeps_a_chain(user) else set())
    assert set(PUBLISHES[user]) == expected


def _perms(name: str, **kw: object) -> Permissions:
    user = next(u for u in users(**kw) if u.name == name)  # type: ignore[arg-type]
    assert user.permissions is not None
    return user.permissions


@pytest.mark.parametrize("user", [*SERVICES, AGENT])
def test_log_subjects_granted_are_the_users_own(user: str) -> None:
    perms = _perms(user, prefix="px", stream="S")
    granted = {s for s in perms.publish if s.startswith(("px.e.", "px.c."))}
    assert granted == {log_subject("px", t) for t in PUBLISHES[user]}
    assert "px.e.>" not in perms.publish and ">" not in perms.publish


def test_only_quota_may_reserve_quota() -> None:
    holders = [u.name for u in users() if u.permissions is None or "gs.e.QuotaReserved" in u.permissions.publish]
    assert holders == [OPERATOR, "quota"]
    assert log_subject("gs", QuotaReserved) == "gs.e.QuotaReserved"


def test_auditor_publishes_nothing_but_reads() -> None:
    perms = _perms(AUDITOR)
    assert all(s.startswith("$JS.API.") for s in perms.publish)
    assert not any(".DELETE." in s or ".STREAM.CREATE" in s or "DURABLE" in s for s in perms.publish)
    assert perms.subscribe == ("_INBOX.auditor.>",) and not perms.allow_responses


def test_services_consume_their_own_durable_and_are_fenced_off_the_others() -> None:
    perms = _perms("placement", stream="S")
    assert "$JS.API.CONSUMER.DELETE.S.placement" in perms.publish and "$JS.ACK.S.placement.>" in perms.publish
    assert "$JS.API.CONSUMER.MSG.NEXT.S.quota" in perms.publish_deny
    assert not any(s.endswith(".placement") for s in perms.publish_deny)
    assert not any("STREAM.CREATE" in s or "STREAM.UPDATE" in s or "STREAM.DELETE" in s for s in perms.publish)


def test_agent_subjects_follow_the_agent() -> None:
    from services.agent.app import fault_subject, heartbeat_subject, logs_subject

    shared = _perms(AGENT)
    assert heartbeat_subject("gs", "*") in shared.publish and shared.allow_responses
    assert {logs_subject("gs"), fault_subject("gs", "*")} <= set(shared.subscribe)
    assert "gs.dlq.quota" in shared.publish_deny and "$JS.ACK.GPUSCHED.quota.>" in shared.publish_deny
    own = _perms("agent-n1", agent_nodes=["n1", "n2"])
    assert heartbeat_subject("gs", "n1") in own.publish and fault_subject("gs", "n1") in own.subscribe
    assert "$JS.ACK.GPUSCHED.agent-n1.>" in own.publish and "gs.dlq.agent-n1" in own.publish
    assert "$JS.API.CONSUMER.MSG.NEXT.GPUSCHED.agent-n2" in own.publish_deny
    assert AGENT not in {u.name for u in users(agent_nodes=["n1"])}


def test_committed_example_is_what_the_generator_writes() -> None:
    assert (REPO_ROOT / "infra" / "nats" / "auth.conf").read_text() == render_config()


def test_config_holds_no_password_only_variables() -> None:
    text = render_config(agent_nodes=["gpu-01"])
    for u in users(agent_nodes=["gpu-01"]):
        assert f"password: ${password_env(u.name)}\n" in text
    assert password_env("agent-gpu-01") == "GPUSCHED_NATS_AGENT_GPU_01_PASSWORD"
    assert "no_auth_user" not in text.replace("(there is no no_auth_user)", "")


@pytest.mark.parametrize("kw", [{"prefix": "g s"}, {"prefix": "gs.>"}, {"stream": "A.B"}, {"agent_nodes": ["n.1"]},
                                {"agent_nodes": ["*"]}])
def test_names_that_would_break_subjects_are_refused(kw: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        users(**kw)  # type: ignore[arg-type]


def test_credentials_from_the_environment(tmp_path: Path) -> None:
    assert nats_auth_from_env({}) is None
    auth = nats_auth_from_env({"NATS_USER": "quota", "NATS_PASSWORD": "s3cret"})
    assert auth == NatsAuth(user="quota", password="s3cret")
    assert "s3cret" not in repr(auth)
    assert auth.connect_options() == {"user": "quota", "password": "s3cret", "inbox_prefix": "_INBOX.quota"}
    (tmp_path / "pw").write_text("from-file\n")
    from_file = nats_auth_from_env({"NATS_USER": "quota", "NATS_PASSWORD_FILE": str(tmp_path / "pw")})
    assert from_file is not None and from_file.password == "from-file"
    creds = nats_auth_from_env({"NATS_CREDS": "/etc/gpusched/quota.creds"})
    assert creds is not None and creds.connect_options() == {"user_credentials": "/etc/gpusched/quota.creds"}
    for bad in ({"NATS_PASSWORD": "x"}, {"NATS_USER": "quota", "NATS_CREDS": "/c"}):
        with pytest.raises(ValueError):
            nats_auth_from_env(bad)


def test_settings_carry_credentials_to_the_bus_and_never_show_them(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NATS_USER", "placement")
    monkeypatch.setenv("NATS_PASSWORD", "hunter2")
    settings = Settings.from_env("placement")
    assert settings.bus.auth == NatsAuth(user="placement", password="hunter2")
    assert "hunter2" not in repr(settings) and "hunter2" not in repr(settings.bus)
    # Settings built field by field (the node agent's) still connect as the process's user.
    assert Settings(service="agent").bus.auth == NatsAuth(user="placement", password="hunter2")


def test_secrets_are_private_and_kept(tmp_path: Path) -> None:
    folder = tmp_path / "secrets"
    env_file = write_secrets(folder, ["quota", "auditor"])
    first = (folder / "quota.password").read_text()
    assert env_file == folder / SERVER_ENV
    assert f"GPUSCHED_NATS_QUOTA_PASSWORD={first.strip()}" in env_file.read_text().splitlines()
    for path in (env_file, folder / "quota.password", folder / "auditor.password"):
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    write_secrets(folder, ["quota", "auditor"])
    assert (folder / "quota.password").read_text() == first  # made once: running it again changes nothing


@pytest.mark.parametrize("password", ["2024-01-01T00:00:00Z", "12345678901234567", "true", "pw with spaces in it",
                                      "$2a$11$abcdefghijklmnop"])
def test_passwords_the_server_would_misread_are_refused(tmp_path: Path, password: str) -> None:
    (tmp_path / "quota.password").write_text(password)
    with pytest.raises(ValueError, match="letter"):
        write_secrets(tmp_path, ["quota"])
    assert PASSWORD.fullmatch(new_password())
