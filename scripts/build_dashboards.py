"""Build the provisioned Grafana dashboards (infra/grafana/dashboards/*.json) from one description, so that the
five dashboards share their panel styles, datasource and variables. Run it after changing a panel:

    .venv/bin/python scripts/build_dashboards.py           # write the JSON files
    .venv/bin/python scripts/build_dashboards.py --check   # exit 1 when a committed file differs

tests/unit/views/test_dashboards.py checks that the committed JSON is this script's output, and
tests/e2e/test_observability.py that every query returns data from a real Prometheus scraping the platform.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

Json = dict[str, Any]

OUT = Path(__file__).resolve().parents[1] / "infra" / "grafana" / "dashboards"
# The uid of the datasource in infra/grafana/provisioning/datasources/prometheus.yml.
DATASOURCE: Json = {"type": "prometheus", "uid": "prometheus"}
SERVICES = "admission|quota|placement|preemption|accounting|node-telemetry"
GPU_HOURS = "suffix: GPU-h"
# Cost is in the currency of the per-model rates accounting is configured with.
COST = "short"

# --- panels ------------------------------------------------------------------------------------------------


def target(expr: str, legend: str = "", ref: str = "A") -> Json:
    return {"datasource": DATASOURCE, "expr": expr, "legendFormat": legend or "__auto", "refId": ref, "range": True}


def _targets(queries: Iterable[tuple[str, str]]) -> list[Json]:
    return [target(expr, legend, chr(ord("A") + i)) for i, (expr, legend) in enumerate(queries)]


def _defaults(unit: str, min_: float | None, max_: float | None, decimals: int | None) -> Json:
    d: Json = {"unit": unit}
    if min_ is not None:
        d["min"] = min_
    if max_ is not None:
        d["max"] = max_
    if decimals is not None:
        d["decimals"] = decimals
    return d


def _thresholds(steps: Sequence[tuple[float | None, str]]) -> Json:
    return {"mode": "absolute", "steps": [{"color": color, "value": value} for value, color in steps]}


NEUTRAL = [(None, "blue")]


def timeseries(title: str, description: str, queries: list[tuple[str, str]], unit: str = "short",
               stack: bool = False, min_: float | None = 0, max_: float | None = None,
               decimals: int | None = None) -> Json:
    defaults = _defaults(unit, min_, max_, decimals)
    defaults.update(color={"mode": "palette-classic"}, custom={
        "drawStyle": "line", "lineWidth": 1, "fillOpacity": 20 if stack else 10, "showPoints": "never",
        "spanNulls": False, "stacking": {"mode": "normal" if stack else "none", "group": "A"}})
    return {"type": "timeseries", "title": title, "description": description, "targets": _targets(queries),
            "fieldConfig": {"defaults": defaults, "overrides": []},
            "options": {"legend": {"displayMode": "table", "placement": "right", "showLegend": True,
                                   "calcs": ["lastNotNull", "max"]},
                        "tooltip": {"mode": "multi", "sort": "desc"}}}


def stat(title: str, description: str, queries: list[tuple[str, str]], unit: str = "short",
         steps: Sequence[tuple[float | None, str]] = NEUTRAL, decimals: int | None = None) -> Json:
    defaults = _defaults(unit, None, None, decimals)
    defaults.update(color={"mode": "thresholds"}, thresholds=_thresholds(steps))
    return {"type": "stat", "title": title, "description": description, "targets": _targets(queries),
            "fieldConfig": {"defaults": defaults, "overrides": []},
            "options": {"reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
                        "colorMode": "value", "graphMode": "area", "justifyMode": "auto", "textMode": "auto",
                        "orientation": "auto"}}


def gauge(title: str, description: str, queries: list[tuple[str, str]], unit: str = "percentunit",
          steps: Sequence[tuple[float | None, str]] = NEUTRAL, max_: float = 1) -> Json:
    defaults = _defaults(unit, 0, max_, None)
    defaults.update(color={"mode": "thresholds"}, thresholds=_thresholds(steps))
    return {"type": "gauge", "title": title, "description": description, "targets": _targets(queries),
            "fieldConfig": {"defaults": defaults, "overrides": []},
            "options": {"reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
                        "showThresholdLabels": False, "showThresholdMarkers": True, "orientation": "auto"}}


def bars(title: str, description: str, queries: list[tuple[str, str]], unit: str = "short",
         steps: Sequence[tuple[float | None, str]] = NEUTRAL, max_: float | None = None,
         decimals: int | None = None) -> Json:
    """A bar gauge: one bar per series, its last value (totals over the dashboard's range, shares)."""
    defaults = _defaults(unit, 0, max_, decimals)
    defaults.update(color={"mode": "thresholds"}, thresholds=_thresholds(steps))
    return {"type": "bargauge", "title": title, "description": description,
            "targets": [{**t, "range": False, "instant": True} for t in _targets(queries)],
            "fieldConfig": {"defaults": defaults, "overrides": []},
            "options": {"reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
                        "displayMode": "gradient", "orientation": "horizontal", "showUnfilled": True,
                        "valueMode": "color", "namePlacement": "auto", "sizing": "auto"}}


def states(title: str, description: str, queries: list[tuple[str, str]], mapping: dict[int, tuple[str, str]]) -> Json:
    """A state timeline: which of a few values (online/lost, up/down) each series had when."""
    return {"type": "state-timeline", "title": title, "description": description, "targets": _targets(queries),
            "fieldConfig": {"defaults": {
                "color": {"mode": "thresholds"}, "thresholds": _thresholds([(None, "blue")]),
                "mappings": [{"type": "value", "options": {
                    str(v): {"text": text, "color": color, "index": i}
                    for i, (v, (text, color)) in enumerate(sorted(mapping.items()))}}],
                "custom": {"lineWidth": 0, "fillOpacity": 80}}, "overrides": []},
            "options": {"showValue": "auto", "mergeValues": True, "rowHeight": 0.9, "alignValue": "left",
                        "legend": {"displayMode": "list", "placement": "bottom", "showLegend": True},
                        "tooltip": {"mode": "single", "sort": "none"}}}


# --- dashboards --------------------------------------------------------------------------------------------


def variable(name: str, label: str, metric: str) -> Json:
    """A multi-value query variable over one label of `metric`; "All" is the regex `.*`."""
    query = f"label_values({metric}, {name})"
    return {"name": name, "label": label, "type": "query", "datasource": DATASOURCE, "definition": query,
            "query": {"query": query, "refId": "PrometheusVariableQueryEditor-VariableQuery", "qryType": 1},
            "refresh": 2, "multi": True, "includeAll": True, "allValue": ".*",
            "current": {"selected": True, "text": ["All"], "value": ["$__all"]},
            "options": [], "sort": 1, "hide": 0, "regex": "", "skipUrlSync": False}


QUEUE = variable("queue", "Queue", "gpusched_pending_jobs")
TEAM = variable("team", "Team", "gpusched_gpu_seconds_total")
NODE = variable("node", "Node", "gpusched_node_online")


def dashboard(uid: str, title: str, description: str, rows: list[list[tuple[int, Json]]],
              variables: list[Json], height: dict[int, int] | None = None, time_from: str = "now-30m") -> Json:
    """Lay the rows out on Grafana's 24-column grid; each row is a list of (width, panel)."""
    panels: list[Json] = []
    y = 0
    for r, row in enumerate(rows):
        assert sum(w for w, _ in row) == 24, f"{uid} row {r} is not 24 columns wide"
        h = (height or {}).get(r, 8)
        x = 0
        for w, panel in row:
            panels.append({"id": len(panels) + 1, "type": panel["type"], "title": panel["title"],
                           "datasource": DATASOURCE, "gridPos": {"x": x, "y": y, "w": w, "h": h}, **panel})
            x += w
        y += h
    return {"uid": uid, "title": title, "description": description, "tags": ["gpusched"], "schemaVersion": 39,
            "version": 1, "editable": True, "graphTooltip": 1, "timezone": "browser", "refresh": "5s",
            "time": {"from": time_from, "to": "now"}, "timepicker": {}, "fiscalYearStartMonth": 0,
            "liveNow": False, "links": [{"title": "gpusched", "type": "dashboards", "tags": ["gpusched"],
                                          "asDropdown": True, "includeVars": False, "keepTime": True}],
            "annotations": {"list": [{"builtIn": 1, "datasource": {"type": "grafana", "uid": "-- Grafana --"},
                                      "enable": True, "hide": True, "iconColor": "rgba(0, 211, 255, 1)",
                                      "name": "Annotations & Alerts", "type": "dashboard"}]},
            "templating": {"list": variables}, "panels": panels}


Q = 'queue=~"$queue"'
RATE = "[$__rate_interval]"
PCT_STEPS: list[tuple[float | None, str]] = [(None, "blue"), (0.5, "green"), (0.9, "orange"), (0.98, "red")]
BAD_WHEN_ANY: list[tuple[float | None, str]] = [(None, "green"), (1, "red")]


def overview() -> Json:
    return dashboard("gpusched-overview", "gpusched overview",
                     "The cluster at a glance: GPU allocation, idle and fragmented capacity, utilisation, queues "
                     "and the services' decision rate and lag.", [
        [(4, gauge("GPU allocation", "Allocated share of healthy GPU capacity (gpusched_gpu_allocation_ratio).",
                   [("max(gpusched_gpu_allocation_ratio)", "allocated / healthy")], steps=PCT_STEPS)),
         (4, stat("Idle GPUs", "Healthy GPUs with nothing allocated, as a share of healthy GPUs "
                  "(gpusched_gpu_idle_ratio).", [("max(gpusched_gpu_idle_ratio)", "idle")], "percentunit")),
         (4, stat("Fragmentation", "Free healthy capacity on partly allocated GPUs over all free healthy "
                  "capacity: high means free GPU is scattered in pieces whole-GPU jobs cannot use "
                  "(gpusched_gpu_fragmentation_ratio).",
                  [("max(gpusched_gpu_fragmentation_ratio)", "fragmented")], "percentunit",
                  [(None, "green"), (0.3, "orange"), (0.6, "red")])),
         (4, stat("GPU utilisation", "Mean utilisation of all GPUs from node telemetry "
                  "(gpusched_gpu_utilization_ratio).", [("avg(gpusched_gpu_utilization_ratio)", "mean")],
                  "percentunit")),
         (4, stat("Nodes", "Nodes online and lost (gpusched_nodes).",
                  [('max by (state) (gpusched_nodes{state="online"})', "online"),
                   ('max by (state) (gpusched_nodes{state="lost"})', "lost")], decimals=0)),
         (4, stat("Pending jobs", "Jobs waiting for quota or GPUs in the selected queues (gpusched_pending_jobs).",
                  [(f"sum(gpusched_pending_jobs{{{Q}}})", "pending")], decimals=0))],
        [(8, timeseries("GPUs by state", "Cluster GPUs: total, healthy, allocated (gpusched_cluster_gpus).",
                        [("max by (state) (gpusched_cluster_gpus)", "{{state}}")], decimals=0)),
         (8, timeseries("GPUs and NPUs by vendor, model and state", "Per accelerator model (NVIDIA GPUs, Ascend "
                        "NPUs): total, healthy, allocated (gpusched_model_gpus).",
                        [("max by (vendor, kind, model, state) (gpusched_model_gpus)",
                          "{{vendor}} {{kind}} {{model}} {{state}}")])),
         (8, timeseries("Allocation, idle share and fragmentation", "The three capacity ratios over time.",
                        [("max(gpusched_gpu_allocation_ratio)", "allocated"),
                         ("max(gpusched_gpu_idle_ratio)", "idle"),
                         ("max(gpusched_gpu_fragmentation_ratio)", "fragmented")], "percentunit", max_=1))],
        [(12, timeseries("GPU utilisation and memory per model", "Mean utilisation and memory use of the GPUs "
                         "of each model, from node telemetry (gpusched_gpu_utilization_ratio, "
                         "gpusched_gpu_memory_used_ratio).",
                         [("avg by (model) (gpusched_gpu_utilization_ratio)", "{{model}} utilisation"),
                          ("avg by (model) (gpusched_gpu_memory_used_ratio)", "{{model}} memory")],
                         "percentunit", max_=1)),
         (12, timeseries("Allocated GPUs per team", "GPUs allocated to each team's running jobs "
                         "(gpusched_allocated_gpus).", [("sum by (team) (gpusched_allocated_gpus)", "{{team}}")],
                         stack=True))],
        [(12, timeseries("Pending jobs per queue", "Jobs admitted but not yet placed (gpusched_pending_jobs).",
                         [(f"sum by (queue) (gpusched_pending_jobs{{{Q}}})", "{{queue}}")])),
         (12, timeseries("Running jobs per queue", "Jobs placed and running (gpusched_running_jobs).",
                         [(f"sum by (queue) (gpusched_running_jobs{{{Q}}})", "{{queue}}")], stack=True))],
        [(12, timeseries("Time to start p50 / p95 per queue", "Submission to first start "
                         "(gpusched_job_start_wait_seconds).",
                         [(f"histogram_quantile(0.50, sum by (le, queue) (rate(gpusched_job_start_wait_seconds_bucket"
                           f"{{{Q}}}{RATE})))", "{{queue}} p50"),
                          (f"histogram_quantile(0.95, sum by (le, queue) (rate(gpusched_job_start_wait_seconds_bucket"
                           f"{{{Q}}}{RATE})))", "{{queue}} p95")], "s")),
         (12, timeseries("Reserved vs nominal GPUs per queue", "Quota reserved by each queue's jobs against its "
                         "nominal quota (gpusched_queue_reserved_gpus, gpusched_queue_nominal_gpus).",
                         [(f"sum by (queue) (gpusched_queue_reserved_gpus{{{Q}}})", "{{queue}} reserved"),
                          (f"sum by (queue) (gpusched_queue_nominal_gpus{{{Q}}})", "{{queue}} nominal")]))],
        [(12, timeseries("Preemptions / evictions rate", "Jobs chosen as preemption victims per queue and reason, "
                         "and jobs evicted by executors per reason.",
                         [(f"sum by (queue, reason) (rate(gpusched_preemptions_total{{{Q}}}{RATE}))",
                           "preempt {{queue}} ({{reason}})"),
                          (f"sum by (reason) (rate(gpusched_evictions_total{RATE}))", "evict ({{reason}})")], "ops")),
         (12, timeseries("Decisions/s per service", "Decisions each service published "
                         "(gpusched_decisions_total).",
                         [(f"sum by (service) (rate(gpusched_decisions_total{RATE}))", "{{service}}")], "ops"))],
        [(6, timeseries("Reactor lag", "Events in the log a service has not handled yet "
                        "(gpusched_reactor_lag_events): a service falling behind.",
                        [("max by (service) (gpusched_reactor_lag_events)", "{{service}}")], decimals=0)),
         (6, timeseries("Reactor batch latency p99", "Time to decide, publish and acknowledge one batch.",
                        [(f"histogram_quantile(0.99, sum by (le, service) (rate(gpusched_reactor_batch_seconds_bucket"
                          f"{RATE})))", "{{service}}")], "s")),
         (6, timeseries("Consumer last sequence", "Stream sequence of the last event each service handled.",
                        [("max by (service) (gpusched_reactor_last_sequence)", "{{service}}")], decimals=0)),
         (6, timeseries("Dead letters", "Messages each service sent to the dead-letter stream since it started "
                        "(gpusched_dead_letters_total); any is worth a look.",
                        [("sum by (service, reason) (gpusched_dead_letters_total)", "{{service}} {{reason}}")],
                        decimals=0))],
    ], [QUEUE], height={0: 5})


def queues() -> Json:
    return dashboard("gpusched-queues", "gpusched queues and quotas",
                     "Quota, use, borrowing and lending per queue and GPU model; fair share, GPU-hour budgets, "
                     "pending work, preemptions and the GPU time evictions threw away.", [
        [(12, timeseries("Quota and use per queue and model", "Nominal quota per GPU model flavor and the GPUs "
                         "the queue's jobs hold (gpusched_queue_quota_gpus, gpusched_queue_used_gpus).",
                         [(f"sum by (queue, flavor) (gpusched_queue_quota_gpus{{{Q}}})", "{{queue}} {{flavor}} quota"),
                          (f"sum by (queue, flavor) (gpusched_queue_used_gpus{{{Q}}})", "{{queue}} {{flavor}} used")])),
         (12, timeseries("Borrowed and lent per queue and model", "GPUs a queue holds above its nominal quota "
                         "(borrowed) and GPUs of its idle quota its cohort uses (lent).",
                         [(f"sum by (queue, flavor) (gpusched_queue_borrowed_gpus{{{Q}}})",
                           "{{queue}} {{flavor}} borrowed"),
                          (f"sum by (queue, flavor) (gpusched_queue_lent_gpus{{{Q}}})",
                           "{{queue}} {{flavor}} lent")]))],
        [(8, bars("Quota in use", "GPUs in use over nominal quota per queue; above 100 % the queue borrows.",
                  [(f"sum by (queue) (gpusched_queue_used_gpus{{{Q}}}) / "
                    f"(sum by (queue) (gpusched_queue_quota_gpus{{{Q}}}) > 0)", "{{queue}}")], "percentunit",
                  [(None, "green"), (1, "orange")], max_=2)),
         (8, timeseries("Reserved vs nominal GPUs per queue", "Quota reserved by each queue's jobs against its "
                        "nominal quota (gpusched_queue_reserved_gpus, gpusched_queue_nominal_gpus).",
                        [(f"sum by (queue) (gpusched_queue_reserved_gpus{{{Q}}})", "{{queue}} reserved"),
                         (f"sum by (queue) (gpusched_queue_nominal_gpus{{{Q}}})", "{{queue}} nominal")])),
         (8, timeseries("Fair share per queue", "Weighted decayed usage relative to nominal; 1 = exactly its "
                        "share, above 1 it yields to its cohort (gpusched_queue_fair_share).",
                        [(f"max by (queue) (gpusched_queue_fair_share{{{Q}}})", "{{queue}}")]))],
        [(12, timeseries("GPU-hour budget and what is left", "Budget per period and GPU-hours left in the "
                         "current period (gpusched_queue_budget_gpu_hours, gpusched_queue_budget_left_gpu_hours).",
                         [(f"max by (queue) (gpusched_queue_budget_gpu_hours{{{Q}}})", "{{queue}} budget"),
                          (f"max by (queue) (gpusched_queue_budget_left_gpu_hours{{{Q}}})", "{{queue}} left")],
                         GPU_HOURS)),
         (12, bars("Budget spent", "Share of the period's GPU-hour budget spent; over 90 % the "
                   "GpuschedQueueBudgetNearlySpent alert fires.",
                   [(f"1 - max by (queue) (gpusched_queue_budget_left_gpu_hours{{{Q}}}) / "
                     f"(max by (queue) (gpusched_queue_budget_gpu_hours{{{Q}}}) > 0)", "{{queue}}")],
                   "percentunit", [(None, "green"), (0.75, "orange"), (0.9, "red")], max_=1))],
        [(8, timeseries("Pending jobs per queue", "Jobs waiting for quota or GPUs (gpusched_pending_jobs).",
                        [(f"sum by (queue) (gpusched_pending_jobs{{{Q}}})", "{{queue}}")])),
         (8, timeseries("Oldest pending job per queue", "Age of the oldest pending job "
                        "(gpusched_queue_oldest_pending_seconds); GpuschedJobsPendingTooLong watches it.",
                        [(f"max by (queue) (gpusched_queue_oldest_pending_seconds{{{Q}}})", "{{queue}}")], "s")),
         (8, timeseries("Running jobs per queue", "Jobs placed and running (gpusched_running_jobs).",
                        [(f"sum by (queue) (gpusched_running_jobs{{{Q}}})", "{{queue}}")], stack=True))],
        [(12, timeseries("Preemption victims per queue and reason", "Jobs chosen as preemption victims per "
                         "second (gpusched_preemptions_total): reclaim of lent quota, or priority.",
                         [(f"sum by (queue, reason) (rate(gpusched_preemptions_total{{{Q}}}{RATE}))",
                           "{{queue}} {{reason}}")], "ops")),
         (12, timeseries("GPU-hours lost to evictions", "GPU time evictions threw away (run time not covered by "
                         "a checkpoint) per queue and reason, cumulative over the whole log (accounting recounts it "
                         "from the log when it starts; gpusched_eviction_lost_gpu_seconds_total / 3600).",
                         [(f"sum by (queue, reason) (gpusched_eviction_lost_gpu_seconds_total{{{Q}}}) / 3600",
                           "{{queue}} {{reason}}")], GPU_HOURS))],
    ], [QUEUE])


def jobs() -> Json:
    finished = f"gpusched_jobs_finished_total{{{Q}"
    return dashboard("gpusched-jobs", "gpusched job delivery",
                     "How fast jobs start, how many succeed, how often they are retried or interrupted, and the "
                     "flow of submissions and completions per queue and priority.", [
        [(5, stat("Success rate (1 h)", "Succeeded over succeeded + failed jobs in the last hour (cancelled "
                  "and rejected jobs left out).",
                  [(f'sum(increase({finished},state="succeeded"}}[1h])) / '
                    f'sum(increase({finished},state=~"succeeded|failed"}}[1h]))', "success")], "percentunit",
                  [(None, "red"), (0.9, "orange"), (0.98, "green")])),
         (5, stat("Submitted (1 h)", "Jobs submitted in the last hour (gpusched_jobs_submitted_total).",
                  [(f"sum(increase(gpusched_jobs_submitted_total{{{Q}}}[1h]))", "submitted")], decimals=0)),
         (5, stat("Finished (1 h)", "Jobs that reached a final state in the last hour, per state.",
                  [(f"sum by (state) (increase({finished}}}[1h]))", "{{state}}")], decimals=0)),
         (4, stat("Retries (1 h)", "Failed jobs run again in the last hour (gpusched_job_retries_total).",
                  [(f"sum(increase(gpusched_job_retries_total{{{Q}}}[1h]))", "retries")], decimals=0)),
         (5, stat("Long-job interruption rate", "Evictions of jobs declaring 1 h or more over their first starts, "
                  "over the whole log (gpusched_long_job_interruptions_total / "
                  "gpusched_long_jobs_started_total).",
                  [(f"(sum(gpusched_long_job_interruptions_total{{{Q}}}) or vector(0)) / "
                    f"sum(gpusched_long_jobs_started_total{{{Q}}})", "interrupted / started")], "percentunit",
                  [(None, "green"), (0.05, "orange"), (0.2, "red")]))],
        [(12, timeseries("Time to start p50 / p95 per queue and priority", "Submission to first start "
                         "(gpusched_job_start_wait_seconds).",
                         [(f"histogram_quantile(0.50, sum by (le, queue, priority) "
                           f"(rate(gpusched_job_start_wait_seconds_bucket{{{Q}}}{RATE})))",
                           "{{queue}} {{priority}} p50"),
                          (f"histogram_quantile(0.95, sum by (le, queue, priority) "
                           f"(rate(gpusched_job_start_wait_seconds_bucket{{{Q}}}{RATE})))",
                           "{{queue}} {{priority}} p95")],
                         "s")),
         (12, timeseries("Quota wait p50 / p95 per queue and priority", "Submission to quota reservation "
                         "(gpusched_admission_wait_time_seconds, Kueue's admission wait).",
                         [(f"histogram_quantile(0.50, sum by (le, queue, priority) "
                           f"(rate(gpusched_admission_wait_time_seconds_bucket{{{Q}}}{RATE})))",
                           "{{queue}} {{priority}} p50"),
                          (f"histogram_quantile(0.95, sum by (le, queue, priority) "
                           f"(rate(gpusched_admission_wait_time_seconds_bucket{{{Q}}}{RATE})))",
                           "{{queue}} {{priority}} p95")], "s"))],
        [(12, timeseries("Submitted per queue and priority", "Jobs submitted per second "
                         "(gpusched_jobs_submitted_total).",
                         [(f"sum by (queue, priority) (rate(gpusched_jobs_submitted_total{{{Q}}}{RATE}))",
                           "{{queue}} {{priority}}")], "ops")),
         (12, timeseries("Finished per queue and state", "Jobs reaching a final state per second "
                         "(gpusched_jobs_finished_total).",
                         [(f"sum by (queue, state) (rate({finished}}}{RATE}))", "{{queue}} {{state}}")], "ops"))],
        [(8, timeseries("Success rate per queue (1 h)", "Succeeded over succeeded + failed jobs in the last hour.",
                        [(f'(sum by (queue) (increase({finished},state="succeeded"}}[1h])) '
                          f'or 0 * sum by (queue) (increase({finished},state="failed"}}[1h]))) / '
                          f'sum by (queue) (increase({finished},state=~"succeeded|failed"}}[1h]))', "{{queue}}")],
                        "percentunit", max_=1)),
         (8, timeseries("Retries per queue and reason", "Failed jobs run again per second "
                        "(gpusched_job_retries_total).",
                        [(f"sum by (queue, reason) (rate(gpusched_job_retries_total{{{Q}}}{RATE}))",
                          "{{queue}} {{reason}}")], "ops")),
         (8, timeseries("Long-job interruption rate per queue", "Evictions of jobs declaring 1 h or more over "
                        "their first starts, over the whole log (accounting recounts both when it starts).",
                        [(f"(sum by (queue) (gpusched_long_job_interruptions_total{{{Q}}}) "
                          f"or 0 * sum by (queue) (gpusched_long_jobs_started_total{{{Q}}})) / "
                          f"sum by (queue) (gpusched_long_jobs_started_total{{{Q}}})", "{{queue}}")], "percentunit"))],
        [(12, timeseries("Evictions by reason", "Jobs evicted by executors per second: preempted, node_lost, "
                         "gpu_unhealthy, cancelled (gpusched_evictions_total).",
                         [(f"sum by (reason) (rate(gpusched_evictions_total{RATE}))", "{{reason}}")], "ops")),
         (12, timeseries("Oldest pending job per queue", "Age of the oldest pending job "
                         "(gpusched_queue_oldest_pending_seconds).",
                         [(f"max by (queue) (gpusched_queue_oldest_pending_seconds{{{Q}}})", "{{queue}}")], "s"))],
        [(12, timeseries("Inference replicas: desired and ready", "Replicas of each inference service wanted by "
                         "its autoscaling and running (gpusched_inference_replicas).",
                         [(f"sum by (service, state) (gpusched_inference_replicas{{{Q}}})",
                           "{{service}} {{state}}")])),
         (12, timeseries("Inference scale-up time p99", "From a scale-up decision to its last new replica ready "
                         "(gpusched_inference_scale_up_seconds).",
                         [("histogram_quantile(0.99, sum by (le, service) "
                           "(gpusched_inference_scale_up_seconds_bucket))", "{{service}}")], "s"))],
        [(12, timeseries("Inference load per ready replica", "The last reported load over the ready replicas "
                         "(gpusched_inference_load_per_replica).",
                         [("gpusched_inference_load_per_replica", "{{service}} {{metric}}")])),
         (12, timeseries("Inference time below desired replicas", "Share of time each service had fewer ready "
                         "replicas than desired (gpusched_inference_below_desired_seconds_total).",
                         [(f"sum by (service) (rate(gpusched_inference_below_desired_seconds_total{RATE}))",
                           "{{service}}")], "percentunit"))],
    ], [QUEUE], height={0: 5})


def nodes() -> Json:
    n = 'node=~"$node"'
    up = f'up{{job=~"{SERVICES}"}}'
    return dashboard("gpusched-nodes", "gpusched nodes and GPU health",
                     "Nodes online and lost, quarantined GPUs, per-GPU utilisation and memory from telemetry, "
                     "and the health of the six services (up, dead letters, lag).", [
        [(4, stat("Nodes online", "Nodes reporting (gpusched_nodes{state=\"online\"}).",
                  [('max(gpusched_nodes{state="online"})', "online")], decimals=0)),
         (4, stat("Nodes lost", "Nodes the platform lost (gpusched_nodes{state=\"lost\"}); "
                  "GpuschedNodeLost fires for each.", [('max(gpusched_nodes{state="lost"})', "lost")],
                  steps=BAD_WHEN_ANY, decimals=0)),
         (4, stat("Unhealthy GPUs", "GPUs quarantined as unhealthy on all nodes (gpusched_node_unhealthy_gpus).",
                  [("sum(gpusched_node_unhealthy_gpus)", "unhealthy")], steps=BAD_WHEN_ANY, decimals=0)),
         (4, stat("Healthy GPU share", "Healthy GPUs over all GPUs (gpusched_cluster_gpus).",
                  [('max(gpusched_cluster_gpus{state="healthy"}) / max(gpusched_cluster_gpus{state="total"})',
                    "healthy")], "percentunit", [(None, "red"), (0.9, "orange"), (0.98, "green")])),
         (4, stat("Services up", "Services Prometheus scrapes successfully, of six.",
                  [(f"sum({up})", "up")], steps=[(None, "red"), (6, "green")], decimals=0)),
         (4, stat("Dead letters", "Messages sent to the dead-letter stream since the services started.",
                  [("sum(gpusched_dead_letters_total)", "dead letters")], steps=BAD_WHEN_ANY, decimals=0))],
        [(12, states("Node online", "1 online, 0 lost (gpusched_node_online).",
                     [(f"max by (node) (gpusched_node_online{{{n}}})", "{{node}}")],
                     {0: ("lost", "red"), 1: ("online", "green")})),
         (12, timeseries("Unhealthy GPUs per node", "GPUs quarantined on each node "
                         "(gpusched_node_unhealthy_gpus); GpuschedGpuQuarantined fires while any is.",
                         [(f"max by (node) (gpusched_node_unhealthy_gpus{{{n}}})", "{{node}}")], decimals=0))],
        [(12, timeseries("GPU utilisation per GPU", "Telemetry samples per GPU (gpusched_gpu_utilization_ratio).",
                         [(f"max by (node, gpu, model) (gpusched_gpu_utilization_ratio{{{n}}})",
                           "{{node}}/{{gpu}} {{model}}")], "percentunit", max_=1)),
         (12, timeseries("GPU memory used per GPU", "Telemetry samples per GPU (gpusched_gpu_memory_used_ratio).",
                         [(f"max by (node, gpu, model) (gpusched_gpu_memory_used_ratio{{{n}}})",
                           "{{node}}/{{gpu}} {{model}}")], "percentunit", max_=1))],
        [(8, timeseries("GPUs per model by state", "Total, healthy and allocated GPUs of each model "
                        "(gpusched_model_gpus).",
                        [("max by (model, state) (gpusched_model_gpus)", "{{model}} {{state}}")])),
         (8, states("Service up", "Whether Prometheus can scrape each service (up); GpuschedServiceDown fires "
                    "after a minute down.", [(f"max by (job) ({up})", "{{job}}")],
                    {0: ("down", "red"), 1: ("up", "green")})),
         (8, timeseries("Dead letters per service and reason", "Messages sent to the dead-letter stream per "
                        "service and reason (malformed, invalid, type_mismatch, handler_error), since start.",
                        [("sum by (service, reason) (gpusched_dead_letters_total)", "{{service}} {{reason}}")],
                        decimals=0))],
        [(8, timeseries("Reactor lag per service", "Events in the log not yet handled "
                        "(gpusched_reactor_lag_events); GpuschedServiceLagging watches it.",
                        [("max by (service) (gpusched_reactor_lag_events)", "{{service}}")], decimals=0)),
         (8, timeseries("Events handled per service", "Log events each service handled per second.",
                        [(f"sum by (service) (rate(gpusched_events_consumed_total{RATE}))", "{{service}}")], "ops")),
         (8, timeseries("Start-up replay time", "How long each service's last start-up replay of the log took "
                        "(gpusched_reactor_catch_up_seconds).",
                        [("max by (service) (gpusched_reactor_catch_up_seconds)", "{{service}}")], "s"))],
    ], [NODE], height={0: 5})


def cost() -> Json:
    t = 'team=~"$team"'
    return dashboard("gpusched-cost", "gpusched cost and capacity",
                     "GPU-hours and cost per team, queue and GPU model, what each team holds now, and the daily "
                     "peak of GPU demand per model against healthy capacity with a linear forecast. GPU time and "
                     "cost are counted when a run ends (finishes, fails or is evicted).", [
        [(8, bars("GPU-hours per team", "GPU-hours of runs that ended in the dashboard's time range "
                  "(gpusched_gpu_seconds_total / 3600).",
                  [(f"sum by (team) (increase(gpusched_gpu_seconds_total{{{t}}}[$__range])) / 3600", "{{team}}")],
                  GPU_HOURS, decimals=1)),
         (8, bars("Cost per team", "Cost of runs that ended in the dashboard's time range, from the per-model "
                  "GPU-hour rates (infra/config/rates.toml; gpusched_cost_total).",
                  [(f"sum by (team) (increase(gpusched_cost_total{{{t}}}[$__range]))", "{{team}}")],
                  COST, decimals=2)),
         (8, bars("Cost per model", "Cost of runs that ended in the dashboard's time range, per GPU model "
                  "(gpusched_cost_total).",
                  [(f"sum by (model) (increase(gpusched_cost_total{{{t}}}[$__range]))", "{{model}}")],
                  COST, decimals=2))],
        [(12, timeseries("GPU-hours per team and model (1 h)", "GPU-hours of runs that ended in the hour "
                         "before each point (gpusched_gpu_seconds_total).",
                         [(f"sum by (team, model) (increase(gpusched_gpu_seconds_total{{{t}}}[1h])) / 3600",
                           "{{team}} {{model}}")], GPU_HOURS, stack=True)),
         (12, timeseries("Cost per team and model (1 h)", "Cost of runs that ended in the hour before each "
                         "point (gpusched_cost_total).",
                         [(f"sum by (team, model) (increase(gpusched_cost_total{{{t}}}[1h]))",
                           "{{team}} {{model}}")], COST, stack=True))],
        [(12, timeseries("Allocated GPUs per team and model", "GPUs held by each team's running jobs now "
                         "(gpusched_allocated_gpus).",
                         [(f"sum by (team, model) (gpusched_allocated_gpus{{{t}}})", "{{team}} {{model}}")],
                         stack=True)),
         (12, bars("GPU-hours per queue and priority", "GPU-hours of runs that ended in the dashboard's time "
                   "range, per queue and priority class.",
                   [(f"sum by (queue, priority) (increase(gpusched_gpu_seconds_total{{{t}}}[$__range])) / 3600",
                     "{{queue}} {{priority}}")], GPU_HOURS, decimals=1))],
        [(16, timeseries("Capacity trend per model", "Daily peak of GPU demand (GPUs held by running jobs plus "
                         "asked for by waiting ones; the \"all\" series is the whole cluster, waiting jobs that "
                         "several models would do included) against healthy capacity, and the daily peak "
                         "forecast 14 days ahead by a linear fit over the last 7 days (the peak is recorded by "
                         "infra/prometheus/rules.yml).",
                         [("max by (model) (max_over_time(gpusched_gpu_demand_gpus[1d]))",
                           "{{model}} daily peak demand"),
                          ('max by (model) (gpusched_model_gpus{state="healthy"})', "{{model}} healthy capacity"),
                          ('sum(max by (model) (gpusched_model_gpus{state="healthy"}))', "cluster healthy capacity"),
                          ("max by (model) (predict_linear(model:gpusched_gpu_demand_gpus:max_over_time_1d[7d], "
                           "14 * 86400))", "{{model}} peak forecast (+14 d)")])),
         (8, timeseries("GPU demand per model now", "GPUs held by running jobs plus asked for by waiting ones, "
                        "per model (gpusched_gpu_demand_gpus).",
                        [("max by (model) (gpusched_gpu_demand_gpus)", "{{model}}")]))],
    ], [TEAM], time_from="now-7d")


DASHBOARDS = {"gpusched-overview.json": overview, "gpusched-queues.json": queues, "gpusched-jobs.json": jobs,
              "gpusched-nodes.json": nodes, "gpusched-cost.json": cost}


def render() -> dict[str, str]:
    """File name -> the JSON text this script writes."""
    return {name: json.dumps(build(), indent=2) + "\n" for name, build in DASHBOARDS.items()}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--check", action="store_true", help="compare with the committed files instead of writing")
    args = p.parse_args(argv)
    stale = []
    for name, text in render().items():
        path = OUT / name
        if args.check:
            if not path.exists() or path.read_text() != text:
                stale.append(name)
        else:
            path.write_text(text)
    if stale:
        print(f"out of date (run scripts/build_dashboards.py): {', '.join(stale)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
