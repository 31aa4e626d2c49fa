"""The dashboards and alerts against a real Prometheus scraping the real platform.

promtool checks and unit-tests the rules (infra/prometheus/alerts_test.yml) and checks the configs; then the six
services run on a small cluster, a Prometheus of the test's own scrapes them every second, and a scenario from
three teams exercises what the dashboards show: borrowing in a cohort, a reclaim that preempts, jobs that
succeed, fail and are retried, a long job, a fractional one, a poison message, then a lost node and a
quarantined GPU published on the bus as node-telemetry would. Every query of every panel of every dashboard must
then return data, and the node-lost and GPU-quarantined alerts must fire.

Needs Debian's `prometheus` package (prometheus and promtool on PATH; .ci/run installs it); skipped without it.
"""

from __future__ import annotations

import contextlib
import json
import re
import shutil
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from contracts import GpuHealthChanged, JobStarted, NodeLost
from libs.bus.jetstream import Bus, BusConfig
from libs.cli.client import Client
from libs.core.kernel.decider import derived_id
from libs.runtime.embedded import free_port
from libs.runtime.platform import start_platform
from libs.runtime.settings import SERVICES
from libs.runtime.supervisor import Supervisor
from libs.sim.executor import SIM_EXIT_CODES
from tests.e2e.waiting import wait_for

ROOT = Path(__file__).resolve().parents[2]
PROMETHEUS_DIR = ROOT / "infra" / "prometheus"
RULE_FILES = [PROMETHEUS_DIR / "alerts.yml", PROMETHEUS_DIR / "rules.yml"]
DASHBOARDS = ROOT / "infra" / "grafana" / "dashboards"

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(shutil.which("prometheus") is None or shutil.which("promtool") is None,
                       reason="prometheus/promtool not on PATH (Debian: apt-get install -y prometheus; .ci/run does)"),
]

CLUSTER = """sn,cpu_milli,memory_mib,gpu,model
obs-a100-0,96000,786432,8,A100
obs-a100-1,96000,786432,8,A100
obs-h100-0,96000,786432,4,H100
obs-t4-0,32000,131072,4,T4
"""

# alpha borrows beta's idle quota in the org cohort; beta, with a GPU-hour budget, takes it back at once; gamma
# has a quota per GPU model.
POLICY = """
[settings]
preempt_min_remaining_s = 0.0

[[queues]]
name = "org"
team = "org"

[[queues]]
name = "alpha"
team = "alpha"
parent = "org"
nominal_gpus = 6
borrowing_limit_gpus = 6

[[queues]]
name = "beta"
team = "beta"
parent = "org"
nominal_gpus = 6
reclaim_after_s = 0.0
budget_gpu_hours = 1.0
budget_period = "day"

[[queues]]
name = "gamma"
team = "gamma"
flavors = [{model = "H100", nominal_gpus = 4}, {model = "T4", nominal_gpus = 4}]

[[priority_classes]]
name = "urgent"
value = 800
retry_backoff_s = 0.5

[[priority_classes]]
name = "training"
value = 500
retry_backoff_s = 0.5

[[priority_classes]]
name = "batch"
value = 100
retry_backoff_s = 0.5
"""

STREAM, PREFIX = "OBSERVE", "observe"
# Grafana's variables as the test queries them: every queue/team/node, a rate window of a minute.
GRAFANA_VARIABLES = {"$__rate_interval": "1m", "$__interval": "15s", "$__range": "1h"}


def promtool(*args: str | Path) -> str:
    done = subprocess.run(["promtool", *map(str, args)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, f"promtool {' '.join(map(str, args))}:\n{done.stdout}\n{done.stderr}"
    return done.stdout


def prometheus_config(ports: dict[str, int], interval: str = "1s") -> dict[str, Any]:
    """What infra/prometheus/prometheus-local.yml says, for the ports this platform got."""
    return {"global": {"scrape_interval": interval, "evaluation_interval": interval},
            "rule_files": [str(f) for f in RULE_FILES],
            "scrape_configs": [{"job_name": name, "metrics_path": "/metrics",
                                "static_configs": [{"targets": [f"127.0.0.1:{ports[name]}"]}]}
                               for name in SERVICES]}


def test_rules_and_configs_pass_promtool(tmp_path: Path) -> None:
    out = promtool("check", "rules", *RULE_FILES)
    assert "SUCCESS" in out
    promtool("test", "rules", PROMETHEUS_DIR / "alerts_test.yml")
    for config in ("prometheus.yml", "prometheus-local.yml"):
        assert "2 rule files found" in promtool("check", "config", PROMETHEUS_DIR / config)
    generated = tmp_path / "prometheus.yml"
    generated.write_text(yaml.safe_dump(prometheus_config({name: 18080 + i for i, name in enumerate(SERVICES)})))
    promtool("check", "config", generated)


# --- a Prometheus of our own ----------------------------------------------------------------------------------


class Prometheus:
    def __init__(self, data: Path, config: dict[str, Any]) -> None:
        data.mkdir(parents=True, exist_ok=True)
        (data / "prometheus.yml").write_text(yaml.safe_dump(config))
        self.log = data / "prometheus.log"
        self.url = f"http://127.0.0.1:{free_port()}"
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(
                ["prometheus", f"--config.file={data / 'prometheus.yml'}", f"--storage.tsdb.path={data / 'tsdb'}",
                 f"--web.listen-address={self.url.removeprefix('http://')}", "--storage.tsdb.retention.time=1d",
                 "--log.level=warn"], stdout=log, stderr=subprocess.STDOUT)
        try:
            wait_for(self.ready, lambda: f"prometheus did not start:\n{self.log.read_text()[-3000:]}", timeout=30)
        except BaseException:
            self.stop()
            raise

    def ready(self) -> bool:
        assert self.proc.poll() is None, f"prometheus exited:\n{self.log.read_text()[-3000:]}"
        try:
            with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as r:
                return bool(r.status == 200)
        except OSError:
            return False

    def get(self, path: str, **params: str) -> Any:
        url = f"{self.url}{path}?{urllib.parse.urlencode(params)}" if params else f"{self.url}{path}"
        with urllib.request.urlopen(url, timeout=10) as r:
            body = json.loads(r.read())
        assert body["status"] == "success", body
        return body["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        data = self.get("/api/v1/query", query=expr)
        assert data["resultType"] == "vector", (expr, data["resultType"])
        return list(data["result"])

    def firing(self) -> list[dict[str, Any]]:
        return [a for a in self.get("/api/v1/alerts")["alerts"] if a["state"] == "firing"]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def panel_queries() -> list[tuple[str, str, str]]:
    """(dashboard, panel, PromQL) for every target of every panel, Grafana's variables substituted, plus the
    series each template variable lists its values from."""
    out = []
    for path in sorted(DASHBOARDS.glob("*.json")):
        board = json.loads(path.read_text())
        names = {v["name"] for v in board["templating"]["list"]}
        for var in board["templating"]["list"]:
            metric = re.fullmatch(r"label_values\((\w+), *\w+\)", var["query"]["query"])
            assert metric, var["query"]
            out.append((board["title"], f"${var['name']} values", metric.group(1)))
        for panel in board["panels"]:
            for t in panel["targets"]:
                expr = t["expr"]
                for var, value in GRAFANA_VARIABLES.items():
                    expr = expr.replace(var, value)
                for name in names:  # "All": the variable's allValue
                    expr = expr.replace(f"${{{name}}}", ".*").replace(f"${name}", ".*")
                assert "$" not in expr, (panel["title"], expr)
                out.append((board["title"], f"{panel['title']} [{t['refId']}]", expr))
    return out


# --- the scenario ---------------------------------------------------------------------------------------------


@pytest.fixture
def platform(tmp_path: Path) -> Iterator[tuple[Supervisor, dict[str, str]]]:
    (tmp_path / "cluster.csv").write_text(CLUSTER)
    (tmp_path / "policy.toml").write_text(POLICY)
    env = {"GPUSCHED_STREAM": STREAM, "GPUSCHED_SUBJECT_PREFIX": PREFIX, "GPUSCHED_TICK_SECONDS": "1"}
    sup, servers, env = start_platform(tmp_path, tmp_path / "cluster.csv", tmp_path / "policy.toml",
                                       api_port=free_port(), extra_env=env, own_servers=True)
    try:
        yield sup, env
    finally:
        sup.stop()
        for s in reversed(servers):
            s.stop()


def states(client: Client, ids: list[str]) -> dict[str, str]:
    return {j["id"]: j["state"] for j in client.jobs(limit=1000) if j["id"] in ids}


def submit(client: Client, team: str, n: int = 1, **spec: Any) -> list[str]:
    return [client.submit({"team": team, "queue": team, "user": f"{team}-user", **spec})["id"] for _ in range(n)]


async def test_every_dashboard_query_returns_data_and_alerts_fire(
    tmp_path: Path, platform: tuple[Supervisor, dict[str, str]],
) -> None:
    sup, env = platform
    client = Client(f"http://127.0.0.1:{sup.ports['admission']}")
    wait_for(lambda: len(client.nodes()) == 4 and len(client.queues()) == 4, "the cluster never registered", 30)
    prom = Prometheus(tmp_path / "prometheus", prometheus_config(sup.ports))
    bus: Bus | None = None
    try:
        bus = await Bus.connect(BusConfig(url=env["NATS_URL"], stream=STREAM, subject_prefix=PREFIX))
        # alpha fills its own 6 GPUs and borrows beta's 6; gamma runs a long H100 job, a fractional T4 one, and
        # short T4 jobs that succeed, fail, and fail once to be retried.
        alpha = submit(client, "alpha", 3, gpus=4, gpu_models=["A100"], priority="batch", duration_s=60.0)
        long_job = submit(client, "gamma", gpus=2, gpu_models=["H100"], priority="training", duration_s=7200.0)
        submit(client, "gamma", gpus=1, gpu_milli=500, gpu_models=["T4"], priority="training", duration_s=60.0)
        short = submit(client, "gamma", 2, gpus=1, gpu_models=["T4"], priority="urgent", duration_s=1.0)
        failing = submit(client, "gamma", gpus=1, gpu_models=["T4"], priority="batch", duration_s=1.0,
                         labels={SIM_EXIT_CODES: "1"})
        retried = submit(client, "gamma", gpus=1, gpu_models=["T4"], priority="batch", duration_s=1.0,
                         labels={SIM_EXIT_CODES: "137,0"})
        # an inference service of two quarter-GPU replicas, and its load
        client.deploy_service({"name": "chat", "min_replicas": 2, "max_replicas": 3,
                               "autoscaling": {"target_per_replica": 100.0},
                               "replica": {"team": "gamma", "queue": "gamma", "gpus": 1, "gpu_milli": 250,
                                           "gpu_models": ["T4"], "priority": "training"}})
        wait_for(lambda: client.service("chat")["ready_replicas"] == 2, "the service's replicas never ran", 30)
        client.report_load("chat", 150.0)
        wait_for(lambda: set(states(client, alpha + long_job).values()) == {"running"},
                 lambda: f"alpha's and gamma's long jobs did not all start: {states(client, alpha + long_job)}", 30)

        # beta asks for its lent quota back: one of alpha's borrowing jobs is preempted.
        beta = submit(client, "beta", gpus=4, gpu_models=["A100"], priority="training", duration_s=3.0)
        done = short + failing + retried + beta
        wait_for(lambda: set(states(client, done).values()) <= {"succeeded", "failed"}
                 and len(states(client, done)) == len(done),
                 lambda: f"gamma's and beta's short jobs did not end: {states(client, done)}", 40)
        assert states(client, done) == {**dict.fromkeys(short + retried + beta, "succeeded"),
                                        **dict.fromkeys(failing, "failed")}

        # The world breaks, as node-telemetry reports it: a poison message, a lost node, a failed GPU.
        await bus.js.publish(bus.subject_for_type(JobStarted), b"{not json", headers={"Nats-Msg-Id": "obs-poison"})
        now = time.time()
        await bus.publish([
            NodeLost(id=derived_id("observability-test", "lost"), ts=now, source="node-telemetry",
                     node="obs-h100-0", reason="heartbeat_missed"),
            GpuHealthChanged(id=derived_id("observability-test", "xid"), ts=now, source="node-telemetry",
                             node="obs-t4-0", index=3, healthy=False, reason="xid", xid=79),
        ])
        wait_for(lambda: states(client, long_job) == dict.fromkeys(long_job, "pending"),
                 lambda: f"the long job on the lost node was not evicted: {states(client, long_job)}", 20)

        def alerts() -> set[tuple[str, str]]:
            return {(a["labels"]["alertname"], a["labels"].get("node", "")) for a in prom.firing()}

        wait_for(lambda: {("GpuschedNodeLost", "obs-h100-0"), ("GpuschedGpuQuarantined", "obs-t4-0")} <= alerts(),
                 lambda: f"the node-lost and GPU-quarantined alerts did not fire; firing: {sorted(alerts())}", 30,
                 every=0.5)
        lost = next(a for a in prom.firing() if a["labels"]["alertname"] == "GpuschedNodeLost")
        assert lost["labels"]["severity"] == "critical" and lost["annotations"]["summary"] == "Node obs-h100-0 is lost"

        queries = panel_queries()
        empty: list[tuple[str, str, str]] = []

        def all_answer() -> bool:
            empty[:] = [q for q in queries if not prom.query(q[2])]
            return not empty

        with contextlib.suppress(AssertionError):
            wait_for(all_answer, "", timeout=30, every=1.0)
        assert not empty, "queries without data:\n" + "\n".join(f"  {d} / {p}: {e}" for d, p, e in empty)
    finally:
        if bus is not None:
            await bus.close()
        prom.stop()
