"""Inference services on the real platform (six services, real NATS and Redis): the API and CLI deploy,
scale by reported load, spread and delete a service; a compressed day of the inference benchmark scales
services up and down beside training, taking back the GPUs lent in the valleys."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import pytest

from libs.bench import inference_scenario as scenario
from libs.bench.inference_run import InferenceBenchOptions, run_inference_bench
from libs.bench.platform import bench_platform
from libs.cli.client import ApiError, Client
from tests.e2e.waiting import wait_for

pytestmark = pytest.mark.e2e

SERVICE = {"name": "chat", "min_replicas": 2, "max_replicas": 6,
           "autoscaling": {"target_per_replica": 100.0, "scale_down_window_s": 0.0},
           "replica": {"team": "web", "queue": "serving", "priority": "production-inference", "gpus": 1}}


def test_a_service_is_deployed_scaled_by_load_spread_and_deleted() -> None:
    with bench_platform(None, "inference-api", scenario.policy_toml(1.0), scenario.cluster_csv(), {}) as run:
        url = f"http://127.0.0.1:{run.sup.ports['admission']}"
        client = Client(url)
        wait_for(lambda: len(client.nodes()) == scenario.NODES, "the cluster never registered", 30)
        with pytest.raises(ApiError) as refused:
            client.deploy_service({**SERVICE, "min_replicas": 9, "max_replicas": 2})
        assert (refused.value.status, refused.value.code) == (422, "invalid_replica_bounds")

        assert client.deploy_service(SERVICE) == {"name": "chat", "state": "deploying"}
        wait_for(lambda: client.service("chat")["ready_replicas"] == 2, "two replicas never ran", 20)
        client.report_load("chat", 430.0)  # 4.3 x the target per replica: 5 replicas
        wait_for(lambda: client.service("chat")["ready_replicas"] == 5,
                 lambda: f"the service did not scale to 5: {client.service('chat')}", 20)

        def running() -> list[dict[str, Any]]:  # as projected (accounting may trail the service's own count)
            return [j for j in client.jobs(limit=100) if j["spec"].get("service") == "chat" and j["state"] == "running"]

        replicas = wait_for(lambda: len(r := running()) == 5 and r, "the five replicas were never projected", 20)
        nodes = {p["node"] for j in replicas for p in j["placements"]}
        assert len(nodes) == 5  # spread: one per node while nodes are free

        # The CLI speaks to the same API.
        env = {**os.environ, "GPUSCHED_API": url}
        listed = subprocess.run([sys.executable, "-m", "libs.cli.main", "inference", "list", "--json"], env=env,
                                capture_output=True, text=True, check=True)
        assert [(s["name"], s["desired_replicas"]) for s in json.loads(listed.stdout)] == [("chat", 5)]
        subprocess.run([sys.executable, "-m", "libs.cli.main", "inference", "load", "chat", "120"], env=env,
                       check=True, capture_output=True)
        wait_for(lambda: client.service("chat")["desired_replicas"] == 2,
                 lambda: f"the service did not scale down: {client.service('chat')}", 20)
        wait_for(lambda: len([j for j in client.jobs(limit=100, state="running")
                              if j["spec"].get("service") == "chat"]) == 2, "scale-down left replicas running", 20)

        client.delete_service("chat")
        wait_for(lambda: not client.services(), "the service was not deleted", 20)
        wait_for(lambda: not [j for j in client.jobs(limit=100, state="running") if j["spec"].get("service")],
                 "replicas still run after the delete", 20)


def test_a_compressed_day_scales_services_beside_training() -> None:
    # A day in 30 s: the same world as the benchmark, faster (so each scale-up weighs more in the shares).
    result = run_inference_bench(InferenceBenchOptions(time_scale=2880.0, report_every_s=0.2))
    assert result["scale_ups"] >= 20
    assert set(result["services"]) == {"chat", "embed", "rank"}
    assert all(s["scale_ups"] >= 5 for s in result["services"].values())
    assert result["scale_up_max_s"] < 10  # every scale-up completed, none waited for a far-off event
    assert result["preempted_jobs"] > 0  # the valleys lent to training were taken back at the peaks
    assert result["batch_gpu_hours"] > 200 and result["inference_gpu_hours"] > 200
    assert result["gpu_allocation_pct"] > 70
    assert result["decisions_checked"] > 1000 and result["replay_mismatches"] == 0
