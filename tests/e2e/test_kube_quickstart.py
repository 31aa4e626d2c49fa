"""docs/kubernetes.md's first steps, as a newcomer runs them: `gpusched dev-cluster`, `gpusched up --kubeconfig`,
then kubectl applies the documented examples (their runtimes shortened): the gang Job is bound and runs, the
pod waits and `kubectl describe` says why, both finish; Ctrl-C stops everything."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from libs.runtime.embedded import free_port
from tests.e2e.waiting import wait_for

pytestmark = pytest.mark.e2e
REPO = Path(__file__).resolve().parents[2]


def _gpusched(*args: str, log: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    out = open(log, "ab")  # noqa: SIM115 - the process owns it until it exits
    return subprocess.Popen([sys.executable, "-m", "libs.cli.main", *args], stdout=out, stderr=subprocess.STDOUT,
                            env=env, cwd=REPO)


def test_the_documented_first_steps_on_the_dev_cluster(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NATS_", "REDIS_", "GPUSCHED_"))}
    env["PYTHONPATH"] = str(REPO)
    kube = tmp_path / "kube"
    cluster = _gpusched("dev-cluster", "--folder", str(kube), "--nodes", "2", "--gpus", "8",
                        log=tmp_path / "dev-cluster.log", env=env)
    platform: subprocess.Popen[bytes] | None = None
    try:
        wait_for(lambda: "is up" in (tmp_path / "dev-cluster.log").read_text(),
                 lambda: f"dev-cluster never came up:\n{(tmp_path / 'dev-cluster.log').read_text()[-2000:]}",
                 timeout=120)
        platform = _gpusched("up", "--kubeconfig", str(kube / "kubeconfig-bridge.yaml"), "--data",
                             str(tmp_path / "data"), "--port", str(free_port()), log=tmp_path / "up.log", env=env)
        endpoints = tmp_path / "data" / "endpoints.json"
        wait_for(endpoints.exists, lambda: f"up never came up:\n{(tmp_path / 'up.log').read_text()[-3000:]}",
                 timeout=120)
        kubectl_bin = next(Path(line.split()[1]) for line in (tmp_path / "dev-cluster.log").read_text().splitlines()
                           if line.strip().startswith("kubectl:"))

        def kubectl(*args: str, input_text: str | None = None) -> str:
            return subprocess.run([str(kubectl_bin), "--kubeconfig", str(kube / "kubeconfig-admin.yaml"), *args],
                                  input=input_text, capture_output=True, text=True, check=True, timeout=60).stdout

        def example(name: str, runtime_s: int) -> str:
            text = (REPO / "docs" / "examples" / name).read_text()
            return text.replace('gpusched.io/sim-runtime-s: "20"', f'gpusched.io/sim-runtime-s: "{runtime_s}"') \
                       .replace('gpusched.io/sim-runtime-s: "30"', f'gpusched.io/sim-runtime-s: "{runtime_s}"')

        kubectl("apply", "-f", "-", input_text=example("kube-gang-job.yaml", 8))
        wait_for(lambda: kubectl("get", "pods", "-l", "job-name=train-gang", "-o",
                                 "jsonpath={.items[*].status.phase}").split() == ["Running", "Running"],
                 "the gang Job's pods never ran", timeout=60)
        kubectl("apply", "-f", "-", input_text=example("kube-gpu-pod.yaml", 2))
        wait_for(lambda: "FailedScheduling" in (d := kubectl("describe", "pod", "train-small")) and "gpusched:" in d,
                 lambda: f"the waiting pod never said why:\n{kubectl('describe', 'pod', 'train-small')}", timeout=30)
        wait_for(lambda: kubectl("get", "pod", "train-small", "-o", "jsonpath={.status.phase}") == "Succeeded",
                 "the pod never finished", timeout=60)
        api = json.loads(endpoints.read_text())["api"]
        jobs = subprocess.run([sys.executable, "-m", "libs.cli.main", "jobs", "--json"], capture_output=True,
                              text=True, check=True, env={**env, "GPUSCHED_API": api}, cwd=REPO, timeout=60)
        states = sorted(j["state"] for j in json.loads(jobs.stdout))
        assert states == ["succeeded", "succeeded"], states
    finally:
        for proc in (platform, cluster):
            if proc is not None and proc.poll() is None:
                proc.send_signal(signal.SIGINT)
        deadline = time.monotonic() + 60
        for proc in (platform, cluster):
            if proc is not None:
                proc.wait(timeout=max(1.0, deadline - time.monotonic()))
    assert platform is not None and platform.returncode == 0
    assert cluster.returncode == 0
