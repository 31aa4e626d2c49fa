"""`gpusched kube` (the Kubernetes bridge) and `gpusched dev-cluster` (a real API server on this machine with
fake GPU nodes, to try the bridge without a cluster)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib
import logging
import signal
import subprocess
import sys
from pathlib import Path

from libs.kube.devcluster import DevCluster, start_dev_cluster

BRIDGE_APP = "services.kube_bridge.app"


def cmd_kube(args: argparse.Namespace) -> None:
    importlib.import_module(BRIDGE_APP).cmd_kube(args)


def cmd_dev_cluster(args: argparse.Namespace) -> None:
    """etcd, kube-apiserver and kube-controller-manager built from their Go modules (the first time: minutes),
    fake GPU nodes and their kubelet; kubeconfigs for an administrator (kubectl) and for the bridge."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    folder = Path(args.folder).resolve()
    print(f"starting etcd, kube-apiserver and kube-controller-manager under {folder} "
          "(building them first if this machine has not: several minutes)", file=sys.stderr)
    cluster: DevCluster = start_dev_cluster(folder)
    admin, bridge = cluster.kubeconfig(), cluster.kubeconfig(cluster.bridge_token, "bridge")
    kubelet = subprocess.Popen([sys.executable, "-m", "libs.kube.fake_kubelet", "--kubeconfig", str(admin),
                                "--nodes", str(args.nodes), "--gpus", str(args.gpus), "--racks", str(args.racks),
                                "--product", args.product])
    print(f"""
Kubernetes {cluster.server} is up with {args.nodes} fake node(s) of {args.gpus} GPU(s).
  kubectl:  {cluster.bin_dir / 'kubectl'} --kubeconfig {admin} get nodes
  platform: gpusched up --kubeconfig {bridge}
Ctrl-C stops it.""", flush=True)
    stop = asyncio.Event()

    async def wait() -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        while not stop.is_set() and kubelet.poll() is None:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(stop.wait(), 1.0)

    try:
        asyncio.run(wait())
    finally:
        kubelet.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            kubelet.wait(timeout=10)
        cluster.stop()


def add_commands(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("kube", help="run the Kubernetes bridge: schedule the cluster's GPU pods and Jobs")
    importlib.import_module(BRIDGE_APP).add_arguments(p)
    p.set_defaults(func=cmd_kube)
    p = sub.add_parser("dev-cluster", help="a real kube-apiserver on this machine with fake GPU nodes")
    p.add_argument("--folder", default=".data/kube", help="its data, certificates and kubeconfigs")
    p.add_argument("--nodes", type=int, default=2)
    p.add_argument("--gpus", type=int, default=8)
    p.add_argument("--racks", type=int, default=2)
    p.add_argument("--product", default="NVIDIA-A100-SXM4-80GB", help="GPU Feature Discovery's product label")
    p.set_defaults(func=cmd_dev_cluster)
