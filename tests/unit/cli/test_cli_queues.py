"""`gpusched queues` / `gpusched queue set`: the pure helpers (flavor parsing, merging flags into a spec, the
table's rows and cells) and the command line they are fed from."""

from __future__ import annotations

import argparse
from typing import Any

import msgspec
import pytest

from contracts import FlavorQuota, QueueSpec
from contracts.views import FlavorUsage, QueueView
from libs.cli.main import build_parser
from libs.cli.queues import QUEUE_COLUMNS, parse_flavor, queue_rows, queue_spec
from libs.cli.tables import cells

DEMO = {"name": "demo", "team": "demo", "parent": "acme", "nominal_gpus": 16, "borrowing_limit_gpus": 16}


def set_args(*argv: str) -> argparse.Namespace:
    return build_parser().parse_args(["queue", "set", *argv])


# --- parse_flavor ---------------------------------------------------------------------------------


@pytest.mark.parametrize(("text", "expected"), [
    ("A100=16", {"model": "A100", "nominal_gpus": 16}),
    ("H100=8:4", {"model": "H100", "nominal_gpus": 8, "borrowing_limit_gpus": 4}),
    ("H100=8:4:2", {"model": "H100", "nominal_gpus": 8, "borrowing_limit_gpus": 4, "lending_limit_gpus": 2}),
    ("H100=8::2", {"model": "H100", "nominal_gpus": 8, "lending_limit_gpus": 2}),
    ("H100=8:0:0", {"model": "H100", "nominal_gpus": 8, "borrowing_limit_gpus": 0, "lending_limit_gpus": 0}),
    ("*=4", {"model": "*", "nominal_gpus": 4}),
    ("V100M32=0", {"model": "V100M32", "nominal_gpus": 0}),
])
def test_parse_flavor_reads_model_nominal_and_optional_limits(text: str, expected: dict[str, Any]) -> None:
    parsed = parse_flavor(text)
    assert parsed == expected
    assert msgspec.convert(parsed, type=FlavorQuota) == FlavorQuota(**expected)  # what the API decodes


@pytest.mark.parametrize("text", ["bad", "A100", "A100=", "=4", "A100=four", "A100=4:x", "A100=4:2:1:0", "A100=4.5"])
def test_parse_flavor_refuses_anything_else_with_the_expected_form(text: str) -> None:
    with pytest.raises(ValueError, match=r"--flavor .*expected MODEL=NOMINAL\[:BORROW\[:LEND\]\]"):
        parse_flavor(text)


# --- queue_spec -----------------------------------------------------------------------------------


def test_queue_spec_changes_only_the_flags_given() -> None:
    spec = queue_spec(dict(DEMO), "demo", set_args("demo", "--borrowing-limit", "2"))
    assert spec == {**DEMO, "borrowing_limit_gpus": 2}


def test_queue_spec_does_not_modify_the_current_spec() -> None:
    current = dict(DEMO)
    queue_spec(current, "demo", set_args("demo", "--nominal", "4", "--weight", "3"))
    assert current == DEMO


def test_queue_spec_sets_every_field_its_flags_name() -> None:
    args = set_args("demo", "--team", "t", "--parent", "p", "--cohort", "c", "--nominal", "8", "--borrowing-limit",
                    "1", "--lending-limit", "2", "--weight", "1.5", "--placement-policy", "fgd",
                    "--budget-gpu-hours", "100", "--budget-period", "week", "--over-budget", "wait",
                    "--user-max-gpus", "4", "--reclaim-after", "30", "--las-threshold-gpu-hours", "0.5")
    spec = queue_spec(None, "demo", args)
    assert spec == {"name": "demo", "team": "t", "parent": "p", "cohort": "c", "nominal_gpus": 8,
                    "borrowing_limit_gpus": 1, "lending_limit_gpus": 2, "weight": 1.5, "placement_policy": "fgd",
                    "budget_gpu_hours": 100.0, "budget_period": "week", "over_budget": "wait", "user_max_gpus": 4,
                    "reclaim_after_s": 30.0, "las_threshold_gpu_hours": 0.5}
    msgspec.convert(spec, type=QueueSpec)  # what the API will decode


def test_queue_spec_none_unsets_a_limit() -> None:
    args = set_args("demo", "--nominal", "none", "--borrowing-limit", "none", "--user-max-gpus", "none")
    spec = queue_spec({**DEMO, "user_max_gpus": 8}, "demo", args)
    assert (spec["nominal_gpus"], spec["borrowing_limit_gpus"], spec["user_max_gpus"]) == (None, None, None)
    assert msgspec.convert(spec, type=QueueSpec) == QueueSpec(name="demo", team="demo", parent="acme")


def test_queue_spec_none_is_a_plain_name_for_the_string_fields() -> None:
    # "none" means "no limit" for the numeric limits only; a string field never becomes null (the API would
    # refuse the whole spec with 400 invalid_request).
    spec = queue_spec(dict(DEMO), "demo", set_args("demo", "--cohort", "none", "--team", "none"))
    assert (spec["cohort"], spec["team"]) == ("none", "none")
    msgspec.convert(spec, type=QueueSpec)


def test_a_new_queue_gets_its_name_as_team_unless_given() -> None:
    assert queue_spec(None, "newq", set_args("newq", "--parent", "acme")) == {
        "name": "newq", "team": "newq", "parent": "acme"}
    assert queue_spec(None, "newq", set_args("newq", "--team", "x"))["team"] == "x"


def test_flavors_replace_the_nominal_shorthand_and_its_limits() -> None:
    args = set_args("demo", "--flavor", "A100=4:2", "--flavor", "T4=2", "--nominal", "99")
    spec = queue_spec({**DEMO, "lending_limit_gpus": 4}, "demo", args)
    assert spec == {"name": "demo", "team": "demo", "parent": "acme",
                    "flavors": [{"model": "A100", "nominal_gpus": 4, "borrowing_limit_gpus": 2},
                                {"model": "T4", "nominal_gpus": 2}]}
    assert msgspec.convert(spec, type=QueueSpec).flavors[0].borrowing_limit_gpus == 2


def test_new_flavors_replace_the_old_ones_and_keep_the_rest() -> None:
    current = {"name": "v", "team": "v", "weight": 2.0, "flavors": [{"model": "A100", "nominal_gpus": 4}]}
    spec = queue_spec(current, "v", set_args("v", "--flavor", "H100=8"))
    assert spec == {"name": "v", "team": "v", "weight": 2.0, "flavors": [{"model": "H100", "nominal_gpus": 8}]}


def test_a_bad_flavor_fails_before_anything_is_sent() -> None:
    with pytest.raises(ValueError, match="--flavor 'bad'"):
        queue_spec(dict(DEMO), "demo", set_args("demo", "--flavor", "bad"))


# --- the command line -----------------------------------------------------------------------------


@pytest.mark.parametrize("argv", [["queue", "set", "demo", "--json"], ["queue", "--json", "set", "demo"]])
def test_queue_set_takes_json_after_the_name_or_before_set(argv: list[str]) -> None:
    assert build_parser().parse_args(argv).json is True
    assert build_parser().parse_args(["queue", "set", "demo"]).json is False


@pytest.mark.parametrize("argv", [["--nominal", "many"], ["--budget-period", "year"], ["--over-budget", "x"]])
def test_queue_set_refuses_bad_flag_values(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        set_args("demo", *argv)
    assert exit_.value.code == 2 and "error" in capsys.readouterr().err


# --- queue_rows -----------------------------------------------------------------------------------


def as_json(view: QueueView) -> dict[str, Any]:
    """A view as the API serves it."""
    return msgspec.json.decode(msgspec.json.encode(view))


def test_queue_rows_one_row_per_flavor_and_one_for_a_parent() -> None:
    parent = QueueView(name="acme", team="acme", nominal_gpus=28, reserved_gpus=0.0, pending=0, running=0)
    demo = QueueView(name="demo", team="demo", parent="acme", cohort="acme", nominal_gpus=16, pending=2, running=3,
                     fair_share=1.234, flavors=[FlavorUsage(flavor="*", nominal_gpus=16.0, borrowing_limit_gpus=16.0,
                                                            in_use_gpus=24.0, held_gpus=20.0, unplaced_gpus=4.0,
                                                            borrowed_gpus=8.0)])
    vision = QueueView(name="vision", team="vision", parent="acme", cohort="acme", nominal_gpus=6,
                       budget_gpu_hours=500.0, budget_left_gpu_hours=499.5,
                       flavors=[FlavorUsage(flavor="A100", nominal_gpus=4.0, lent_gpus=1.5),
                                FlavorUsage(flavor="T4", nominal_gpus=2.0, borrowing_limit_gpus=0.0)])
    rows = queue_rows([as_json(q) for q in (parent, demo, vision)])
    assert [(q["name"], f and f["flavor"]) for q, f in rows] == [
        ("acme", None), ("demo", "*"), ("vision", "A100"), ("vision", "T4")]
    assert [c.header for c in QUEUE_COLUMNS] == [
        "QUEUE", "PARENT", "COHORT", "MODEL", "NOMINAL", "BORROW-LIMIT", "LEND-LIMIT", "HELD", "UNPLACED", "USED",
        "BORROWED", "LENT", "PEND", "RUN", "WEIGHT", "SHARE", "BUDGET", "BUDGET-LEFT"]
    assert cells(QUEUE_COLUMNS, rows, wide=True) == [
        ["acme", "-", "-", "-", "28", "-", "-", "0", "0", "0", "-", "-", "0", "0", "1", "0.00", "-", "-"],
        ["demo", "acme", "acme", "*", "16", "16", "-", "20", "4", "24", "8", "0", "2", "3", "1", "1.23", "-", "-"],
        ["vision", "acme", "acme", "A100", "4", "-", "-", "0", "0", "0", "0", "1.5", "0", "0", "1", "0.00", "500",
         "499.5"],
        ["vision", "acme", "acme", "T4", "2", "0", "-", "0", "0", "0", "0", "0", "0", "0", "1", "0.00", "500", "499.5"],
    ]
    # By default: quota held and reserved by unplaced jobs, and jobs per queue and model (QUEUE MODEL NOMINAL HELD
    # UNPLACED BORROWED PEND RUN SHARE).
    assert cells(QUEUE_COLUMNS, rows) == [
        ["acme", "-", "28", "0", "0", "-", "0", "0", "0.00"],
        ["demo", "*", "16", "20", "4", "8", "2", "3", "1.23"],
        ["vision", "A100", "4", "0", "0", "0", "0", "0", "0.00"],
        ["vision", "T4", "2", "0", "0", "0", "0", "0", "0.00"],
    ]


def test_queue_rows_a_queue_without_quota_shows_no_limit_and_what_it_reserved() -> None:
    free = QueueView(name="free", team="free", nominal_gpus=None, reserved_gpus=2.5, held_gpus=2.0, unplaced_gpus=0.5,
                     pending=1, running=1)
    assert cells(QUEUE_COLUMNS, queue_rows([as_json(free)]), wide=True) == [
        ["free", "-", "-", "-", "-", "-", "-", "2", "0.5", "2.5", "-", "-", "1", "1", "1", "0.00", "-", "-"]]


def test_queue_rows_of_nothing_is_nothing() -> None:
    assert queue_rows([]) == []


def test_nominal_replaces_per_model_flavors_but_a_limit_alone_is_refused() -> None:
    current = {"name": "q", "team": "t", "flavors": [{"model": "A100", "nominal_gpus": 4}]}
    parser = build_parser()
    replaced = queue_spec(current, "q", parser.parse_args(["queue", "set", "q", "--nominal", "6"]))
    assert "flavors" not in replaced and replaced["nominal_gpus"] == 6
    with pytest.raises(ValueError, match="per-model flavors"):
        queue_spec(current, "q", parser.parse_args(["queue", "set", "q", "--borrowing-limit", "2"]))


def test_a_budget_can_be_cleared() -> None:
    parser = build_parser()
    spec = queue_spec({"name": "q", "team": "t", "budget_gpu_hours": 10.0}, "q",
                      parser.parse_args(["queue", "set", "q", "--budget-gpu-hours", "none"]))
    assert spec["budget_gpu_hours"] is None
