"""`gpusched submit`: a job from flags, from a job file (-f), or both (the flags override the file).

Every JobSpec field has a flag, named as users know it from Slurm and Kubernetes (tests/unit/cli/test_cli_submit.py
fails for a field without one). A flag's `dest` is the field it sets; flags not given are None and leave the
file's field (or the default) alone.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from rich.console import Console

from libs.cli import quantities
from libs.cli.client import Client
from libs.cli.output import add_json_flag, print_json
from libs.cli.submit_spec import FIELDS, merged_spec, payload, read_spec_file

console = Console()

EPILOG = """\
A job file (-f job.yaml, YAML or JSON; -f - reads stdin) holds any JobSpec fields by their names (team, queue,
gpus, duration_s, labels, ...). Flags given on the command line override the file's fields; --label adds to the
file's labels (a flag's key wins). With -f, --team and --queue may come from the file.

Times: --time is Slurm's limit (a bare number is minutes; M:S, H:M:S, D-H, D-H:M:S) and is ENFORCED: the run is
stopped at it and fails with reason runtime_limit, never retried. --duration/--estimate is only what you expect
(a bare number is seconds): the scheduler plans with it (backfill, start estimates) but never stops the job for
it. Both, and --checkpoint-interval, also take units: 90s, 30m, 2h, 1d, 1h30m.
Sizes: --gpu-memory 20G and --memory 64Gi are binary (G = Gi = GiB); a bare number is MiB.

Examples:
  gpusched submit --team demo --queue demo --gpus 2 --time 2:00:00 -- python train.py
  gpusched submit -f job.yaml --gpus 4 --label exp=lr-sweep
  gpusched submit --team demo --queue demo --mig 1g.10gb --duration 30m --key run-42
"""


def _joined(values: list[str] | None) -> list[str] | None:
    """Repeated flags whose values may also be comma-separated: --model A100,H100 --model L4."""
    return None if values is None else [v for value in values for v in value.split(",") if v]


def flag_fields(args: argparse.Namespace) -> dict[str, Any]:
    """The JobSpec fields the command line sets, and only those."""
    given = {name: getattr(args, name) for name in FIELDS if getattr(args, name, None) is not None}
    if "gpu_models" in given:
        given["gpu_models"] = _joined(given["gpu_models"])
    if "labels" in given:
        given["labels"] = dict(given["labels"])
    command = given.pop("command", None) or []
    if command[:1] == ["--"]:
        command = command[1:]
    if command:
        given["command"] = command
    if given.get("gpu_milli") and "gpus" not in given:
        given["gpus"] = 1  # a fraction is of one GPU, whatever whole GPUs a file asked for
    return given


def spec_from_args(args: argparse.Namespace) -> dict[str, Any]:
    """The payload the command sends: the job file's fields, the flags over them, checked against JobSpec."""
    file_fields, source = read_spec_file(args.file) if args.file else ({}, "")
    return payload(merged_spec(file_fields, flag_fields(args), source))


def cmd_submit(args: argparse.Namespace) -> None:
    spec = spec_from_args(args)
    if args.dry_run:
        print(json.dumps(spec, indent=2, sort_keys=True))
        return
    answer = Client().submit(spec)
    if args.json:
        print_json(answer)  # the API's answer: the spec as stored, for a repeated key the first one's
    elif answer.get("duplicate"):
        console.print(f"duplicate of existing job [bold]{answer['id']}[/bold] ({answer['state']}): "
                      "this idempotency key was used before with this same spec")
    else:
        console.print(f"submitted [bold]{answer['id']}[/bold] ({answer['state']})")
        if answer.get("reason"):  # accepted, but its queue's policy cannot serve it now: it waits for a change
            console.print(f"waits: {answer['reason']}: {answer.get('message', '')}", markup=False)


def _add_resources(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("resources (per replica)")
    g.add_argument("--gpus", type=int, help="whole GPUs per replica (default 1)")
    g.add_argument("--gpu-milli", type=int, help="a fraction of one GPU per replica, in thousandths: 1..999")
    g.add_argument("--mig", dest="mig_profile", metavar="PROFILE",
                   help="one MIG instance per replica, e.g. 1g.10gb or 3g.40gb")
    g.add_argument("--gpu-memory", dest="gpu_memory_mib", type=quantities.mib, metavar="SIZE",
                   help="GPU memory per replica: 20G, 20Gi, 40960 (MiB)")
    g.add_argument("--gpu-memory-mib", dest="gpu_memory_mib", type=int, metavar="MIB", help="the same, in MiB")
    g.add_argument("--model", dest="gpu_models", action="append", metavar="MODEL",
                   help="an allowed model: A100, Ascend910, npu:* for any NPU, Ascend910* for a family (repeatable, "
                        "or comma-separated; default: any GPU)")
    g.add_argument("--mixed-vendors", action=argparse.BooleanOptionalAction,
                   help="the job's code runs on NVIDIA GPUs and Ascend NPUs alike: --model may name both")
    g.add_argument("--cpus", dest="cpu_milli", type=quantities.cpu_milli, metavar="CPUS", help="CPUs: 2, 0.5, 500m")
    g.add_argument("--cpu-milli", type=int, help="CPUs in thousandths")
    g.add_argument("--memory", dest="memory_mib", type=quantities.mib, metavar="SIZE", help="host memory: 64G, 512Mi")
    g.add_argument("--memory-mib", type=int, help="host memory in MiB")
    g.add_argument("--rdma-nics", type=int, help="RDMA NICs per replica")
    g.add_argument("--replicas", type=int, help="replicas of a gang, placed together (default 1)")


def _add_placement(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("placement")
    g.add_argument("--topology", choices=("node", "rack", "block"),
                   help="keep a gang's replicas within one node, rack or block")
    g.add_argument("--topology-required", action=argparse.BooleanOptionalAction,
                   help="fail to place rather than spread wider than --topology")
    g.add_argument("--spread", action=argparse.BooleanOptionalAction, help="replicas on distinct nodes")


def _add_time(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("time")
    g.add_argument("-t", "--time", "--time-limit", dest="max_runtime_s", type=quantities.time_limit, metavar="TIME",
                   help="ENFORCED limit per run, as Slurm's --time (bare number: minutes; 2:00:00, 1-00:00:00, 2h)")
    g.add_argument("--duration", "--estimate", dest="duration_s", type=quantities.seconds, metavar="TIME",
                   help="the runtime you expect, NOT enforced: the scheduler plans with it (bare number: seconds; "
                        "30m, 1:30:00); --time is the limit")
    g.add_argument("--checkpoint-interval", dest="checkpoint_interval_s", type=quantities.seconds, metavar="TIME",
                   help="the job saves its state at least this often (and on SIGTERM): preempting it loses little")
    g.add_argument("--retry-exit-code", dest="retry_exit_codes", type=int, action="append", metavar="CODE",
                   help="an exit code that means 'try again' (repeatable; 128+ and node failures always retry)")


def _add_identity(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("who and what")
    g.add_argument("--team", help="the team (required unless the job file gives it)")
    g.add_argument("--queue", help="the queue (required unless the job file gives it)")
    g.add_argument("--user")
    g.add_argument("--project", help="what the GPU time is charged to inside the team")
    g.add_argument("--name")
    g.add_argument("--priority", help="priority class (default training)")
    g.add_argument("--workload", help="training (the default) or inference")
    g.add_argument("--label", dest="labels", type=quantities.label, action="append", metavar="KEY=VALUE",
                   help="a label (repeatable)")
    g.add_argument("--key", "--idempotency-key", dest="idempotency_key", metavar="KEY",
                   help="idempotency key: the same key and spec give the same job; the same key with another spec "
                        "is refused (409 idempotency_key_reused)")
    g.add_argument("--service", help="the inference service this job is a replica of")
    g.add_argument("--ready-signal", action=argparse.BooleanOptionalAction,
                   help="a service replica that says when it serves (libs.jobkit.ready()); else ready when it runs")


def add_command(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("submit", help="submit a job (flags, a job file, or both)", epilog=EPILOG,
                       formatter_class=argparse.RawDescriptionHelpFormatter,
                       description="Submit a job. Flags given on the command line override the job file's fields.")
    p.add_argument("-f", "--file", metavar="FILE", help="a job spec, YAML or JSON ('-': stdin); flags override it")
    _add_identity(p)
    _add_resources(p)
    _add_placement(p)
    _add_time(p)
    p.add_argument("--dry-run", action="store_true", help="print the spec that would be sent, and send nothing")
    p.add_argument("command", nargs=argparse.REMAINDER,
                   help="after --: the command node agents run (e.g. -- python train.py --epochs 3)")
    add_json_flag(p, help="the API's answer as one JSON document: id, state, duplicate, and the spec as stored")
    p.set_defaults(func=cmd_submit)
