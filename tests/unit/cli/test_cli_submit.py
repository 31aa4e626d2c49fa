"""`gpusched submit` against the contract: every JobSpec field has a flag, a job file round-trips every field,
flags override the file, a bad file is refused naming the field, and times and sizes read as users write them."""

from __future__ import annotations

import argparse
import io
import json
from pathlib import Path
from typing import Any

import msgspec
import pytest
import yaml

from contracts import JobSpec
from libs.cli import quantities
from libs.cli.main import build_parser
from libs.cli.submit import spec_from_args

# One value for every flag, none of them a field's default: the spec sent must then differ from the default
# in every field. A JobSpec field without a flag fails the test below it.
EVERY_FLAG = [
    "--team", "ml", "--queue", "ml-train", "--user", "ada", "--project", "p1", "--name", "sweep",
    "--workload", "inference", "--priority", "urgent", "--replicas", "2", "--gpus", "4",
    "--gpu-milli", "500", "--gpu-memory", "20G", "--cpus", "2.5", "--memory", "64Gi", "--model", "A100",
    "--duration", "30m", "--time", "1:00:00", "--label", "exp=lr", "--key", "run-42", "--mig", "1g.10gb",
    "--rdma-nics", "1", "--topology", "rack", "--topology-required", "--spread", "--mixed-vendors",
    "--checkpoint-interval", "5m", "--retry-exit-code", "3", "--service", "chat", "--ready-signal",
    "--", "python", "train.py",
]
EXPECTED = JobSpec(team="ml", queue="ml-train", user="ada", project="p1", name="sweep", workload="inference",
                   priority="urgent", replicas=2, gpus=4, gpu_milli=500, gpu_memory_mib=20480, cpu_milli=2500,
                   memory_mib=65536, gpu_models=("A100",), duration_s=1800.0, max_runtime_s=3600.0,
                   command=("python", "train.py"), labels={"exp": "lr"}, idempotency_key="run-42",
                   mig_profile="1g.10gb", rdma_nics=1, topology="rack", topology_required=True, spread=True,
                   mixed_vendors=True, checkpoint_interval_s=300.0, retry_exit_codes=(3,), service="chat",
                   ready_signal=True)
FIELDS = msgspec.structs.fields(JobSpec)


def parse(*argv: str) -> argparse.Namespace:
    return build_parser().parse_args(["submit", *argv])


def sent(*argv: str) -> JobSpec:
    return msgspec.convert(spec_from_args(parse(*argv)), JobSpec)


def submit_parser() -> argparse.ArgumentParser:
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices["submit"]


@pytest.mark.parametrize("field", [f.name for f in FIELDS])
def test_every_jobspec_field_has_a_flag(field: str) -> None:
    assert field in {a.dest for a in submit_parser()._actions}, f"JobSpec.{field} has no `gpusched submit` flag"


def test_setting_every_flag_sets_every_field_away_from_its_default() -> None:
    spec = sent(*EVERY_FLAG)
    assert spec == EXPECTED
    at_default = [f.name for f in FIELDS if f.default is not msgspec.NODEFAULT and getattr(spec, f.name) == f.default]
    assert at_default == [], "fields no flag in EVERY_FLAG sets; add the flag to EVERY_FLAG"


def test_fields_at_their_default_are_left_out_of_the_payload() -> None:
    assert spec_from_args(parse("--team", "demo", "--queue", "demo", "--gpus", "2", "--duration", "5")) == {
        "team": "demo", "queue": "demo", "gpus": 2, "duration_s": 5.0}
    # The README's flags, as before: a fraction is of one GPU, models repeat.
    assert spec_from_args(parse("--team", "demo", "--queue", "demo", "--gpus", "1", "--gpu-milli", "250",
                                "--model", "A100")) == {"team": "demo", "queue": "demo", "gpu_milli": 250,
                                                        "gpu_models": ["A100"]}


def write(tmp_path: Path, name: str, data: Any) -> str:
    path = tmp_path / name
    path.write_text(json.dumps(data) if name.endswith(".json") else yaml.safe_dump(data))
    return str(path)


@pytest.mark.parametrize("name", ["job.yaml", "job.json"])
def test_a_job_file_round_trips_every_field(tmp_path: Path, name: str) -> None:
    full = msgspec.to_builtins(EXPECTED)
    assert set(full) == {f.name for f in FIELDS}
    assert sent("-f", write(tmp_path, name, full)) == EXPECTED


def test_a_job_file_from_stdin(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("sys.stdin", io.StringIO("team: ml\nqueue: ml-train\ngpus: 2\n"))
    assert sent("-f", "-") == JobSpec(team="ml", queue="ml-train", gpus=2)


def test_flags_override_the_files_fields_and_add_to_its_labels(tmp_path: Path) -> None:
    path = write(tmp_path, "job.yaml", {"team": "ml", "queue": "ml-train", "gpus": 2, "duration_s": 60.0,
                                        "labels": {"a": "1", "b": "2"}, "gpu_models": ["H100"], "spread": True,
                                        "command": ["python", "old.py"]})
    spec = sent("-f", path, "--gpus", "4", "--queue", "ml-dev", "--label", "b=3", "--model", "A100",
                "--no-spread", "--", "python", "new.py")
    assert spec == JobSpec(team="ml", queue="ml-dev", gpus=4, duration_s=60.0, labels={"a": "1", "b": "3"},
                           gpu_models=("A100",), command=("python", "new.py"))
    assert sent("-f", path) == JobSpec(team="ml", queue="ml-train", gpus=2, duration_s=60.0,
                                       labels={"a": "1", "b": "2"}, gpu_models=("H100",), spread=True,
                                       command=("python", "old.py"))
    # A fraction given by flag is of one GPU, whatever the file's whole GPUs.
    assert sent("-f", path, "--gpu-milli", "250").gpus == 1


def test_team_and_queue_may_come_from_the_file_but_the_merged_spec_needs_them(tmp_path: Path) -> None:
    path = write(tmp_path, "job.yaml", {"gpus": 2})
    assert sent("-f", path, "--team", "ml", "--queue", "ml-train").gpus == 2
    with pytest.raises(ValueError, match=r"the job needs a queue: give --queue or set `queue` in the job file"):
        sent("-f", path, "--team", "ml")
    with pytest.raises(ValueError, match=r"the job needs a team: give --team \(or give a job file with -f\)"):
        sent("--queue", "q")


@pytest.mark.parametrize(("data", "message"), [
    pytest.param({"gpu": 2}, r"job.yaml: unknown field `gpu` \(did you mean `gpus`\?\)", id="unknown field"),
    pytest.param({"colour": "red"}, r"unknown field `colour`; a job spec's fields are: team, queue", id="no guess"),
    pytest.param({"gpus": "two"}, r"job.yaml: field `gpus`: expected `int`, got `str`", id="wrong type"),
    pytest.param({"command": "python x.py"}, r"field `command`: expected `array`, got `str`", id="a string command"),
    pytest.param({"labels": {"x": 1}}, r"field `labels\[KEY\]`: expected `str`, got `int`", id="a label's value"),
    pytest.param({"retry_exit_codes": [1, "x"]}, r"field `retry_exit_codes\[1\]`: expected `int`", id="in a list"),
    pytest.param(["gpus"], r"a job file is a mapping of JobSpec fields .* not a list", id="not a mapping"),
])
def test_a_bad_job_file_is_refused_naming_the_field_before_anything_is_sent(tmp_path: Path, data: Any,
                                                                              message: str) -> None:
    path = write(tmp_path, "job.yaml", data)
    with pytest.raises(ValueError, match=message):
        spec_from_args(parse("-f", path, "--team", "ml", "--queue", "ml-train"))


def test_a_file_that_is_not_yaml_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "job.json"
    path.write_text('{"team": "ml",')
    with pytest.raises(ValueError, match=r"job\.json: not valid YAML or JSON"):
        spec_from_args(parse("-f", str(path)))


@pytest.mark.parametrize(("text", "seconds"), [
    ("90", 5400.0),  # Slurm: minutes
    ("5:30", 330.0),  # M:S
    ("2:00:00", 7200.0),  # H:M:S
    ("1-12", 129600.0),  # D-H
    ("1-00:30", 88200.0),  # D-H:M
    ("2-03:04:05", 183845.0),  # D-H:M:S
    ("90s", 90.0), ("30m", 1800.0), ("2h", 7200.0), ("1d", 86400.0), ("1h30m", 5400.0), ("1.5h", 5400.0),
])
def test_time_limits_read_as_slurm_writes_them(text: str, seconds: float) -> None:
    assert quantities.time_limit(text) == seconds


def test_an_estimate_s_bare_number_is_seconds_and_a_limit_s_is_minutes() -> None:
    spec = sent("--team", "t", "--queue", "q", "--duration", "5", "--time", "5")
    assert (spec.duration_s, spec.max_runtime_s) == (5.0, 300.0)
    assert sent("--team", "t", "--queue", "q", "--estimate", "1:00:00").duration_s == 3600.0


@pytest.mark.parametrize("text", ["", "x", "5x", "1:2:3:4", "-5", "0", "1-", "h"])
def test_what_is_not_a_time_is_refused(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError):
        quantities.time_limit(text)


@pytest.mark.parametrize(("text", "mib"), [("512", 512), ("512Mi", 512), ("512M", 512), ("20G", 20480),
                                           ("20Gi", 20480), ("20GiB", 20480), ("20gb", 20480), ("1.5G", 1536),
                                           ("1T", 1 << 20), ("1536K", 2)])
def test_sizes_are_binary_and_a_bare_number_is_mib(text: str, mib: int) -> None:
    assert quantities.mib(text) == mib


def test_cpus_and_labels_as_users_write_them() -> None:
    assert [quantities.cpu_milli(t) for t in ("2", "0.5", "500m")] == [2000, 500, 500]
    assert quantities.label("a=b=c") == ("a", "b=c")
    for bad in ("nolabel", "=x"):
        with pytest.raises(argparse.ArgumentTypeError):
            quantities.label(bad)


def test_dry_run_prints_the_payload_and_sends_nothing(capsys: pytest.CaptureFixture[str],
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUSCHED_API", "http://127.0.0.1:9")  # nothing listens: a request would fail
    args = parse("--team", "ml", "--queue", "ml-train", "--time", "2h", "--dry-run")
    args.func(args)
    assert json.loads(capsys.readouterr().out) == {"team": "ml", "queue": "ml-train", "max_runtime_s": 7200.0}


class FakeClient:
    def __init__(self, answer: dict[str, Any]) -> None:
        self.answer = answer
        self.sent: list[dict[str, Any]] = []

    def submit(self, spec: dict[str, Any]) -> dict[str, Any]:
        self.sent.append(spec)
        return self.answer


def test_json_prints_what_the_api_answered_never_the_spec_it_sent(capsys: pytest.CaptureFixture[str],
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    stored = {"team": "ml", "queue": "ml-train", "gpus": 2}
    answer = {"id": "j1", "state": "running", "duplicate": True, "spec": stored}
    fake = FakeClient(answer)
    monkeypatch.setattr("libs.cli.submit.Client", lambda: fake)
    args = parse("--team", "ml", "--queue", "ml-train", "--gpus", "2", "--name", "again", "--json")
    args.func(args)
    assert json.loads(capsys.readouterr().out) == answer
    assert fake.sent == [{"team": "ml", "queue": "ml-train", "gpus": 2, "name": "again"}]
    args = parse("--team", "ml", "--queue", "ml-train", "--gpus", "2")
    args.func(args)
    assert "duplicate of existing job j1 (running)" in capsys.readouterr().out
    fake.answer = {"id": "j2", "state": "pending", "duplicate": False, "spec": stored}
    args.func(args)
    assert "submitted j2 (pending)" in capsys.readouterr().out
    fake.answer = {"id": "j3", "state": "pending", "spec": stored, "reason": "exceeds_queue_quota",
                   "message": "queue ml-train can hold at most 1 GPUs"}
    args.func(args)
    out = capsys.readouterr().out
    assert "submitted j3 (pending)" in out and "waits: exceeds_queue_quota: queue ml-train can hold at most 1" in out
