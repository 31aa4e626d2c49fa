"""A real Kubernetes control plane on this machine: etcd, kube-apiserver and, where asked, the
kube-controller-manager (Job, disruption, garbage and pod collectors) and kube-scheduler, built by
`scripts/build_kube.sh` from their Go modules. Each on free ports, with a temporary data folder and
certificates and tokens made on the spot, so that parallel runs share nothing. The tests, the benchmark and
`gpusched kube dev-cluster` start it; kubelets are played by `libs.kube.fake_kubelet`.

Authentication is by static bearer tokens (`--token-auth-file`): an administrator (group `system:masters`) and
the bridge's own user, whose rights are exactly those `infra/kubernetes/rbac.yaml` grants (RBAC is on).
"""

from __future__ import annotations

import json
import os
import secrets
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from libs.runtime.embedded import StartError, free_port

REPO = Path(__file__).resolve().parents[2]
BRIDGE_USER = "system:serviceaccount:gpusched-system:gpusched-bridge"
# The controllers the tests and the demo need; the node lifecycle controller stays off because the fake
# kubelets' readiness is set by hand (a test marks a node NotReady itself).
CONTROLLERS = ("job-controller,disruption-controller,garbage-collector-controller,pod-garbage-collector-controller,"
               "resourceclaim-controller")


def kube_bin_dir() -> Path:
    """The folder holding the pinned binaries, built on the first call on a machine (minutes, with progress on
    stderr; later calls only look). `GPUSCHED_KUBE_BIN` names a folder of one's own instead."""
    own = os.environ.get("GPUSCHED_KUBE_BIN")
    if own:
        return Path(own)
    out = subprocess.run([str(REPO / "scripts" / "build_kube.sh")], stdout=subprocess.PIPE, text=True, check=True)
    return Path(out.stdout.strip().splitlines()[-1])


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def make_certificates(folder: Path) -> None:
    """A CA, a serving certificate for 127.0.0.1 signed by it, and the service-account signing key."""
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=gpusched-dev-ca",
             "-keyout", "ca.key", "-out", "ca.crt", cwd=folder)
    (folder / "san.cnf").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost,DNS:kubernetes\n")
    _openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=kube-apiserver", "-keyout", "apiserver.key",
             "-out", "apiserver.csr", cwd=folder)
    _openssl("x509", "-req", "-in", "apiserver.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
             "-days", "2", "-extfile", "san.cnf", "-out", "apiserver.crt", cwd=folder)
    _openssl("genrsa", "-out", "sa.key", "2048", cwd=folder)
    _openssl("rsa", "-in", "sa.key", "-pubout", "-out", "sa.pub", cwd=folder)


@dataclass
class Process:
    name: str
    proc: subprocess.Popen[bytes]
    log: Path

    def stop(self, timeout: float = 10.0) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@dataclass
class DevCluster:
    """A running control plane: where it listens, who may call it, and its processes."""

    folder: Path
    bin_dir: Path
    server: str = ""
    admin_token: str = ""
    bridge_token: str = ""
    etcd_url: str = ""
    processes: dict[str, Process] = field(default_factory=dict)

    @property
    def ca_file(self) -> Path:
        return self.folder / "ca.crt"

    def kubeconfig(self, token: str | None = None, name: str = "admin") -> Path:
        """A kubeconfig for kubectl (and the bridge's `--kubeconfig`) with the given token."""
        path = self.folder / f"kubeconfig-{name}.yaml"
        config = {
            "apiVersion": "v1", "kind": "Config", "current-context": "dev",
            "clusters": [{"name": "dev", "cluster": {"server": self.server,
                                                     "certificate-authority": str(self.ca_file)}}],
            "users": [{"name": name, "user": {"token": token or self.admin_token}}],
            "contexts": [{"name": "dev", "context": {"cluster": "dev", "user": name}}],
        }
        path.write_text(json.dumps(config, indent=2))
        return path

    # --- processes -------------------------------------------------------------------------------

    def _spawn(self, name: str, args: list[str]) -> Process:
        log = self.folder / f"{name}.log"
        out = open(log, "ab")  # noqa: SIM115 - the process owns it until it exits
        proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)
        p = Process(name, proc, log)
        self.processes[name] = p
        return p

    def start_etcd(self) -> None:
        client, peer = free_port(), free_port()
        self.etcd_url = f"http://127.0.0.1:{client}"
        p = self._spawn("etcd", [
            str(self.bin_dir / "etcd"), "--name", "dev", "--data-dir", str(self.folder / "etcd"),
            "--listen-client-urls", self.etcd_url, "--advertise-client-urls", self.etcd_url,
            "--listen-peer-urls", f"http://127.0.0.1:{peer}", "--initial-advertise-peer-urls",
            f"http://127.0.0.1:{peer}", "--initial-cluster", f"dev=http://127.0.0.1:{peer}",
            "--unsafe-no-fsync", "--log-level", "warn", "--quota-backend-bytes", str(4 << 30)])
        self._wait(p, lambda: _http_ok(f"{self.etcd_url}/health"), 30)

    def start_apiserver(self, port: int | None = None) -> None:
        port = port or (int(self.server.rsplit(":", 1)[1]) if self.server else free_port())
        self.server = f"https://127.0.0.1:{port}"
        f = self.folder
        p = self._spawn("kube-apiserver", [
            str(self.bin_dir / "kube-apiserver"), "--etcd-servers", self.etcd_url,
            "--bind-address", "127.0.0.1", "--advertise-address", "127.0.0.1", "--secure-port", str(port),
            "--tls-cert-file", str(f / "apiserver.crt"), "--tls-private-key-file", str(f / "apiserver.key"),
            "--client-ca-file", str(f / "ca.crt"), "--token-auth-file", str(f / "tokens.csv"),
            "--authorization-mode", "RBAC", "--service-account-issuer", "https://kubernetes.default.svc",
            "--service-account-key-file", str(f / "sa.pub"), "--service-account-signing-key-file", str(f / "sa.key"),
            "--service-cluster-ip-range", "10.96.0.0/16", "--disable-admission-plugins", "ServiceAccount",
            "--endpoint-reconciler-type", "none", "--max-requests-inflight", "3000",
            "--max-mutating-requests-inflight", "1500", "--enable-priority-and-fairness=false",
            "--watch-cache=true", "--v", "1"])
        self._wait(p, lambda: _http_ok(f"{self.server}/readyz", self.admin_token, self.ca_file), 90)

    def _controller_args(self, binary: str) -> list[str]:
        return [str(self.bin_dir / binary), "--kubeconfig", str(self.kubeconfig()), "--leader-elect=false"]

    def start_controller_manager(self) -> None:
        p = self._spawn("kube-controller-manager", [
            *self._controller_args("kube-controller-manager"), "--controllers", CONTROLLERS,
            "--secure-port", "0", "--concurrent-job-syncs", "20", "--kube-api-qps", "500", "--kube-api-burst", "1000"])
        self._wait(p, lambda: True, 0)

    def start_scheduler(self) -> Process:
        return self._spawn("kube-scheduler", [*self._controller_args("kube-scheduler"), "--secure-port", "0"])

    def _wait(self, p: Process, ready: object, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        check = ready if callable(ready) else (lambda: True)
        while True:
            if p.proc.poll() is not None:
                raise StartError(p.name, f"exited with {p.proc.returncode}", p.log)
            if check():
                return
            if time.monotonic() > deadline:
                raise StartError(p.name, f"was not ready in {timeout:g}s", p.log)
            time.sleep(0.2)

    def restart_apiserver(self) -> None:
        """Stop the API server and start it again on the same port (its state is etcd's)."""
        self.processes["kube-apiserver"].stop()
        self.start_apiserver()

    def stop(self) -> None:
        for name in ("kube-scheduler", "kube-controller-manager", "kube-apiserver", "etcd"):
            p = self.processes.pop(name, None)
            if p is not None:
                p.stop()


def _http_ok(url: str, token: str = "", ca: Path | None = None) -> bool:
    context = ssl.create_default_context(cafile=str(ca)) if ca is not None else None
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(request, timeout=2, context=context) as answer:
            return bool(answer.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def start_dev_cluster(folder: Path, controllers: bool = True, bin_dir: Path | None = None) -> DevCluster:
    """etcd and kube-apiserver (and the controller manager unless told otherwise), ready to serve, with the
    bridge's RBAC applied."""
    folder.mkdir(parents=True, exist_ok=True)
    cluster = DevCluster(folder=folder, bin_dir=bin_dir or kube_bin_dir(),
                         admin_token=secrets.token_hex(16), bridge_token=secrets.token_hex(16))
    make_certificates(folder)
    (folder / "tokens.csv").write_text(
        f'{cluster.admin_token},admin,admin,"system:masters"\n'
        f'{cluster.bridge_token},{BRIDGE_USER},gpusched-bridge,"system:serviceaccounts"\n')
    try:
        cluster.start_etcd()
        cluster.start_apiserver()
        apply_manifest(cluster, REPO / "infra" / "kubernetes" / "rbac.yaml")
        if controllers:
            cluster.start_controller_manager()
    except BaseException:
        cluster.stop()
        raise
    return cluster


def kubectl(cluster: DevCluster, *args: str, token: str | None = None, input_text: str | None = None,
            check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run the built kubectl against the cluster (as the administrator unless a token is given)."""
    config = cluster.kubeconfig(token, "admin" if token is None else "other")
    return subprocess.run([str(cluster.bin_dir / "kubectl"), "--kubeconfig", str(config), *args], input=input_text,
                          capture_output=True, text=True, check=check, timeout=60)


def apply_manifest(cluster: DevCluster, path: Path) -> None:
    for attempt in range(20):  # the RBAC API may answer a moment after /readyz on a first start
        out = kubectl(cluster, "apply", "-f", str(path), check=False)
        if out.returncode == 0:
            return
        time.sleep(0.5)
        if attempt == 19:
            raise StartError("kubectl apply", f"failed for {path}: {out.stderr.strip()}")
