"""The command line's tables at 80 columns: the default columns keep their whole names and fit, `-o wide`
shows every column, `--json` prints one JSON document; and the commands without a JSON form refuse --json.

The API is replaced by fake answers on the Client's methods; no server runs."""

from __future__ import annotations

import argparse
import io
import json
from types import SimpleNamespace
from typing import Any

import pytest
from rich.console import Console

from libs.cli.client import Client
from libs.cli.jobs import USAGE_COLUMNS, job_columns
from libs.cli.main import _json_before_subcommand, build_parser, main
from libs.cli.nodes import NODE_COLUMNS
from libs.cli.queues import QUEUE_COLUMNS
from libs.cli.services import SERVICE_COLUMNS
from libs.cli.tables import Column, build_table, column_widths, print_table, shown_columns, table_width

NOW = 1_800_000_000.0

QUEUES = [
    {"name": "acme", "team": "acme", "nominal_gpus": 96, "reserved_gpus": 0.0, "pending": 0, "running": 0,
     "parent": "", "cohort": "", "weight": 1.0, "flavors": [], "fair_share": 0.0, "budget_gpu_hours": None,
     "budget_left_gpu_hours": None},
    {"name": "research", "team": "research", "nominal_gpus": 64, "reserved_gpus": 70.5, "pending": 128,
     "running": 37, "parent": "acme", "cohort": "acme", "weight": 2.0, "fair_share": 1.087,
     "budget_gpu_hours": 5000.0, "budget_left_gpu_hours": 1234.5,
     "flavors": [{"flavor": "H100", "nominal_gpus": 32.0, "borrowing_limit_gpus": 16.0, "lending_limit_gpus": 8.0,
                  "in_use_gpus": 40.0, "held_gpus": 36.0, "unplaced_gpus": 4.0, "borrowed_gpus": 8.0,
                  "lent_gpus": 0.0},
                 {"flavor": "A100", "nominal_gpus": 32.0, "borrowing_limit_gpus": None, "lending_limit_gpus": None,
                  "in_use_gpus": 30.5, "borrowed_gpus": 0.0, "lent_gpus": 1.5}]},
    {"name": "production-inference", "team": "product", "nominal_gpus": 32, "reserved_gpus": 12.25, "pending": 3,
     "running": 12, "parent": "acme", "cohort": "acme", "weight": 1.0, "fair_share": 0.383,
     "budget_gpu_hours": None, "budget_left_gpu_hours": None,
     "flavors": [{"flavor": "T4", "nominal_gpus": 32.0, "borrowing_limit_gpus": 0.0, "lending_limit_gpus": 16.0,
                  "in_use_gpus": 12.25, "held_gpus": 12.0, "unplaced_gpus": 0.25, "borrowed_gpus": 0.0,
                  "lent_gpus": 16.0}]},
]

JOBS: list[dict[str, Any]] = [
    {"id": "3f2b6c1e-8a47-4d2e-9b1a-0c5d7e9f1a23", "team": "research", "queue": "research", "state": "pending",
     "phase": "reserved", "reason": "over_budget_waits_for_idle_quota",
     "message": "the queue is over its budget: it waits for idle quota in its cohort", "submitted_at": NOW - 4000,
     "evictions": 1, "placements": [],
     "spec": {"team": "research", "queue": "research", "gpus": 4, "replicas": 2, "gpu_models": ["H100"],
              "user": "alice", "priority": "training"}},
    {"id": "9d0e1f2a-3b4c-4d5e-8f6a-7b8c9d0e1f2a", "team": "product", "queue": "product",
     "state": "succeeded", "phase": "succeeded", "reason": "", "message": "", "submitted_at": NOW - 50,
     "evictions": 0, "spec": {"team": "product", "queue": "product", "gpu_milli": 250},
     "placements": [{"replica": 0, "node": "gpu-node-017", "gpu_indices": [3], "gpu_milli": 250}]},
]

NODES = [
    {"name": "gpu-node-017", "online": True, "gpus": 8, "models": ["A100"], "allocated_gpus": 6.25,
     "healthy_gpus": 8, "gpu_free_milli": [1000, 750, 0, 0, 0, 0, 0, 0], "cordon": "", "cordon_reason": ""},
    {"name": "gpu-node-018", "online": True, "gpus": 8, "models": ["H100"], "allocated_gpus": 0.0,
     "healthy_gpus": 7, "gpu_free_milli": [1000] * 8, "cordon": "draining",
     "cordon_reason": "ECC errors on GPU 3, RMA requested"},
    {"name": "gpu-node-019", "online": False, "gpus": 4, "models": ["T4"], "allocated_gpus": 0.0,
     "healthy_gpus": 0, "gpu_free_milli": [], "cordon": "", "cordon_reason": ""},
]

USAGE = [
    {"team": "research", "gpu_seconds": 1_234_567.8, "jobs_finished": 4211, "lost_gpu_seconds": 36_000.0},
    {"team": "product", "gpu_seconds": 98_765.4, "jobs_finished": 87, "lost_gpu_seconds": 0.0},
]

SERVICES = [
    {"name": "chat", "team": "product", "queue": "product", "priority": "production-inference",
     "min_replicas": 2, "max_replicas": 16, "desired_replicas": 5, "ready_replicas": 4, "replicas": 5,
     "load": 452.5, "metric": "requests_per_s"},
]

# command -> (the Client method it calls, its fake answer, the table's columns)
COMMANDS: dict[str, tuple[str, Any, list[Column[Any]]]] = {
    "queues": ("queues", QUEUES, QUEUE_COLUMNS),
    "jobs": ("jobs", JOBS, job_columns(NOW)),
    "nodes": ("nodes", NODES, NODE_COLUMNS),
    "usage": ("usage", USAGE, USAGE_COLUMNS),
}


@pytest.fixture(autouse=True)
def fake_api(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "80")
    for variable in ("FORCE_COLOR", "TTY_COMPATIBLE", "TTY_INTERACTIVE"):
        monkeypatch.delenv(variable, raising=False)
    answers = {"queues": QUEUES, "nodes": NODES, "usage": USAGE, "services": SERVICES}
    for method, answer in answers.items():
        monkeypatch.setattr(Client, method, lambda self, answer=answer: answer)
    monkeypatch.setattr(Client, "jobs", lambda self, **filters: JOBS)
    monkeypatch.setattr(Client, "job", lambda self, job_id: next(j for j in JOBS if j["id"] == job_id))
    monkeypatch.setattr("libs.cli.jobs.time", SimpleNamespace(time=lambda: NOW))  # the ages, from a fixed now


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    main(list(argv))
    captured = capsys.readouterr()
    return captured.out


def header_line(out: str, first: str) -> list[str]:
    """The header row's names, as printed."""
    line = next(line for line in out.splitlines() if line.startswith(first + " "))
    return line.split()


# --- the commands at 80 columns ---------------------------------------------------------------------


@pytest.mark.parametrize("command", COMMANDS)
def test_the_default_table_fits_80_columns_with_whole_header_names(command: str,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    _, _, columns = COMMANDS[command]
    out = run(capsys, command)
    short = [c.header for c in shown_columns(columns, wide=False)]
    assert header_line(out, short[0]) == short  # every name whole, none of the wide ones
    assert max(len(line) for line in out.splitlines()) <= 80
    assert "…" not in "\n".join(out.splitlines()[:2])  # headers are never cut


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize("flag", [["-o", "wide"], ["--wide"], ["--output=wide"]])
def test_wide_shows_every_column_uncut(command: str, flag: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    _, _, columns = COMMANDS[command]
    out = run(capsys, command, *flag)
    every = [c.header for c in columns]
    assert header_line(out, every[0]) == every
    assert len(every) > len(shown_columns(columns, wide=False))
    assert "…" not in out  # nothing cut, the lines run as long as they need


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize("flag", [["--json"], ["-o", "json"]])
def test_json_prints_one_document_the_api_answer(command: str, flag: list[str],
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    _, answer, _ = COMMANDS[command]
    out = run(capsys, command, *flag)
    assert json.loads(out) == answer  # json.loads refuses anything around or after the one document


def test_the_rows_hold_the_figures(capsys: pytest.CaptureFixture[str]) -> None:
    rows = {tuple(line.split()[:2]): line.split() for line in run(capsys, "queues").splitlines()[2:]}
    # QUEUE MODEL NOMINAL HELD UNPLACED BORROWED PEND RUN SHARE
    assert rows[("research", "H100")] == ["research", "H100", "32", "36", "4", "8", "128", "37", "1.09"]
    assert rows[("production-inference", "T4")] == ["production-inference", "T4", "32", "12", "0.25", "0", "3",
                                                    "12", "0.38"]
    nodes = {line.split()[0]: line.split() for line in run(capsys, "nodes").splitlines()[2:]}
    assert nodes["gpu-node-018"][:2] == ["gpu-node-018", "draining"]
    assert nodes["gpu-node-019"][:2] == ["gpu-node-019", "offline"]
    usage = run(capsys, "usage").splitlines()[2].split()
    assert usage == ["research", "342.94", "10.00", "4211"]


def test_a_long_reason_gives_way_with_an_ellipsis_and_shows_whole_when_wide(
        capsys: pytest.CaptureFixture[str]) -> None:
    short = run(capsys, "jobs")
    line = next(line for line in short.splitlines() if line.startswith("3f2b6c1e"))
    assert "over_budge" in line and "…" in line and "over_budget_waits_for_idle_quota" not in line
    assert line.split()[:5] == ["3f2b6c1e-8a47-4d2e-9b1a-0c5d7e9f1a23", "-", "research", "pending", "2x4"]
    wide = run(capsys, "jobs", "-o", "wide")
    line = next(line for line in wide.splitlines() if line.startswith("3f2b6c1e"))
    assert "over_budget_waits_for_idle_quota" in line and "alice" in line and "1h" in line


def test_one_job_shows_its_fields_and_more_with_wide(capsys: pytest.CaptureFixture[str]) -> None:
    job_id = str(JOBS[1]["id"])
    fields = {line.split()[0] for line in run(capsys, "job", job_id).splitlines()[2:]}
    assert {"id", "state", "gpus", "submitted_at"} <= fields and "retries" not in fields
    wide = {line.split()[0] for line in run(capsys, "job", job_id, "-o", "wide").splitlines()[2:]}
    assert wide > fields and {"retries", "admitted_at", "priority"} <= wide
    assert json.loads(run(capsys, "job", job_id, "--json")) == JOBS[1]


def test_inference_list_fits_and_prints_json(capsys: pytest.CaptureFixture[str]) -> None:
    out = run(capsys, "inference", "list")
    short = [c.header for c in shown_columns(SERVICE_COLUMNS, wide=False)]
    assert header_line(out, "NAME") == short and max(map(len, out.splitlines())) <= 80
    assert out.splitlines()[1].split() == ["chat", "product", "product", "4", "5", "2-16", "452.5"]
    assert json.loads(run(capsys, "inference", "--json", "list")) == SERVICES


# --- the table helper ---------------------------------------------------------------------------------


ROWS = [{"name": "a-rather-long-node-name", "note": "word " * 30}]
COLUMNS: list[Column[dict[str, Any]]] = [
    Column("NAME", lambda r: r["name"]),
    Column("COUNT", lambda r: 12345, right=True),
    Column("NOTE", lambda r: r["note"].strip(), fit="cut"),
    Column("EXTRA", lambda r: "x", wide=True),
]


def render(columns: list[Column[dict[str, Any]]], width: int, wide: bool = False) -> list[str]:
    console = Console(width=width, record=True, file=io.StringIO())
    print_table(None, columns, ROWS, wide, console)
    return console.export_text().splitlines()


def test_only_free_text_gives_way_and_keeps_at_least_its_header() -> None:
    lines = render(COLUMNS, 50)
    assert lines[0].split() == ["NAME", "COUNT", "NOTE"]
    assert max(map(len, lines)) == 50
    assert lines[1].startswith("a-rather-long-node-name  12345  word word") and lines[1].rstrip().endswith("…")


def test_names_are_never_cut_even_when_the_terminal_is_too_narrow() -> None:
    lines = render(COLUMNS, 30)
    assert lines[0].split() == ["NAME", "COUNT", "NOTE"]
    assert lines[1].split()[:2] == ["a-rather-long-node-name", "12345"]  # whole, on a line longer than 30
    assert lines[1].endswith("word wo…") and len(lines[1]) == 23 + 5 + 8 + 2 * 2  # the note keeps 8 characters


def test_a_wrapped_column_folds_onto_more_lines_instead() -> None:
    folded: list[Column[dict[str, Any]]] = [Column("NAME", lambda r: r["name"]),
                                            Column("NOTE", lambda r: r["note"], fit="wrap")]
    lines = render(folded, 60)
    assert max(map(len, lines)) <= 60 and len(lines) > 2
    assert " ".join(line[25:].strip() for line in lines[1:]).split() == ["word"] * 30


def test_wide_renders_every_column_at_its_natural_width() -> None:
    table = build_table(None, COLUMNS, ROWS, wide=True, width=40)
    assert [c.header for c in table.columns] == ["NAME", "COUNT", "NOTE", "EXTRA"]
    assert table_width(table) == len("a-rather-long-node-name") + 5 + len(("word " * 30).strip()) + 5 + 3 * 2
    assert column_widths(shown_columns(COLUMNS, wide=False), [["n", "1", "note"]], 80) == [4, 5, 4]


def test_a_value_is_text_never_rich_markup() -> None:
    console = Console(width=80, record=True, file=io.StringIO())
    value: list[Column[str]] = [Column("VALUE", lambda v: v)]
    print_table(None, value, ["[bold]GPUs [0, 1][/bold]"], console=console)
    assert "[bold]GPUs [0, 1][/bold]" in console.export_text()


# --- --json only where a command honours it ------------------------------------------------------------


@pytest.mark.parametrize("argv", [["audit", "export", "--json"], ["audit", "--json", "export"], ["up", "--json"],
                                  ["nats-config", "--json"], ["service", "quota", "--json"],
                                  ["checkpoint", "--progress", "1", "--json"]])
def test_a_command_without_a_json_form_refuses_json(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        build_parser().parse_args(argv)
    assert exit_.value.code == 2 and "--json" in capsys.readouterr().err


@pytest.mark.parametrize("argv", [["node", "--json", "cordon", "n1"], ["node", "cordon", "n1", "--json"],
                                  ["report", "--json", "usage"], ["report", "usage", "--json"],
                                  ["bench", "--json", "chaos"], ["audit", "replay", "--json"],
                                  ["inference", "--json", "list"], ["token", "--json", "list"],
                                  ["snapshots", "show", "-o", "json"],
                                  ["whatif", "--log", "l", "--set", "s", "--json"]])
def test_json_is_taken_after_the_command_and_before_its_subcommand(argv: list[str]) -> None:
    assert build_parser().parse_args(argv).json is True
    plain = [a for a in argv if a not in ("--json", "-o", "json")]
    assert build_parser().parse_args(plain).json is False


def test_token_revoke_prints_one_json_document(tmp_path: Any, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "tokens.json"
    main(["token", "create", "--name", "ci", "--team", "ml", "--role", "submitter", "--file", str(path)])
    capsys.readouterr()
    main(["token", "revoke", "--name", "ci", "--file", str(path), "--json"])
    assert json.loads(capsys.readouterr().out) == {"name": "ci", "revoked": True, "file": str(path)}


def test_a_json_flag_declared_the_plain_way_still_counts_before_the_subcommand() -> None:
    # A subcommand's own default (False) would overwrite a --json given to its group; the parser makes every
    # --json absent unless given, and the top level defaults it to False.
    parser = build_parser()
    group = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    leaf = group.add_parser("probe").add_subparsers().add_parser("run")
    leaf.add_argument("--json", action="store_true")
    _json_before_subcommand(group.choices["probe"])
    assert parser.parse_args(["probe", "--json", "run"]).json is True
    assert parser.parse_args(["probe", "run", "--json"]).json is True
    assert parser.parse_args(["probe", "run"]).json is False
