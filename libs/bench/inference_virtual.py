"""The inference benchmark through the deciders alone, in virtual time (libs/sim/pipeline.py): the same
decision code as the services with a zero-latency pipeline and no wall clock. It shows what the scheduling
rules achieve over a whole day in seconds of CPU; `gpusched bench inference` measures the real services."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from contracts import DeployService, EventBase, ReportServiceLoad, SubmitJob
from libs.bench import inference_scenario as scenario
from libs.bench.guarantee_figures import guarantee_figures
from libs.bench.inference_metrics import compute_metrics
from libs.core.admission.idempotency_keys import job_id_for_key
from libs.core.kernel.policy import PolicyBook
from libs.core.node_health.announcements import InventoryBook
from libs.runtime.policy_file import parse_policy, policy_changes
from libs.sim.pipeline import run_virtual

START = 1_800_000_000.0  # any fixed instant: virtual time


def day_inputs(seed: int, report_period_s: float = 60.0, declare: str = "oracle") -> list[EventBase]:
    """Inventory, policy, the training backlog, the services and every load report of the day."""
    inputs: list[EventBase] = list(InventoryBook().changes(scenario.nodes(), now=START - 10))
    inputs += policy_changes(PolicyBook(), parse_policy(scenario.policy_toml(1.0)), version=1, now=START - 5)
    for i, spec in enumerate(scenario.training_backlog(seed, declare=declare)):
        job_id = job_id_for_key(spec.team, f"inference-bench-{seed}-{i}")
        inputs.append(SubmitJob(id=f"submit-{job_id}", ts=START - 1, source="bench", job_id=job_id, spec=spec))
    plans = scenario.services(time_scale=1.0)
    for plan in plans:
        inputs.append(DeployService(id=f"deploy-{plan.spec.name}", ts=START, source="bench", service=plan.spec))
    for t in scenario.report_times(report_period_s):
        for plan in plans:
            assert plan.spec.autoscaling is not None
            inputs.append(ReportServiceLoad(id=f"load-{plan.spec.name}-{t:g}", ts=START + t, source="bench",
                                            service=plan.spec.name, metric=plan.spec.autoscaling.metric,
                                            value=round(plan.curve.at(t), 1)))
    return inputs


def run_day(seed: int = 1, report_period_s: float = 60.0, tick_s: float = 30.0,
            progress: Callable[[int], None] | None = None, declare: str = "oracle") -> dict[str, Any]:
    run = run_virtual(day_inputs(seed, report_period_s, declare), tick_s=tick_s, horizon_s=scenario.DAY_S,
                      progress=progress)
    result = compute_metrics((e for _, e in run.log), START, START + scenario.DAY_S, scenario.TOTAL_GPUS,
                             time_scale=1.0, batch_queue=scenario.TRAINING)
    result.update(mode="virtual", declare=declare, seed=seed, events=len(run.log), **guarantee_figures(run.log))
    return result
