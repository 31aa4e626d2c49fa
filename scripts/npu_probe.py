"""Print, as JSON, what AscendBackend reports on this machine: discover() with every NPU's HCCS group, one
sample(), one poll_health(), and npu-smi's own text it read them from. Run it on an Ascend server to record
what the real backend saw there:

    .venv/bin/python scripts/npu_probe.py [--node NAME] [--simulate atlas800-910] > probe.json

`--simulate LAYOUT` answers from a simulated server instead (libs/nodes/ascend_sim.py), to see what a real
one should print. Exits with status 2 and a one-line reason on stderr when npu-smi is unavailable.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Any

from libs.nodes.ascend import AscendBackend, AscendUnavailable, RunNpuSmi, run_npu_smi
from libs.nodes.ascend_sim import SERVERS, SimulatedNpuSmi
from libs.nodes.probe_json import plain

UNAVAILABLE_EXIT = 2


def probe(backend: AscendBackend, run: RunNpuSmi) -> dict[str, Any]:
    return {
        "npu_smi": {"info": run(["info"]), "topo": run(["info", "-t", "topo"])},
        "nodes": plain(backend.discover()),
        "sample": plain(backend.sample()),
        "poll_health": plain(backend.poll_health(0)),
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--node", help="node name to report (default: the host name)")
    parser.add_argument("--simulate", choices=sorted(SERVERS), help="answer from a simulated server of this layout")
    args = parser.parse_args(argv)
    run: RunNpuSmi = SimulatedNpuSmi(SERVERS[args.simulate]) if args.simulate else run_npu_smi
    try:
        report = probe(AscendBackend(args.node, run=run), run)
    except AscendUnavailable as err:
        print(f"npu_probe: npu-smi unavailable: {err}", file=sys.stderr)
        return UNAVAILABLE_EXIT
    print(json.dumps(report, indent=2, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
