"""The decision core stays pure: it imports only the contracts, itself and the standard library, and
uses neither the wall clock nor randomness. (import-linter checks the same import rule in `task lint`.)"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

CORE = Path(__file__).parents[1] / "libs" / "core"
ALLOWED_OWN = ("contracts", "libs.core")
# Deterministic libraries the core may use: msgspec encodes snapshots; numpy scores placements, in integer
# arithmetic only (floats could differ in the last bit between CPUs).
ALLOWED_THIRD_PARTY = {"msgspec", "numpy"}
FORBIDDEN_CALLS = {("time", "time"), ("time", "monotonic"), ("time", "perf_counter"), ("uuid", "uuid4"),
                   ("datetime", "now"), ("random", "random")}
FORBIDDEN_MODULES = {"random", "secrets", "os", "socket", "asyncio", "threading", "subprocess"}


def core_files() -> list[Path]:
    """Every module of the core, its subpackages' too."""
    return sorted(CORE.rglob("*.py"))


def _name(path: Path) -> str:
    return str(path.relative_to(CORE))


def imported_modules(tree: ast.AST, package: str = "libs.core") -> list[str]:
    """Absolute names of what the module imports; a relative import resolved against its `package`."""
    names = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.append(node.module)
        elif isinstance(node, ast.ImportFrom) and node.level > 0:
            parts = package.split(".")
            base = parts[:len(parts) - node.level + 1]
            names.append(".".join([*base, *([node.module] if node.module else [])]))
    return names


@pytest.mark.parametrize("path", core_files(), ids=_name)
def test_core_module_imports_only_contracts_core_and_stdlib(path: Path) -> None:
    package = ".".join(("libs", "core", *path.relative_to(CORE).parent.parts))
    for module in imported_modules(ast.parse(path.read_text()), package):
        top = module.split(".")[0]
        own = module == "contracts" or module.startswith(ALLOWED_OWN)
        assert own or top in sys.stdlib_module_names or top in ALLOWED_THIRD_PARTY, f"{path.name} imports {module}"
        assert top not in FORBIDDEN_MODULES, f"{path.name} imports {module}: I/O or randomness in the core"


@pytest.mark.parametrize("path", core_files(), ids=_name)
def test_core_module_reads_no_clock_and_no_randomness(path: Path) -> None:
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            assert (node.value.id, node.attr) not in FORBIDDEN_CALLS, f"{path.name}: {node.value.id}.{node.attr}"


def test_the_boundary_check_sees_subpackages() -> None:
    assert core_files() == sorted(p for p in CORE.glob("**/*.py"))
    assert all(p.is_relative_to(CORE) for p in core_files())


def test_the_boundary_check_itself_catches_a_forbidden_import(tmp_path: Path) -> None:
    tree = ast.parse("import redis\nfrom libs.bus.jetstream import Bus\n")
    assert imported_modules(tree) == ["redis", "libs.bus.jetstream"]
    relative = ast.parse("from . import fold\nfrom ...bus import jetstream\n")
    assert imported_modules(relative, "libs.core.quota") == ["libs.core.quota", "libs.bus"]
