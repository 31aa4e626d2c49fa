"""Print, as JSON, what NvmlBackend reports on this machine: discover() with every GPU's details, one
sample() and one poll_health(). Run it on a GPU machine to record what the real backend saw there:

    .venv/bin/python scripts/nvml_probe.py [--node NAME] [--timeout-ms 1000] > probe.json

Exits with status 2 and a one-line reason on stderr when NVML is unavailable (no NVIDIA driver, or
nvidia-ml-py not installed).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
import time
from collections.abc import Sequence
from typing import Any

import msgspec

from contracts import NodeSpec
from libs.nodes.nvml import NvmlBackend, NvmlUnavailable

UNAVAILABLE_EXIT = 2


def _plain(value: Any) -> Any:
    """JSON-ready: Structs and dataclasses as dicts with every field (defaults included), NaN as null."""
    if isinstance(value, msgspec.Struct):
        return {k: _plain(v) for k, v in msgspec.structs.asdict(value).items()}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, float) and math.isnan(value):
        return None
    return value


def probe(backend: NvmlBackend, timeout_ms: int) -> dict[str, Any]:
    nodes: list[NodeSpec] = backend.discover()
    started = time.monotonic()
    observations = backend.poll_health(timeout_ms)
    return {
        "driver_version": backend.driver_version(),
        "nodes": _plain(nodes),
        "details": _plain(backend.details()),
        "sample": _plain(backend.sample()),
        "poll_health": {"timeout_ms": timeout_ms, "took_ms": round((time.monotonic() - started) * 1000, 1),
                        "observations": _plain(observations)},
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--node", help="node name to report (default: the host name)")
    parser.add_argument("--timeout-ms", type=int, default=1000, help="how long poll_health waits for XID events")
    args = parser.parse_args(argv)
    backend = NvmlBackend(args.node)
    try:
        report = probe(backend, args.timeout_ms)
    except NvmlUnavailable as err:
        print(f"nvml_probe: NVML unavailable: {err}", file=sys.stderr)
        return UNAVAILABLE_EXIT
    finally:
        backend.close()
    print(json.dumps(report, indent=2, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
