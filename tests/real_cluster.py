"""A real Kubernetes control plane on loopback: stock etcd, kube-apiserver, kube-controller-manager,
kube-scheduler and KWOK, built from Go modules by ``scripts/build-cluster`` (recipe in tests/cluster/).

What runs, and why each flag is there:

* **etcd** on a free port, no fsync (a test cluster's data is thrown away).
* **kube-apiserver** on ``127.0.0.1``: RBAC, service-account tokens (issuer, signing key), and the
  front proxy (requestheader CA, allowed name ``front-proxy-client``, the X-Remote-* headers) so
  aggregated APIs work the way they do in a real cluster; ``--endpoint-reconciler-type=none``
  because the ``kubernetes`` Service's endpoints would hold a loopback address, which validation
  refuses. Priority and fairness stays on (it is on in every real cluster).
* **kube-controller-manager** with every default controller (Deployment, ReplicaSet, Job, HPA,
  namespace, service accounts and their tokens, garbage collector, node lifecycle) and each
  controller acting as its own ServiceAccount (``--use-service-account-credentials``), so the HPA
  reads external metrics as ``kube-system:horizontal-pod-autoscaler``, as in a kubeadm cluster.
  The HPA syncs every 2 s instead of 15 s so tests wait less.
* **kube-scheduler** processes are started by the tests (:meth:`Cluster.start_scheduler`): each
  test derives its ``KubeSchedulerConfiguration`` from the one the chart renders.
* **KWOK** manages every node: Nodes become Ready and keep their leases, pods become Ready (after a
  delay a pod may ask for, see :data:`READY_DELAY_ANNOTATION`), Jobs' pods complete.

PKI (made with ``openssl``, like tests/pki.py): a cluster CA signing the serving certificate and the
admin client (``O=system:masters``), a separate front-proxy CA signing ``front-proxy-client``, and an
RSA key pair for service-account tokens.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import signal
import ssl
import subprocess
import sys
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO, TypeVar

import yaml

from tests.kube_double.waiting import wait_until
from tests.net import free_port
from tests.pki import Pair, make_ca, make_cert

T = TypeVar("T")

ROOT = Path(__file__).resolve().parent.parent
BUILD = ROOT / "scripts" / "build-cluster"

#: A pod annotation KWOK's pod-ready stage reads: a JSON object from node name to a Go duration
#: (``{"gpu-a": "2.5s"}``), how long a pod bound to that node takes to become Ready. Tests fill it
#: from the estimator's startup time on each node; a node it does not name means no delay.
READY_DELAY_ANNOTATION = "extender.test/ready-after"
#: The label of the pods that only hold a ServiceAccount token bound to their node
#: (:meth:`Cluster.pod_token_kubeconfig`): they stay for the session and use no resources.
TOKEN_HOLDER_LABEL = "extender.test/token-holder"
#: Seconds a component has to become healthy (a setup bound, not a performance assertion).
START_TIMEOUT_S = 120.0


def terminal() -> TextIO:
    """The real standard error, past pytest's capture."""
    return sys.__stderr__ or sys.stderr


def binaries() -> Path:
    """The folder of built binaries; builds them first (with progress on the terminal) when missing."""
    found = subprocess.run([str(BUILD), "--print"], capture_output=True, text=True, check=False)
    if found.returncode == 0:
        return Path(found.stdout.strip())
    # Straight to the terminal: pytest captures the fixture's output, and a build of minutes with no
    # sign of life looks like a hang.
    done = subprocess.run([str(BUILD)], stdout=subprocess.PIPE, stderr=terminal(), text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"scripts/build-cluster failed (exit {done.returncode}); run it by hand to see why")
    return Path(done.stdout.strip().splitlines()[-1])


#: KWOK's delay for a pod (a JQ query, gojq): the duration :data:`READY_DELAY_ANNOTATION` gives for
#: the pod's node; nothing (so no delay) when the annotation or the node is absent.
READY_DELAY_QUERY = (f'(.spec.nodeName) as $node | (.metadata.annotations["{READY_DELAY_ANNOTATION}"] // "{{}}")'
                     ' | fromjson | .[$node] // empty')


def stages(bin_dir: Path) -> str:
    """KWOK's fast stages, with pod-ready delayed by :data:`READY_DELAY_QUERY`."""
    documents = [d for d in yaml.safe_load_all((bin_dir / "kwok-stages.yaml").read_text()) if d]
    for document in documents:
        if document["metadata"]["name"] == "pod-ready":
            document["spec"]["delay"] = {"durationMilliseconds": 0,
                                         "durationFrom": {"jq": {"expression": READY_DELAY_QUERY}}}
    return yaml.safe_dump_all(documents)


@dataclass
class Process:
    """One component: its command line and log; stopped with SIGTERM, then SIGKILL."""

    name: str
    args: list[str]
    log: Path
    popen: subprocess.Popen[bytes] | None = None

    def start(self, env: dict[str, str] | None = None) -> None:
        with self.log.open("ab") as out:
            self.popen = subprocess.Popen(self.args, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                          env=env, start_new_session=True)

    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def stop(self) -> None:
        if self.popen is None or self.popen.poll() is not None:
            return
        self.popen.send_signal(signal.SIGTERM)
        try:
            self.popen.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            self.popen.wait()

    def tail(self, chars: int = 3000) -> str:
        return self.log.read_text(errors="replace")[-chars:] if self.log.exists() else ""


@dataclass(frozen=True)
class ClusterPki:
    ca: Pair
    serving: Pair
    admin: Pair
    front_proxy_ca: Pair
    front_proxy: Pair
    sa_key: Path
    sa_pub: Path

    @classmethod
    def make(cls, directory: Path) -> ClusterPki:
        directory.mkdir(parents=True, exist_ok=True)
        ca = make_ca(directory, "ca", "extender-test-cluster-ca")
        front_proxy_ca = make_ca(directory, "front-proxy-ca", "extender-test-front-proxy-ca")
        sa_key, sa_pub = directory / "sa.key", directory / "sa.pub"
        subprocess.run(["openssl", "genrsa", "-out", str(sa_key), "2048"], check=True, capture_output=True)
        subprocess.run(["openssl", "rsa", "-in", str(sa_key), "-pubout", "-out", str(sa_pub)], check=True,
                       capture_output=True)
        return cls(ca=ca, serving=make_cert(directory, "apiserver", ca, "/CN=kube-apiserver", server=True),
                   admin=make_cert(directory, "admin", ca, "/CN=admin/O=system:masters"),
                   front_proxy_ca=front_proxy_ca,
                   front_proxy=make_cert(directory, "front-proxy-client", front_proxy_ca, "/CN=front-proxy-client"),
                   sa_key=sa_key, sa_pub=sa_pub)


def kubeconfig(server: str, ca: Path, *, cert: Pair | None = None, token: str | None = None) -> dict[str, Any]:
    """A kubeconfig for one user of one cluster: a client certificate or a bearer token."""
    user: dict[str, Any] = {"token": token} if token is not None else {
        "client-certificate": str(cert.cert), "client-key": str(cert.key)} if cert is not None else {}
    return {"apiVersion": "v1", "kind": "Config", "current-context": "test",
            "clusters": [{"name": "test", "cluster": {"server": server, "certificate-authority": str(ca)}}],
            "users": [{"name": "test", "user": user}],
            "contexts": [{"name": "test", "context": {"cluster": "test", "user": "test"}}]}


@dataclass
class Cluster:
    """A running control plane; :meth:`started` brings one up and tears it down."""

    bin: Path
    directory: Path
    pki: ClusterPki
    apiserver_port: int
    processes: dict[str, Process] = field(default_factory=dict)
    #: The secure port of each kube-scheduler started by :meth:`start_scheduler`, by name.
    scheduler_ports: dict[str, int] = field(default_factory=dict)

    @property
    def server(self) -> str:
        return f"https://127.0.0.1:{self.apiserver_port}"

    @property
    def admin_kubeconfig(self) -> Path:
        return self.directory / "admin.kubeconfig"

    @property
    def logs(self) -> Path:
        return self.directory / "logs"

    # ----- lifecycle

    @classmethod
    @contextlib.contextmanager
    def started(cls, directory: Path) -> Iterator[Cluster]:
        cluster = cls(bin=binaries(), directory=directory, pki=ClusterPki.make(directory / "pki"),
                      apiserver_port=free_port())
        cluster.logs.mkdir(parents=True, exist_ok=True)
        cluster.admin_kubeconfig.write_text(yaml.safe_dump(
            kubeconfig(cluster.server, cluster.pki.ca.cert, cert=cluster.pki.admin)))
        try:
            cluster._start_etcd()
            cluster._start_apiserver()
            cluster._start_controller_manager()
            cluster._start_kwok()
            cluster.wait_for("the default ServiceAccount", lambda: cluster.kubectl_ok(
                "get", "serviceaccount", "default", "-n", "default"))
            yield cluster
        except BaseException:
            terminal().write(cluster.report())
            raise
        finally:
            cluster.stop()

    def stop(self) -> None:
        """Stop exactly the processes this cluster started, the last started first."""
        for process in reversed(list(self.processes.values())):
            process.stop()

    def start(self, name: str, args: Sequence[str | Path], env: dict[str, str] | None = None) -> Process:
        """Start (or restart) a component; its output goes to ``logs/<name>.log``."""
        if name in self.processes:
            self.processes[name].stop()
        process = Process(name, [str(a) for a in args], self.logs / f"{name}.log")
        process.start(env)
        self.processes[name] = process
        return process

    def report(self) -> str:
        """The end of every component's log, for a failure message."""
        return "".join(f"\n--- {p.name} ({'running' if p.alive() else 'stopped'}; {p.log})\n{p.tail()}"
                       for p in self.processes.values())

    def wait_for(self, what: str, ok: Callable[[], T], timeout_s: float = START_TIMEOUT_S) -> T:
        """Poll ``ok`` like :func:`wait_until`, failing at once when a vital component has exited."""
        def check() -> T:
            for process in self.processes.values():
                if process.popen is not None and not process.alive() and process.name in self._vital:
                    raise RuntimeError(f"{process.name} exited with {process.popen.returncode} while waiting "
                                       f"for {what}:\n{process.tail()}")
            return ok()
        return wait_until(check, timeout_s=timeout_s, what=what, report=self.report, interval_s=0.1)

    _vital = ("etcd", "kube-apiserver", "kube-controller-manager", "kwok")

    def fetch(self, port: int, path: str) -> str:
        """GET ``https://127.0.0.1:PORT/PATH`` of a control-plane component, as admin."""
        context = ssl.create_default_context(cafile=str(self.pki.ca.cert))
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE  # controller-manager and scheduler serve self-signed certificates
        context.load_cert_chain(str(self.pki.admin.cert), str(self.pki.admin.key))
        with urllib.request.urlopen(f"https://127.0.0.1:{port}{path}", context=context, timeout=5) as reply:
            return str(reply.read().decode())

    def _healthy(self, port: int, path: str = "/healthz") -> bool:
        try:
            self.fetch(port, path)
            return True
        except OSError:
            return False

    def _start_etcd(self) -> None:
        client, peer = free_port(), free_port()
        self.etcd_url = f"http://127.0.0.1:{client}"
        self.start("etcd", [
            self.bin / "etcd", "--name=test", f"--data-dir={self.directory / 'etcd'}",
            f"--listen-client-urls={self.etcd_url}", f"--advertise-client-urls={self.etcd_url}",
            f"--listen-peer-urls=http://127.0.0.1:{peer}", f"--initial-advertise-peer-urls=http://127.0.0.1:{peer}",
            f"--initial-cluster=test=http://127.0.0.1:{peer}", "--unsafe-no-fsync=true", "--log-level=warn",
        ])

        def etcd_healthy() -> bool:
            try:
                with urllib.request.urlopen(f"{self.etcd_url}/health", timeout=2) as reply:
                    return bool(json.loads(reply.read()).get("health") == "true")
            except OSError:
                return False

        self.wait_for("etcd", etcd_healthy)

    def _start_apiserver(self) -> None:
        p = self.pki
        self.start("kube-apiserver", [
            self.bin / "kube-apiserver", f"--etcd-servers={self.etcd_url}",
            "--bind-address=127.0.0.1", "--advertise-address=127.0.0.1", f"--secure-port={self.apiserver_port}",
            f"--tls-cert-file={p.serving.cert}", f"--tls-private-key-file={p.serving.key}",
            f"--client-ca-file={p.ca.cert}",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            f"--service-account-key-file={p.sa_pub}", f"--service-account-signing-key-file={p.sa_key}",
            "--service-cluster-ip-range=10.96.0.0/16", "--authorization-mode=RBAC",
            "--endpoint-reconciler-type=none", "--allow-privileged=true",
            f"--proxy-client-cert-file={p.front_proxy.cert}", f"--proxy-client-key-file={p.front_proxy.key}",
            f"--requestheader-client-ca-file={p.front_proxy_ca.cert}",
            "--requestheader-allowed-names=front-proxy-client",
            "--requestheader-username-headers=X-Remote-User", "--requestheader-group-headers=X-Remote-Group",
            "--requestheader-extra-headers-prefix=X-Remote-Extra-",
        ])
        self.wait_for("kube-apiserver /readyz", lambda: self._healthy(self.apiserver_port, "/readyz"))

    def restart_apiserver(self) -> None:
        """Stop kube-apiserver and start it again on the same flags (what an upgrade looks like to
        clients: watches end, and the new server's watch cache starts at the current revision)."""
        process = self.processes["kube-apiserver"]
        process.stop()
        process.start()
        self.wait_for("kube-apiserver /readyz after a restart", lambda: self._healthy(self.apiserver_port, "/readyz"))

    def _start_controller_manager(self) -> None:
        port = free_port()
        config = self.admin_kubeconfig
        self.start("kube-controller-manager", [
            self.bin / "kube-controller-manager", f"--kubeconfig={config}",
            f"--authentication-kubeconfig={config}", f"--authorization-kubeconfig={config}",
            "--bind-address=127.0.0.1", f"--secure-port={port}", "--leader-elect=false",
            "--controllers=*", "--use-service-account-credentials=true",
            f"--service-account-private-key-file={self.pki.sa_key}", f"--root-ca-file={self.pki.ca.cert}",
            "--horizontal-pod-autoscaler-sync-period=2s",
            # the Job controller's own account of each sync (pods it counts, backoff delays) and of
            # its expectations: what a failing warm Job test needs to tell the controller's decision
            # from the test's timing
            "--vmodule=job_controller=4,controller_utils=4",
        ])
        self.wait_for("kube-controller-manager /healthz", lambda: self._healthy(port))

    def _start_kwok(self) -> None:
        port = free_port()
        stages_file = self.directory / "kwok-stages.yaml"
        stages_file.write_text(stages(self.bin))
        self.start("kwok", [
            self.bin / "kwok", f"--kubeconfig={self.admin_kubeconfig}", f"--config={stages_file}",
            "--manage-all-nodes=true", f"--server-address=127.0.0.1:{port}",
            # Keep every node's Lease renewed (every quarter of its duration). The heartbeat stage
            # patches Node status only every 10-20 minutes and relies on the Lease for liveness:
            # without one, kube-controller-manager marked the nodes NotReady every 50 s, and with
            # them every pod on them, which KWOK never made Ready again.
            "--node-lease-duration-seconds=40",
        ])

        def kwok_healthy() -> bool:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as reply:
                    return bool(reply.status == 200)
            except OSError:
                return False

        self.wait_for("kwok /healthz", kwok_healthy)

    def start_scheduler(self, name: str, config: dict[str, Any], *, kubeconfig: Path | None = None,
                        leader_election: bool = False) -> Process:
        """A kube-scheduler on ``config`` (a KubeSchedulerConfiguration); waits for /healthz.

        It acts as admin, or as the user of ``kubeconfig`` (for its API calls and for checking who
        calls its own endpoints). Leader election is off unless asked for, then as ``config`` says.
        """
        port = free_port()
        kc = kubeconfig or self.admin_kubeconfig
        config = {**config, "clientConnection": {"kubeconfig": str(kc)}}
        if not leader_election:
            config["leaderElection"] = {"leaderElect": False}
        path = self.directory / f"{name}.yaml"
        path.write_text(yaml.safe_dump(config))
        process = self.start(name, [self.bin / "kube-scheduler", f"--config={path}", "--bind-address=127.0.0.1",
                                    f"--secure-port={port}", f"--authentication-kubeconfig={kc}",
                                    f"--authorization-kubeconfig={kc}"])
        self.wait_for(f"{name} /healthz", lambda: self._healthy(port))
        self.scheduler_ports[name] = port
        return process

    # ----- clients

    def kubectl(self, *args: str, input: str | None = None, kubeconfig: Path | None = None,
                check: bool = True) -> subprocess.CompletedProcess[str]:
        """``kubectl`` (built with the cluster) as admin, or as the user of ``kubeconfig``."""
        done = subprocess.run([str(self.bin / "kubectl"), f"--kubeconfig={kubeconfig or self.admin_kubeconfig}",
                               *args], input=input, capture_output=True, text=True, timeout=120, check=False)
        if check and done.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} failed ({done.returncode}):\n{done.stderr}")
        return done

    def kubectl_ok(self, *args: str) -> bool:
        return self.kubectl(*args, check=False).returncode == 0

    def apply(self, objects: Sequence[dict[str, Any]] | str, *extra: str) -> str:
        text = objects if isinstance(objects, str) else yaml.safe_dump_all(list(objects))
        return self.kubectl("apply", "-f", "-", *extra, input=text).stdout

    def get(self, *args: str) -> Any:
        return json.loads(self.kubectl("get", *args, "-o", "json").stdout)

    def allowed(self, user: str, verb: str, resource: str, *, group: str = "", namespace: str = "",
                name: str = "") -> tuple[bool, str]:
        """What the real authorizer says to ``user`` (a ServiceAccount's groups added) doing ``verb`` on
        ``resource``: a SubjectAccessReview, so it works for resources no API serves yet."""
        groups = ["system:authenticated"]
        if user.startswith("system:serviceaccount:"):
            groups += ["system:serviceaccounts", f"system:serviceaccounts:{user.split(':')[2]}"]
        review = {"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
                  "spec": {"user": user, "groups": groups, "resourceAttributes": {
                      "verb": verb, "resource": resource, "group": group, "namespace": namespace, "name": name}}}
        status = json.loads(self.kubectl("create", "-f", "-", "-o", "json", input=json.dumps(review)).stdout)["status"]
        return bool(status.get("allowed")), str(status.get("reason", ""))

    def token_kubeconfig(self, namespace: str, service_account: str) -> Path:
        """A kubeconfig that authenticates as a ServiceAccount (a token from the TokenRequest API)."""
        token = self.kubectl("create", "token", service_account, "-n", namespace, "--duration=2h").stdout.strip()
        path = self.directory / f"sa-{namespace}-{service_account}.kubeconfig"
        path.write_text(yaml.safe_dump(kubeconfig(self.server, self.pki.ca.cert, token=token)))
        return path

    def pod_token_kubeconfig(self, namespace: str, service_account: str, node: str) -> Path:
        """A kubeconfig with the token a pod of ``service_account`` on ``node`` gets: bound to a pod
        (``<service_account>-<node>``, created pinned there, KWOK runs it; labelled
        :data:`TOKEN_HOLDER_LABEL`, it asks for no resources), so the API server adds the pod's node
        name to the account's user info, as it does for a DaemonSet's pod."""
        pod = f"{service_account}-{node}"
        self.apply([{"apiVersion": "v1", "kind": "Pod",
                     "metadata": {"name": pod, "namespace": namespace, "labels": {TOKEN_HOLDER_LABEL: "true"}},
                     "spec": {"nodeName": node, "serviceAccountName": service_account,
                              "automountServiceAccountToken": False,
                              "tolerations": [{"operator": "Exists"}],
                              "containers": [{"name": "main", "image": "registry.test/token-holder:1"}]}}])
        token = self.kubectl("create", "token", service_account, "-n", namespace, "--duration=2h",
                             "--bound-object-kind=Pod", f"--bound-object-name={pod}").stdout.strip()
        path = self.directory / f"sa-{namespace}-{service_account}-{node}.kubeconfig"
        path.write_text(yaml.safe_dump(kubeconfig(self.server, self.pki.ca.cert, token=token)))
        return path

    def keep_logs(self, destination: Path) -> Path:
        """Copy every log to ``destination`` (for a failed session)."""
        shutil.copytree(self.logs, destination, dirs_exist_ok=True)
        return destination
