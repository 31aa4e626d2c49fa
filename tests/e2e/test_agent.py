"""Node agents with the process executor on real NATS and Redis: real processes on simulated GPUs, their
exits, logs and checkpoints; an XID that quarantines a GPU; SIGTERM before SIGKILL; a lost node."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from libs.cli.client import Client
from libs.runtime.embedded import free_port
from libs.runtime.platform import start_platform
from libs.runtime.supervisor import Supervisor
from tests.e2e.waiting import wait_for

pytestmark = pytest.mark.e2e

POLICY = """
[settings]
preempt_min_remaining_s = 0.0

[[queues]]
name = "q"
team = "t"

[[priority_classes]]
name = "urgent"
value = 800

[[priority_classes]]
name = "batch"
value = 100
checkpoint_grace_s = 2.0
"""
FINAL = ("succeeded", "failed", "cancelled")
# A job that saves its progress and leaves when told to stop, and says where it resumed from.
CHECKPOINTING = ("import os, signal, sys, time\n"
                 "from libs.jobkit import checkpoint, resume_progress\n"
                 "def stop(*_):\n"
                 "    print('got SIGTERM', flush=True); checkpoint(42.0, 'ckpt-42'); sys.exit(0)\n"
                 "signal.signal(signal.SIGTERM, stop)\n"
                 "print('resumed from', resume_progress(), flush=True)\n"
                 "time.sleep(float(os.environ.get('RUN_S', '120')))\n")
# A job that ignores SIGTERM: only SIGKILL ends it.
STUBBORN = ("import signal, time\n"
            "signal.signal(signal.SIGTERM, lambda *_: print('got SIGTERM, carrying on', flush=True))\n"
            "print('running', flush=True)\n"
            "time.sleep(120)\n")


@dataclass
class Platform:
    api: Client
    sup: Supervisor
    env: dict[str, str]
    tmp: Path
    agents: dict[str, subprocess.Popen[bytes]]

    def start_agent(self, node: str, gpus: int) -> None:
        log = open(self.tmp / f"agent-{node}.log", "ab")  # noqa: SIM115 - the agent owns it until it exits
        self.agents[node] = subprocess.Popen(
            [sys.executable, "-m", "services.agent", "--node", node, "--backend", "sim", "--gpus", str(gpus),
             "--port", str(free_port()), "--workdir", str(self.tmp / node), "--heartbeat-s", "0.5"],
            env={**os.environ, **self.env, "PYTHONPATH": str(Path.cwd())}, stdout=log, stderr=subprocess.STDOUT)

    def submit(self, command: str, gpus: int = 1, priority: str = "batch", **extra: object) -> str:
        spec = {"team": "t", "queue": "q", "gpus": gpus, "priority": priority,
                "command": [sys.executable, "-c", command], **extra}
        return str(self.api.submit(spec)["id"])

    def job(self, job_id: str) -> dict[str, object]:
        return self.api.job(job_id)

    def wait_state(self, job_id: str, *states: str, timeout: float = 30.0) -> dict[str, object]:
        return wait_for(lambda: (j := self.job(job_id))["state"] in states and j,
                        lambda: f"{job_id} never reached {states}: {self.job(job_id)}", timeout=timeout)

    def wait_log(self, job_id: str, text: str, timeout: float = 30.0) -> str:
        return wait_for(lambda: text in (log := self.api.logs(job_id)["log"]) and log,
                        f"{text!r} never appeared in the log of {job_id}", timeout=timeout)

    def fault(self, node: str, **command: object) -> None:
        """`gpusched node fault NODE --flag [value] ...` (True: a flag without a value)."""
        args = []
        for key, value in command.items():
            args += [f"--{key.replace('_', '-')}"] + ([] if value is True else [str(value)])
        subprocess.run([sys.executable, "-m", "libs.cli.main", "node", "fault", node, *args],
                       env={**os.environ, **self.env}, check=True, capture_output=True, timeout=20)


@pytest.fixture(scope="module")
def platform(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Platform]:
    tmp = tmp_path_factory.mktemp("agents")
    (tmp / "policy.toml").write_text(POLICY)
    (tmp / "cluster.csv").write_text("sn,cpu_milli,memory_mib,gpu,model\n")
    sup, servers, env = start_platform(tmp, tmp / "cluster.csv", tmp / "policy.toml", free_port(), own_servers=True,
                                       extra_env={"GPUSCHED_NODE_BACKEND": "agents",
                                                  "GPUSCHED_NODE_LOST_AFTER_S": "3"})
    p = Platform(Client(f"http://127.0.0.1:{sup.ports['admission']}"), sup, env, tmp, {})
    try:
        p.start_agent("ag-0", 2)
        wait_for(lambda: len(p.api.nodes()) == 1, "the agent's node never registered", timeout=30)
        yield p
    finally:
        for agent in p.agents.values():
            agent.terminate()
        for agent in p.agents.values():
            agent.wait(timeout=10)
        sup.stop()
        for s in servers:
            s.stop()


def test_commands_run_on_their_gpus_and_finish_or_fail_with_their_logs(platform: Platform) -> None:
    ok = platform.submit("import os; print('on', os.environ['CUDA_VISIBLE_DEVICES'], os.environ['GPUSCHED_JOB_ID'])")
    bad = platform.submit("import sys; print('giving up'); sys.exit(3)")
    share = platform.submit("import os; print('share', os.environ['GPUSCHED_GPU_FRACTION'])", gpus=1,
                            gpu_milli=250, gpu_memory_mib=1024)
    assert platform.wait_state(ok, *FINAL)["state"] == "succeeded"
    failed = platform.wait_state(bad, *FINAL)
    assert (failed["state"], failed["exit_code"], failed["reason"]) == ("failed", 3, "exit_code")
    assert platform.wait_state(share, *FINAL)["state"] == "succeeded"
    log = platform.api.logs(ok)
    assert log["node"] == "ag-0" and "on SIM-ag-0-" in log["log"] and ok in log["log"]
    assert "giving up" in platform.api.logs(bad)["log"]
    assert "share 0.250" in platform.api.logs(share)["log"]


# A service replica that loads its "model" until the file named by its argument exists, then serves.
LOADING = ("import os, sys, time\n"
           "from libs.jobkit import ready\n"
           "print('loading', flush=True)\n"
           "while not os.path.exists(sys.argv[1]): time.sleep(0.05)\n"
           "ready(); print('serving', flush=True)\n"
           "time.sleep(120)\n")


def test_a_service_replica_counts_as_ready_when_its_process_says_so(platform: Platform) -> None:
    loaded = platform.tmp / "loader-loaded"  # the replica loads until the test creates it, however slow the machine
    platform.api.deploy_service({"name": "loader", "min_replicas": 1, "max_replicas": 1, "replica": {
        "team": "t", "queue": "q", "gpus": 1, "priority": "urgent", "ready_signal": True,
        "command": [sys.executable, "-c", LOADING, str(loaded)]}})
    replica = wait_for(lambda: next((j for j in platform.api.jobs(state="running")
                                     if j["spec"].get("service") == "loader"), None), "the replica never ran")
    platform.wait_log(replica["id"], "loading")
    assert platform.api.service("loader")["ready_replicas"] == 0  # running, not yet serving
    loaded.touch()
    wait_for(lambda: platform.api.service("loader")["ready_replicas"] == 1, "the replica never became ready", 20)
    platform.wait_log(replica["id"], "serving")
    platform.api.delete_service("loader")
    assert platform.wait_state(replica["id"], *FINAL)["state"] == "cancelled"


def test_preemption_sends_sigterm_and_the_job_resumes_from_its_checkpoint(platform: Platform) -> None:
    victim = platform.submit(CHECKPOINTING, gpus=2, checkpoint_interval_s=60.0)
    platform.wait_log(victim, "resumed from 0.0")
    urgent = platform.submit("print('urgent done')", gpus=2, priority="urgent")
    assert platform.wait_state(urgent, *FINAL)["state"] == "succeeded"
    log = platform.wait_log(victim, "resumed from 42.0")  # evicted with its checkpoint, then run again
    assert log.index("got SIGTERM") < log.index("resumed from 42.0")
    view = platform.job(victim)
    assert view["evictions"] == 1 and view["progress_s"] == 42.0
    platform.api.cancel(victim)
    assert platform.wait_state(victim, *FINAL)["state"] == "cancelled"


def test_a_job_that_ignores_sigterm_is_killed_when_its_grace_ends(platform: Platform) -> None:
    stubborn = platform.submit(STUBBORN)
    platform.wait_log(stubborn, "running")
    asked = time.monotonic()
    platform.api.cancel(stubborn)
    assert platform.wait_state(stubborn, *FINAL)["state"] == "cancelled"
    assert time.monotonic() - asked >= 1.5  # the batch class's 2 s grace, then SIGKILL
    assert "got SIGTERM, carrying on" in platform.api.logs(stubborn)["log"]


def test_an_xid_quarantines_the_gpu_and_the_job_runs_again_on_another(platform: Platform) -> None:
    job = platform.submit(CHECKPOINTING)
    platform.wait_log(job, "resumed from")
    first = platform.wait_state(job, "running")["placements"]
    gpu = first[0]["gpu_indices"][0]  # type: ignore[index]
    platform.fault("ag-0", gpu=gpu, xid=79)
    wait_for(lambda: platform.api.nodes()[0]["healthy_gpus"] == 1, "the GPU was never quarantined")
    again = wait_for(lambda: (j := platform.job(job))["evictions"] == 1 and j["state"] == "running" and j,
                     "the job never ran again")
    assert again["placements"][0]["gpu_indices"] == [1 - gpu]  # type: ignore[index]
    platform.api.cancel(job)
    platform.wait_state(job, *FINAL)


def test_a_drained_node_stops_its_jobs_which_resume_elsewhere_and_takes_none_until_uncordoned(
        platform: Platform) -> None:
    platform.start_agent("ag-1", 2)
    wait_for(lambda: len(platform.api.nodes()) == 2, "the second agent never registered", timeout=30)
    job = platform.submit(CHECKPOINTING, checkpoint_interval_s=60.0)
    platform.wait_log(job, "resumed from 0.0")
    node = platform.wait_state(job, "running")["placements"][0]["node"]  # type: ignore[index]
    other = "ag-1" if node == "ag-0" else "ag-0"
    platform.api.node_action(str(node), "drain", reason="replace a fan", operator="ops")
    moved = wait_for(lambda: (j := platform.job(job))["state"] == "running" and j["placements"][0]["node"] == other
                     and j, "the drained job never ran on the other node", timeout=30)
    assert moved["evictions"] == 1 and moved["progress_s"] == 42.0
    platform.wait_log(job, "resumed from 42.0")
    assert {n["name"]: n["cordon"] for n in platform.api.nodes()}[node] == "draining"
    platform.api.cancel(job)
    platform.wait_state(job, *FINAL)
    platform.api.node_action(str(node), "uncordon", operator="ops")
    wait_for(lambda: {n["name"]: n["cordon"] for n in platform.api.nodes()}[node] == "", "never uncordoned")


def test_a_silent_agent_loses_its_node_and_its_jobs_run_elsewhere(platform: Platform) -> None:
    if "ag-1" not in platform.agents:
        platform.start_agent("ag-1", 2)
    wait_for(lambda: len(platform.api.nodes()) == 2, "the second agent never registered", timeout=30)
    job = platform.submit(CHECKPOINTING)  # one GPU: ag-0 has one healthy GPU left after the XID
    node = wait_for(lambda: (j := platform.job(job))["state"] == "running" and j["placements"][0]["node"],  # type: ignore[index]
                    "the job never ran")
    other = "ag-1" if node == "ag-0" else "ag-0"
    platform.agents[str(node)].send_signal(signal.SIGKILL)  # a crashed agent: its jobs die with it
    wait_for(lambda: not {n["name"]: n["online"] for n in platform.api.nodes()}[node],
             "the silent node was never marked lost", timeout=20)
    moved = wait_for(lambda: (j := platform.job(job))["state"] == "running" and j["placements"][0]["node"] == other
                     and j, "the job never ran on the other node", timeout=30)
    assert moved["evictions"] == 1
    platform.wait_log(job, "resumed from")


def test_a_hung_agent_is_lost_kills_its_jobs_and_comes_back(platform: Platform) -> None:
    alive = next(name for name, agent in platform.agents.items() if agent.poll() is None)
    job = platform.submit(CHECKPOINTING)
    wait_for(lambda: (j := platform.job(job))["state"] == "running" and j, "the job never ran")
    platform.fault(alive, stop_heartbeats=True)  # alive but silent: partitioned, or hung
    wait_for(lambda: not {n["name"]: n["online"] for n in platform.api.nodes()}[alive],
             "the silent node was never marked lost", timeout=20)
    view = platform.wait_state(job, "pending")  # evicted on the lost node's behalf, nowhere else to go
    assert view["evictions"] == 1
    platform.fault(alive, resume_heartbeats=True)
    wait_for(lambda: {n["name"]: n["online"] for n in platform.api.nodes()}[alive], "the node never came back",
             timeout=20)
    again = platform.wait_state(job, "running")  # runs again on the node that came back
    assert again["placements"][0]["node"] == alive  # type: ignore[index]
    platform.api.cancel(job)
    platform.wait_state(job, *FINAL)
