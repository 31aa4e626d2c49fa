"""The provisioned Grafana dashboards and the Prometheus rules, checked without running either: the committed
JSON is what scripts/build_dashboards.py writes, every panel queries the provisioned datasource and only
variables the dashboard defines, panels tile the grid, and every alert says how bad it is and why.
(tests/e2e/test_observability.py runs the queries and rules against a real Prometheus.)"""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[3]
DASHBOARDS = ROOT / "infra" / "grafana" / "dashboards"
PROMETHEUS = ROOT / "infra" / "prometheus"
BUILTIN_VARIABLES = {"__rate_interval", "__interval", "__range", "__range_s", "__interval_ms"}


def load_builder() -> ModuleType:
    spec = importlib.util.spec_from_file_location("build_dashboards", ROOT / "scripts" / "build_dashboards.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def dashboards() -> dict[str, dict[str, Any]]:
    return {p.name: json.loads(p.read_text()) for p in sorted(DASHBOARDS.glob("*.json"))}


def test_the_committed_dashboards_are_the_builders_output() -> None:
    rendered = load_builder().render()
    committed = {p.name: p.read_text() for p in DASHBOARDS.glob("*.json")}
    assert sorted(committed) == sorted(rendered), "a dashboard JSON is not built by scripts/build_dashboards.py"
    stale = [name for name, text in rendered.items() if committed[name] != text]
    assert not stale, f"run .venv/bin/python scripts/build_dashboards.py: {stale} differ from its output"


def test_five_dashboards_with_their_own_uids() -> None:
    boards = dashboards()
    assert len(boards) == 5
    uids = [d["uid"] for d in boards.values()]
    assert len(set(uids)) == len(uids)
    assert "gpusched-overview" in uids  # docker-compose.yml's home dashboard
    for d in boards.values():
        assert d["schemaVersion"] >= 39 and d["title"] and d["panels"]


def test_panels_query_the_provisioned_datasource() -> None:
    provisioned = yaml.safe_load((ROOT / "infra/grafana/provisioning/datasources/prometheus.yml").read_text())
    uid = provisioned["datasources"][0]["uid"]
    for name, d in dashboards().items():
        for var in d["templating"]["list"]:
            assert var["datasource"]["uid"] == uid, (name, var["name"])
        for panel in d["panels"]:
            assert panel["datasource"] == {"type": "prometheus", "uid": uid}, (name, panel["title"])
            assert panel["targets"], (name, panel["title"])
            refs = [t["refId"] for t in panel["targets"]]
            assert len(set(refs)) == len(refs), (name, panel["title"])
            for t in panel["targets"]:
                assert t["datasource"]["uid"] == uid and t["expr"].strip(), (name, panel["title"])


@pytest.mark.parametrize("name", sorted(p.name for p in DASHBOARDS.glob("*.json")))
def test_queries_use_only_defined_variables(name: str) -> None:
    d = dashboards()[name]
    defined = {v["name"] for v in d["templating"]["list"]} | BUILTIN_VARIABLES
    for panel in d["panels"]:
        for t in panel["targets"]:
            used = set(re.findall(r"\$\{?(\w+)", t["expr"]))
            assert used <= defined, (panel["title"], used - defined)
            assert t["expr"].count("(") == t["expr"].count(")"), (panel["title"], t["expr"])


@pytest.mark.parametrize("name", sorted(p.name for p in DASHBOARDS.glob("*.json")))
def test_panels_tile_the_grid(name: str) -> None:
    panels = dashboards()[name]["panels"]
    ids = [p["id"] for p in panels]
    assert len(set(ids)) == len(ids)
    taken: set[tuple[int, int]] = set()
    for p in panels:
        g = p["gridPos"]
        assert g["x"] >= 0 and g["x"] + g["w"] <= 24 and g["h"] > 0, p["title"]
        cells = {(x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])}
        assert not cells & taken, f"{p['title']} overlaps another panel"
        taken |= cells


def rules(path: Path) -> list[dict[str, Any]]:
    return [r for g in yaml.safe_load(path.read_text())["groups"] for r in g["rules"]]


def test_every_alert_has_a_severity_a_summary_and_a_description() -> None:
    alerts = rules(PROMETHEUS / "alerts.yml")
    names = [r["alert"] for r in alerts]
    assert len(set(names)) == len(names)
    for r in alerts:
        assert r["labels"]["severity"] in {"critical", "warning", "info"}, r["alert"]
        assert r["annotations"]["summary"].strip() and r["annotations"]["description"].strip(), r["alert"]
    # What the platform must page or warn about (docs/observability.md).
    assert {"GpuschedJobsPendingTooLong", "GpuschedNodeLost", "GpuschedGpuQuarantined",
            "GpuschedQueueBudgetNearlySpent", "GpuschedPreemptionStorm", "GpuschedServiceLagging",
            "GpuschedServiceDown"} <= set(names)
    assert "for" not in next(r for r in alerts if r["alert"] == "GpuschedNodeLost")  # fires at once


def test_both_prometheus_configs_load_the_rules_and_compose_mounts_them() -> None:
    for config in ("prometheus.yml", "prometheus-local.yml"):
        files = yaml.safe_load((PROMETHEUS / config).read_text())["rule_files"]
        assert files == ["alerts.yml", "rules.yml"], config
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    mounts = compose["services"]["prometheus"]["volumes"]
    for f in ("alerts.yml", "rules.yml"):
        assert f"./infra/prometheus/{f}:/etc/prometheus/{f}:ro" in mounts


def test_recorded_series_the_dashboards_use_are_recorded() -> None:
    recorded = {r["record"] for r in rules(PROMETHEUS / "rules.yml")}
    used = {m for d in dashboards().values() for p in d["panels"] for t in p["targets"]
            for m in re.findall(r"\b\w*:\w+:\w+\b", t["expr"])}
    assert used <= recorded, used - recorded
