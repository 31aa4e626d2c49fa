"""Accounting's metrics: the Kueue set (pending, admission wait, evictions) plus GPU allocation and cost."""

import contextlib

from prometheus_client import Counter, Gauge, Histogram

PENDING = Gauge("gpusched_pending_jobs", "Jobs waiting, per queue", ["queue"])
RUNNING = Gauge("gpusched_running_jobs", "Jobs running, per queue", ["queue"])
ADMISSION_WAIT = Histogram(
    "gpusched_admission_wait_time_seconds", "Submission to quota reservation", ["queue", "priority"],
    buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600))
QUOTA_NOMINAL = Gauge("gpusched_queue_nominal_gpus", "Nominal GPU quota per queue", ["queue"])
QUOTA_RESERVED = Gauge("gpusched_queue_reserved_gpus", "GPUs reserved per queue", ["queue"])
BORROWED = Gauge("gpusched_queue_borrowed_gpus", "GPUs a queue holds above its nominal quota", ["queue", "flavor"])
LENT = Gauge("gpusched_queue_lent_gpus", "GPUs of a queue's idle nominal quota used by its cohort", ["queue", "flavor"])
FAIR_SHARE = Gauge("gpusched_queue_fair_share", "Weighted decayed usage relative to nominal (1 = exactly its share)",
                   ["queue"])
BUDGET_LEFT = Gauge("gpusched_queue_budget_left_gpu_hours", "GPU-hours left in the queue's budget period", ["queue"])
TEAM_GPU_SECONDS = Gauge("gpusched_team_gpu_seconds", "GPU-seconds consumed per team", ["team"])
GPUS = Gauge("gpusched_cluster_gpus", "GPUs in the cluster by state", ["state"])
GPU_ALLOCATION = Gauge("gpusched_gpu_allocation_ratio", "Share of healthy GPU capacity allocated")
PREEMPTIONS = Counter("gpusched_preemptions_total", "Jobs chosen as preemption victims", ["queue", "reason"])
LONG_STARTED = Counter("gpusched_long_jobs_started_total", "Jobs declaring 1 h or more of runtime, first starts",
                       ["queue"])
LONG_INTERRUPTED = Counter("gpusched_long_job_interruptions_total",
                           "Evictions of jobs declaring 1 h or more (interruption rate: this / started)",
                           ["queue", "reason"])
RETRIES = Counter("gpusched_job_retries_total", "Failed jobs that run again", ["queue", "reason"])
EVICTIONS = Counter("gpusched_evictions_total", "Jobs evicted by executors", ["reason"])
LOST_GPU_SECONDS = Counter("gpusched_eviction_lost_gpu_seconds_total",
                           "GPU time evictions threw away (run time not covered by a checkpoint)", ["queue", "reason"])
FINISHED = Counter("gpusched_jobs_finished_total", "Jobs that reached a final state", ["queue", "state"])

# Efficiency: how much of the healthy capacity is allocated, stranded or idle.
MODEL_GPUS = Gauge("gpusched_model_gpus", "Accelerators (GPUs and NPUs) per vendor, kind and model by state (total, "
                   "healthy, allocated)", ["vendor", "kind", "model", "state"])
FRAGMENTATION = Gauge("gpusched_gpu_fragmentation_ratio",
                      "Share of free healthy GPU capacity that sits on partly allocated GPUs")
IDLE = Gauge("gpusched_gpu_idle_ratio", "Share of healthy GPUs with nothing allocated")
# Delivery.
SUBMITTED = Counter("gpusched_jobs_submitted_total", "Jobs accepted into a queue", ["queue", "priority"])
START_WAIT = Histogram(
    "gpusched_job_start_wait_seconds", "Submission to first start", ["queue", "priority"],
    buckets=(0.1, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600, 4 * 3600, 24 * 3600))
OLDEST_PENDING = Gauge("gpusched_queue_oldest_pending_seconds", "How long the queue's longest-waiting job has waited",
                       ["queue"])
# Governance per GPU model.
QUOTA_FLAVOR = Gauge("gpusched_queue_quota_gpus", "Nominal quota per queue and GPU model flavor", ["queue", "flavor"])
USED_FLAVOR = Gauge("gpusched_queue_used_gpus", "GPUs reserved per queue and GPU model flavor", ["queue", "flavor"])
BUDGET = Gauge("gpusched_queue_budget_gpu_hours", "The queue's GPU-hour budget per period", ["queue"])
# Nodes.
NODES = Gauge("gpusched_nodes", "Nodes by state (online, lost; cordoned counts cordoned and draining ones)",
              ["state"])
NODE_ONLINE = Gauge("gpusched_node_online", "1 while the node is online, 0 once lost", ["node"])
NODE_UNHEALTHY = Gauge("gpusched_node_unhealthy_gpus", "GPUs of the node out of service (quarantined)", ["node"])


def forget_node(name: str) -> None:
    """A node that left the inventory has no series any more (not a lost node's 0 for ever)."""
    for gauge in (NODE_ONLINE, NODE_UNHEALTHY):
        with contextlib.suppress(KeyError):
            gauge.remove(name)


# Cost and capacity.
GPU_SECONDS = Counter("gpusched_gpu_seconds_total", "GPU-seconds of ended runs",
                      ["team", "queue", "model", "priority"])
COST = Counter("gpusched_cost_total", "Cost of ended runs in the rates' currency", ["team", "model"])
ALLOCATED = Gauge("gpusched_allocated_gpus", "GPUs held by running jobs", ["team", "model"])
DEMAND = Gauge("gpusched_gpu_demand_gpus", "GPUs held by running jobs plus asked for by waiting ones, per model",
               ["model"])
# Inference services: replicas wanted and running, how fast scale-ups complete, load, time short of replicas.
SCALE_UP_SECONDS = Histogram("gpusched_inference_scale_up_seconds",
                             "From a scale-up decision to its last new replica ready", ["service"],
                             buckets=(0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 300))
LOAD_PER_REPLICA = Gauge("gpusched_inference_load_per_replica", "The service's last reported load over its "
                         "ready replicas", ["service", "metric"])
BELOW_DESIRED_SECONDS = Counter("gpusched_inference_below_desired_seconds_total",
                                "Time the service had fewer ready replicas than desired", ["service"])
INFERENCE_REPLICAS = Gauge("gpusched_inference_replicas", "Replicas of inference services by state (desired, ready)",
                           ["queue", "service", "state"])
