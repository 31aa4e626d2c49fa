"""Print, as JSON, what NvmlBackend reports on this machine: discover() with every GPU's details, one
sample() and one poll_health(). Run it on a GPU machine to record what the real backend saw there:

    .venv/bin/python scripts/nvml_probe.py [--node NAME] [--timeout-ms 1000] > probe.json

Exits with status 2 and a one-line reason on stderr when NVML is unavailable (no NVIDIA driver, or
nvidia-ml-py not installed).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from typing import Any

from contracts import NodeSpec
from libs.nodes.nvml import NvmlBackend, NvmlUnavailable
from libs.nodes.probe_json import plain

UNAVAILABLE_EXIT = 2


def probe(backend: NvmlBackend, timeout_ms: int) -> dict[str, Any]:
    nodes: list[NodeSpec] = backend.discover()
    started = time.monotonic()
    observations = backend.poll_health(timeout_ms)
    return {
        "driver_version": backend.driver_version(),
        "nodes": plain(nodes),
        "details": plain(backend.details()),
        "sample": plain(backend.sample()),
        "poll_health": {"timeout_ms": timeout_ms, "took_ms": round((time.monotonic() - started) * 1000, 1),
                        "observations": plain(observations)},
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
