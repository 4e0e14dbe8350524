"""Packaging: the Helm chart lints and renders, deploy/kustomize is generated from it and current,
both give the same objects for every combination, and the defaults are the secure ones.

The server-side half (everything rendered passes the real kube-apiserver's validation, the
second scheduler schedules with its own grants) is tests/test_cluster_packaging.py.
"""

from __future__ import annotations

import base64
import re
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

from extender import __version__
from extender.cli import main
from extender.core.policy import parse_policy
from extender.kube.objects import STANDBY_LABEL
from extender.state.acl import ROLES
from extender.state.sentinel import parse as parse_sentinel
from tests import chart

ROOT = chart.ROOT
VARIANTS = chart.variants()
#: Extra values that change what the defaults leave out, checked like the variants.
EXTRA = {
    "agent-labels-nodes": {"agent__labelNodes": "true"},
    "extender-mutual-tls": {"extender__listen": "tls"},
    "metrics-none": {"metrics__mode": "none"},
    "second-scheduler-keda": {"mode": "second-scheduler", "metrics__mode": "keda", "redis__mode": "url",
                              "redis__url": "redis+sentinel://:pw@redis-sentinel.redis.svc:26379/extender"},
    "agent-hub-caches": {"agent__hubCaches[0]": "/mnt/nvme/hf-hub", "agent__hubCaches[1]": "/var/lib/hf"},
    "agent-cri-socket": {"agent__criSocket": "/run/containerd/containerd.sock"},
    "keda-own-secrets-and-ports": {"metrics__mode": "keda", "metrics__keda__certificates": "secret",
                                   "metrics__keda__tls__secretName": "my-scaler-tls", "metrics__keda__port": "7070",
                                   "metrics__keda__healthPort": "7071"},
    "standby": {"standby__enabled": "true", "standby__workloads[0]__name": "qwen3-moe",
                "standby__workloads[0]__gpus": "2"},
    "standby-keda": {"metrics__mode": "keda", "standby__enabled": "true", "standby__workloads[0]__name": "qwen3-moe",
                     "standby__workloads[0]__gpus": "2"},
}
#: Our workloads that call no Kubernetes API: they get no token.
NO_API = {"scheduler-extender", "extender-keda-scaler", "extender-redis", "extender-agent", "qwen3-moe-standby"}


def all_renders() -> list[tuple[str, list[dict[str, Any]]]]:
    out = [(v.name, [doc for doc, _ in chart.render(v)]) for v in VARIANTS]
    out += [(name, chart.rendered(**values)) for name, values in EXTRA.items()]
    out.append(("defaults", chart.rendered()))
    return out


RENDERS = all_renders()


# ---- the chart ----------------------------------------------------------------------------------


def test_helm_lint_is_clean() -> None:
    out = chart.run([chart.helm(), "lint", "--strict", chart.CHART]).stdout
    assert "1 chart(s) linted, 0 chart(s) failed" in out
    assert "[WARNING]" not in out and "[ERROR]" not in out, out


def test_chart_and_package_versions_agree() -> None:
    meta = yaml.safe_load((chart.CHART / "Chart.yaml").read_text())
    assert meta["version"] == meta["appVersion"] == __version__
    image = chart.container(chart.one(chart.rendered(), "Deployment", "extender-sync"), "sync")["image"]
    assert image.endswith(f":{__version__}")


@pytest.mark.parametrize(
    ("values", "message"),
    [
        pytest.param({"mode": "managed"}, "mode must be self-managed or second-scheduler", id="mode"),
        pytest.param({"metrics.mode": "prometheus"}, "metrics.mode must be external-metrics, keda or none",
                     id="metrics"),
        pytest.param({"redis.mode": "url"}, "redis.url", id="redis-url-missing"),
        pytest.param({"metrics.externalMetrics.certificates": "secret"}, "metrics.externalMetrics.caBundle",
                     id="ca-bundle-missing"),
        pytest.param({"mode": "second-scheduler", "extender.listen": "tls"}, "extender.listen=tls is for self-managed",
                     id="tls-in-second-scheduler"),
        pytest.param({"extender.listen": "0.0.0.0"}, "extender.listen must be loopback or tls", id="listen"),
        pytest.param({"metrics.mode": "keda", "metrics.keda.certificates": "none"},
                     "metrics.keda.certificates must be cert-manager or secret", id="keda-certificates"),
        pytest.param({"metrics.mode": "keda", "metrics.keda.healthPort": "9090"},
                     "metrics.keda.healthPort must differ from metrics.keda.port", id="keda-health-port"),
        pytest.param({"agent.hubCaches": "{hf-hub}"}, "agent.hubCaches[0] must be an absolute path", id="hub-cache"),
        pytest.param({"agent.criSocket": "run/containerd/containerd.sock"},
                     "agent.criSocket must be the absolute path of a socket in a directory", id="cri-socket-relative"),
        # its directory would be the node's root, mounted into the agent
        pytest.param({"agent.criSocket": "/containerd.sock"}, "agent.criSocket must be the absolute path",
                     id="cri-socket-in-the-root"),
        pytest.param({"agent.criSocket": "/run/containerd/"}, "agent.criSocket must be the absolute path",
                     id="cri-socket-a-directory"),
        # the chart's own Redis keeps no ACL file: users made in it would be gone at its next restart
        pytest.param({"redis.secret.keyPerComponent": "true", "redis.secret.create": "false"},
                     "redis.secret.keyPerComponent needs redis.mode=url", id="user-keys-with-the-charts-redis"),
        pytest.param({"redis.mode": "url", "redis.url": "redis://r:6379", "redis.secret.keyPerComponent": "true"},
                     "and redis.secret.create=false", id="user-keys-in-a-secret-the-chart-makes"),
        # keda-scaler refuses --metrics-bind on its --listen port (exit 2)
        pytest.param({"metrics.mode": "keda", "monitoring.ports.keda": "9090"},
                     "monitoring.ports.keda must differ from metrics.keda.port", id="keda-metrics-port"),
        # serve binds both on one network namespace: the second bind fails (gunicorn exits)
        pytest.param({"extender.port": "9464"}, "monitoring.ports.extender must differ from extender.port",
                     id="extender-metrics-port"),
        # kube-scheduler's secure port (its probes) in the second scheduler's pod: one of the two cannot bind
        pytest.param({"mode": "second-scheduler", "extender.port": "10259"},
                     "must not be 10259 in second-scheduler mode", id="extender-port-of-the-scheduler"),
        pytest.param({"mode": "second-scheduler", "monitoring.ports.extender": "10259"},
                     "must not be 10259 in second-scheduler mode", id="extender-metrics-port-of-the-scheduler"),
    ],
)
def test_bad_values_are_refused_with_the_value_named(values: dict[str, str], message: str) -> None:
    """The templates' own checks, which hold where the schema cannot say it (one value against another)
    and with ``--skip-schema-validation`` (values.schema.json: tests/test_chart_schema.py)."""
    done = chart.helm_template(values, check=False, flags=["--skip-schema-validation"])
    assert done.returncode != 0 and message in done.stderr, done.stderr


@pytest.mark.parametrize("values", [
    pytest.param({}, id="one-key"),
    pytest.param({"redis.mode": "url", "redis.secret.create": "false", "redis.secret.keyPerComponent": "true"},
                 id="a-key-per-component"),
])
@pytest.mark.parametrize("scheduler", ["self-managed", "second-scheduler"])
def test_each_component_reads_redis_url_from_its_key(values: dict[str, str], scheduler: str) -> None:
    """``redis.secret.keyPerComponent``: each workload its own Redis user (docs/inventory.md)."""
    done = chart.helm_template({**values, "mode": scheduler, "metrics.mode": "keda"})
    read: dict[str, str] = {}
    for doc, _ in chart.chunks(done.stdout):
        if doc["kind"] not in ("Deployment", "DaemonSet"):
            continue
        for c in doc["spec"]["template"]["spec"]["containers"]:
            for env in c.get("env", []):
                if env["name"] == "REDIS_URL":
                    ref = env["valueFrom"]["secretKeyRef"]
                    assert ref["name"] == "extender-redis"
                    read[c["name"]] = ref["key"]
    users = {"agent": "agent", "sync": "sync", "extender": "extender", "scaler": "scaler", "keda-scaler": "keda"}
    assert read.keys() == users.keys()
    assert read == ({c: f"url-{u}" for c, u in users.items()} if values else dict.fromkeys(users, "url"))
    assert set(users.values()) <= {r.name for r in ROLES}  # each key names a user `extender inventory acl` prints


def test_the_chart_policy_is_valid_and_the_same_file_kustomize_reads() -> None:
    text = chart.policy_text()
    assert text == (chart.CHART / "policy.yaml").read_text()
    assert text == (chart.KUSTOMIZE / "base" / "policy.yaml").read_text()
    assert parse_policy(text, "deploy/helm/extender/policy.yaml").profiles


def test_a_policy_given_as_a_value_reaches_every_component(tmp_path: Path) -> None:
    mine = (ROOT / "policies" / "g5-pcie-fleet.yaml").read_text()
    done = chart.run([chart.helm(), "template", "x", chart.CHART, "-n", chart.NAMESPACE,
                      "--set-file", f"policy={ROOT / 'policies' / 'g5-pcie-fleet.yaml'}"])
    docs = [d for d, _ in chart.chunks(done.stdout)]
    assert chart.one(docs, "ConfigMap", "extender-policy")["data"]["policy.yaml"] == mine
    sync = chart.one(docs, "Deployment", "extender-sync")
    default = chart.one(chart.rendered(), "Deployment", "extender-sync")
    key = "extender.io/policy-sha256"  # a changed policy restarts the sync, which reads it at start
    assert sync["spec"]["template"]["metadata"]["annotations"][key] != \
        default["spec"]["template"]["metadata"]["annotations"][key]


# ---- the kustomize tree -------------------------------------------------------------------------


def test_deploy_kustomize_is_current() -> None:
    wanted = chart.tree()
    present = {p.relative_to(chart.KUSTOMIZE) for p in chart.KUSTOMIZE.rglob("*") if p.is_file()}
    assert present == set(wanted), "run scripts/render-kustomize"
    stale = [str(p) for p, text in wanted.items() if (chart.KUSTOMIZE / p).read_text() != text]
    assert stale == [], f"run scripts/render-kustomize: {stale}"


@pytest.mark.parametrize("variant", VARIANTS, ids=[v.name for v in VARIANTS])
def test_kustomize_builds_what_helm_renders(variant: chart.Variant, tmp_path: Path) -> None:
    built = chart.kustomize_build(chart.variant_overlay(variant, tmp_path / "overlay"))
    assert built == chart.objects(variant)


@pytest.mark.parametrize("overlay", chart.OVERLAYS)
def test_each_overlay_builds_its_default_variant(overlay: str) -> None:
    built = chart.kustomize_build(chart.KUSTOMIZE / "overlays" / overlay)
    assert built == chart.objects(chart.default_variant(overlay))


def test_the_generator_refuses_an_object_no_place_can_hold(monkeypatch: pytest.MonkeyPatch) -> None:
    """The check above is only as good as the cut: an object that depends on two choices at once
    (here: the sync changed by the Redis choice) must stop the generation, not land somewhere."""
    real = chart.render

    def mixed(variant: chart.Variant) -> tuple[tuple[dict[str, Any], str], ...]:
        out = []
        for doc, text in real(variant):
            if doc["kind"] == "Deployment" and doc["metadata"]["name"] == "extender-sync" and variant.redis == "url":
                out.append(({**doc, "metadata": {**doc["metadata"], "annotations": {"x": "y"}}}, text))
            else:
                out.append((doc, text))
        return tuple(out)

    monkeypatch.setattr(chart, "render", mixed)
    with pytest.raises(ValueError, match="extender-sync"):
        chart.plan()


# ---- secure defaults ----------------------------------------------------------------------------


def pods(docs: list[dict[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
    return [(d["metadata"]["name"], d["spec"]["template"]["spec"]) for d in docs
            if d["kind"] in ("Deployment", "DaemonSet", "StatefulSet")]


@pytest.mark.parametrize(("name", "docs"), RENDERS, ids=[n for n, _ in RENDERS])
def test_every_pod_is_confined(name: str, docs: list[dict[str, Any]]) -> None:
    for workload, pod in pods(docs):
        assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}, workload
        for c in pod["containers"]:
            security = c["securityContext"]
            assert security["allowPrivilegeEscalation"] is False, (workload, c["name"])
            assert security["readOnlyRootFilesystem"] is True, (workload, c["name"])
            assert security["capabilities"]["drop"] == ["ALL"], (workload, c["name"])
            # root only for the agent, which reads other pods' files with DAC_READ_SEARCH and nothing else
            if workload == "extender-agent":
                assert security["capabilities"].get("add") == ["DAC_READ_SEARCH"]
            else:
                assert pod["securityContext"]["runAsNonRoot"] is True, workload
                assert "add" not in security["capabilities"], workload


@pytest.mark.parametrize(("name", "docs"), RENDERS, ids=[n for n, _ in RENDERS])
def test_only_pods_that_call_the_api_get_a_token(name: str, docs: list[dict[str, Any]]) -> None:
    labelling = "labels-nodes" in name
    for workload, pod in pods(docs):
        if workload in NO_API and not (workload == "extender-agent" and labelling):
            assert pod["automountServiceAccountToken"] is False, workload
        if workload == "extender-scheduler":
            # the token is mounted into kube-scheduler alone, not into the extender beside it
            assert pod["automountServiceAccountToken"] is False
            mounted = {c["name"] for c in pod["containers"]
                       for m in c.get("volumeMounts", []) if m["name"] == "api-access"}
            assert mounted == {"kube-scheduler"}


@pytest.mark.parametrize(("name", "docs"), RENDERS, ids=[n for n, _ in RENDERS])
def test_nothing_listens_unauthenticated_on_the_host_network(name: str, docs: list[dict[str, Any]]) -> None:
    for workload, pod in pods(docs):
        if not pod.get("hostNetwork"):
            continue
        for c in pod["containers"]:
            binds = [a.removeprefix("--bind=") for a in c.get("args", []) if a.startswith("--bind=")]
            for bind in binds:
                if not bind.startswith("127.0.0.1:"):
                    assert any(a.startswith("--tls-client-ca=") for a in c["args"]), (workload, bind)


@pytest.mark.parametrize(("name", "docs"), RENDERS, ids=[n for n, _ in RENDERS])
def test_disruption_budgets_cover_the_extender_and_the_scalers(name: str, docs: list[dict[str, Any]]) -> None:
    budgets = {d["spec"]["selector"]["matchLabels"]["app.kubernetes.io/name"]
               for d in docs if d["kind"] == "PodDisruptionBudget"}
    wanted = {"extender-scaler"}
    names = {w for w, _ in pods(docs)}
    wanted |= names & {"scheduler-extender", "extender-scheduler", "extender-keda-scaler"}
    assert wanted <= budgets
    assert "scheduler-extender" in names or "extender-scheduler" in names  # one serves the scheduler


def test_the_warm_namespace_states_its_pod_security_levels() -> None:
    namespace = chart.one(chart.rendered(), "Namespace", "extender-warm")
    labels = namespace["metadata"]["labels"]
    # warm Jobs mount a hostPath: enforce must allow it; warn and audit show anything above baseline
    assert labels["pod-security.kubernetes.io/enforce"] == "privileged"
    assert labels["pod-security.kubernetes.io/warn"] == labels["pod-security.kubernetes.io/audit"] == "baseline"


@pytest.mark.parametrize(("name", "docs"), RENDERS, ids=[n for n, _ in RENDERS])
def test_the_apiservice_verifies_the_scaler(name: str, docs: list[dict[str, Any]]) -> None:
    services = [d for d in docs if d["kind"] == "APIService"]
    for api in services:
        spec = api["spec"]
        assert "insecureSkipTLSVerify" not in spec
        scaler = chart.one(docs, "Deployment", "extender-scaler")
        tls = next(v for v in scaler["spec"]["template"]["spec"]["volumes"] if v["name"] == "tls")
        dns = f"{spec['service']['name']}.{spec['service']['namespace']}.svc"
        injected = api["metadata"].get("annotations", {}).get("cert-manager.io/inject-ca-from")
        if injected:
            namespace, certificate = injected.split("/")
            cert = chart.one(docs, "Certificate", certificate)
            assert cert["metadata"]["namespace"] == namespace
            assert cert["spec"]["secretName"] == tls["secret"]["secretName"]
            assert dns in cert["spec"]["dnsNames"]
            issuer = chart.one(docs, "Issuer", cert["spec"]["issuerRef"]["name"])
            assert "ca" in issuer["spec"]  # signed by a CA the cainjector can hand on
        else:
            assert base64.b64decode(spec["caBundle"]), name


def test_the_agent_labels_nodes_only_when_asked() -> None:
    default = chart.container(chart.one(chart.rendered(), "DaemonSet", "extender-agent"), "agent")
    asked = chart.container(chart.one(chart.rendered(agent__labelNodes="true"), "DaemonSet", "extender-agent"), "agent")
    assert "--label-nodes" not in default["args"] and "--label-nodes" in asked["args"]


# ---- Redis --------------------------------------------------------------------------------------


def test_the_redis_statefulset_keeps_an_aof_behind_a_password() -> None:
    docs = chart.rendered()
    secret = chart.one(docs, "Secret", "extender-redis")
    password = base64.b64decode(secret["data"]["password"]).decode()
    url = base64.b64decode(secret["data"]["url"]).decode()
    assert len(password) >= 32
    assert url == f"redis://:{password}@extender-redis.{chart.NAMESPACE}.svc:6379/0"
    redis = chart.container(chart.one(docs, "StatefulSet", "extender-redis"), "redis")
    args = redis["args"]
    assert args[args.index("--appendonly") + 1] == "yes"
    assert args[args.index("--requirepass") + 1] == "$(REDIS_PASSWORD)"
    env = {e["name"]: e["valueFrom"]["secretKeyRef"] for e in redis["env"]}
    assert env["REDIS_PASSWORD"] == {"name": "extender-redis", "key": "password"}
    mounts = {m["mountPath"] for m in redis["volumeMounts"]}
    assert args[args.index("--dir") + 1] in mounts
    # a new password each fresh render (an upgrade keeps the installed one: lookup)
    again = chart.one(chart.rendered(redis__storage="11Gi"), "Secret", "extender-redis")
    assert again["data"]["password"] != secret["data"]["password"]


@pytest.mark.parametrize("url", ["rediss://:pw@redis.example:6380/0",
                                 "redis+sentinel://:pw@s1:26379,s2:26379/extender/0"])
def test_an_existing_redis_by_url(url: str) -> None:
    docs = chart.rendered(redis__mode="url", redis__url=url)
    assert base64.b64decode(chart.one(docs, "Secret", "extender-redis")["data"]["url"]).decode() == url
    assert not [d for d in docs if d["kind"] == "StatefulSet"]
    if url.startswith("redis+sentinel"):
        assert parse_sentinel(url).service == "extender"  # a form our client takes


@pytest.mark.parametrize(("name", "docs"), RENDERS, ids=[n for n, _ in RENDERS])
def test_every_component_reads_redis_from_the_one_secret(name: str, docs: list[dict[str, Any]]) -> None:
    for workload, pod in pods(docs):
        for c in pod["containers"]:
            if c.get("command") == ["extender"]:
                env = {e["name"]: e.get("valueFrom", {}).get("secretKeyRef") for e in c.get("env", [])}
                assert env["REDIS_URL"] == {"name": "extender-redis", "key": "url"}, workload


# ---- examples -----------------------------------------------------------------------------------


def example(name: str, kind: str | None = None) -> dict[str, Any]:
    """The one object of an example file (of ``kind``, when the file holds several)."""
    (doc,) = [d for d in yaml.safe_load_all((chart.EXAMPLES / name).read_text()) if d and kind in (None, d["kind"])]
    return dict(doc)


def test_the_vllm_example_is_recognised(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    deployment = example("vllm-deployment.yaml")
    policy_file = tmp_path / "policy.yaml"
    policy_file.write_text(chart.policy_text())
    policy = parse_policy(policy_file.read_text(), str(policy_file))
    pod = deployment["spec"]["template"]
    (profile,) = [p for p in policy.profiles
                  if all(pod["metadata"]["labels"].get(k) == v for k, v in p.match.labels.items())]
    (container,) = pod["spec"]["containers"]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == str(profile.parallelism.tensor)
    # the cache root is the agent's
    cache = next(v for v in pod["spec"]["volumes"] if v["name"] == "cache")["hostPath"]["path"]
    agent = chart.one(chart.rendered(), "DaemonSet", "extender-agent")
    assert cache == next(v for v in agent["spec"]["template"]["spec"]["volumes"] if v["name"] == "cache")[
        "hostPath"]["path"]
    mount = next(m for m in container["volumeMounts"] if m["name"] == "cache")["mountPath"]
    # the compile-cache key is what `extender cachekey` prints for it
    (node_class,) = profile.node_classes
    assert main(["cachekey", "--policy", str(policy_file), "--workload", profile.name,
                 "--node-class", node_class]) == 0
    key = capsys.readouterr().out.strip()
    env = {e["name"]: e["value"] for e in container["env"]}
    assert env["EXTENDER_CACHE_KEY"] == key
    for variable in ("VLLM_CACHE_ROOT", "TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR"):
        assert env[variable].startswith(f"{mount}/compile/$(EXTENDER_CACHE_KEY)/"), variable
    assert f"{mount}/weights/{profile.name}/{profile.weights.version}/.complete" in container["args"][0]


def test_the_standby_example_holds_room_for_one_replica_each_and_is_no_replica() -> None:
    policy = parse_policy(chart.policy_text(), "policy.yaml")
    placeholder = example("standby.yaml", "Deployment")["spec"]["template"]
    workload = example("vllm-deployment.yaml")["spec"]["template"]
    labels = placeholder["metadata"]["labels"]
    profile = policy.profile(labels[STANDBY_LABEL])
    assert profile.autoscaling is not None
    # never counted as a replica of the workload, whose label selector it must not match
    assert policy.profile_for_pod(labels, {}) is None
    # one placeholder asks for what one replica asks for, and may go where it goes
    (held,), (real,) = placeholder["spec"]["containers"], workload["spec"]["containers"]
    assert held["resources"]["limits"] == real["resources"]["limits"]
    for key in ("nodeSelector", "affinity", "tolerations"):
        assert placeholder["spec"].get(key) == workload["spec"].get(key), key
    # below every real pod, never preempting anything itself, and not below cluster-autoscaler's
    # expendable cutoff (-10 by default): under it, placeholders would neither launch nor keep nodes
    priority = example("standby.yaml", "PriorityClass")
    assert placeholder["spec"]["priorityClassName"] == priority["metadata"]["name"]
    assert -10 <= priority["value"] < 0 and priority["preemptionPolicy"] == "Never"
    # the HPA follows the scaler's standby count for that workload, up to the workload's bound
    hpa = example("standby.yaml", "HorizontalPodAutoscaler")
    (metric,) = hpa["spec"]["metrics"]
    assert metric["external"]["metric"] == {"name": "extender-standby-replicas",
                                            "selector": {"matchLabels": {"workload": profile.name}}}
    assert metric["external"]["target"] == {"type": "AverageValue", "averageValue": "1"}
    assert hpa["spec"]["maxReplicas"] == profile.autoscaling.max_replicas


def test_the_scaledobject_points_at_the_keda_scaler() -> None:
    scaled = example("scaledobject.yaml", "ScaledObject")
    (trigger,) = scaled["spec"]["triggers"]
    docs = chart.rendered(metrics__mode="keda")
    service = chart.one(docs, "Service", "extender-keda-scaler")
    (port,) = service["spec"]["ports"]
    address = f"{service['metadata']['name']}.{service['metadata']['namespace']}.svc:{port['port']}"
    assert trigger["type"] == "external" and trigger["metadata"]["scalerAddress"] == address
    policy = parse_policy(chart.policy_text(), "policy.yaml")
    profile = policy.profile(trigger["metadata"]["workload"])
    assert profile.autoscaling is not None
    assert (scaled["spec"]["minReplicaCount"], scaled["spec"]["maxReplicaCount"]) == (
        profile.autoscaling.min_replicas, profile.autoscaling.max_replicas)
    hpa = example("hpa.yaml")
    assert scaled["spec"]["advanced"]["horizontalPodAutoscalerConfig"]["behavior"] == hpa["spec"]["behavior"]


def certificate_of(docs: list[dict[str, Any]], secret: str) -> dict[str, Any]:
    (found,) = [d for d in docs if d["kind"] == "Certificate" and d["spec"]["secretName"] == secret]
    return found


def test_the_scaledobject_and_the_keda_scaler_use_the_same_tls_material() -> None:
    """Mutual TLS end to end as rendered: KEDA's TriggerAuthentication reads the client Secret the chart
    issues (caCert, tlsClientCert, tlsClientKey), the scaler serves the certificate of the Secret it
    mounts, for the host KEDA dials, and requires clients of the CA that issued KEDA's."""
    docs = chart.rendered(metrics__mode="keda")  # certificates: cert-manager, the default
    values = yaml.safe_load((chart.CHART / "values.yaml").read_text())["metrics"]["keda"]
    scaled = example("scaledobject.yaml", "ScaledObject")
    auth = example("scaledobject.yaml", "TriggerAuthentication")
    (trigger,) = scaled["spec"]["triggers"]
    assert trigger["authenticationRef"]["name"] == auth["metadata"]["name"]
    refs = {r["parameter"]: (r["name"], r["key"]) for r in auth["spec"]["secretTargetRef"]}
    client_secret = values["tls"]["clientSecretName"]
    # the keys cert-manager writes into every certificate's Secret
    assert refs == {"caCert": (client_secret, "ca.crt"), "tlsClientCert": (client_secret, "tls.crt"),
                    "tlsClientKey": (client_secret, "tls.key")}
    client = certificate_of(docs, client_secret)
    assert client["spec"]["usages"] == ["client auth"]

    deployment = chart.one(docs, "Deployment", "extender-keda-scaler")
    pod = deployment["spec"]["template"]["spec"]
    container = chart.container(deployment, "keda-scaler")
    flags = dict(a.split("=", 1) for a in container["args"][1:] if "=" in a)
    mount = next(m for m in container["volumeMounts"] if flags["--tls-cert"].startswith(m["mountPath"] + "/"))
    volume = next(v for v in pod["volumes"] if v["name"] == mount["name"])
    for flag, file in (("--tls-cert", "tls.crt"), ("--tls-key", "tls.key"), ("--tls-client-ca", "ca.crt")):
        assert flags[flag] == f"{mount['mountPath']}/{file}", flag
    serving = certificate_of(docs, volume["secret"]["secretName"])
    assert serving["spec"]["usages"] == ["server auth"]
    assert trigger["metadata"]["scalerAddress"].rsplit(":", 1)[0] in serving["spec"]["dnsNames"]
    # one CA issues both: the ca.crt in each Secret verifies the other side
    assert serving["spec"]["issuerRef"] == client["spec"]["issuerRef"] == {"name": "extender-keda-ca", "kind": "Issuer"}
    issuer = chart.one(docs, "Issuer", "extender-keda-ca")
    assert certificate_of(docs, issuer["spec"]["ca"]["secretName"])["spec"]["isCA"] is True

    # the Secret path mounts the same Secret name, which the admin creates (docs/install.md)
    own = chart.rendered(metrics__mode="keda", metrics__keda__certificates="secret")
    assert not [d for d in own if d["kind"] in ("Certificate", "Issuer")]
    assert chart.one(own, "Deployment", "extender-keda-scaler") == deployment


def test_the_keda_scaler_is_probed_over_grpc_on_its_health_port() -> None:
    from extender.keda.server import LIVENESS_SERVICE
    from extender.keda.service import SERVICE_NAME

    deployment = chart.one(chart.rendered(metrics__mode="keda"), "Deployment", "extender-keda-scaler")
    container = chart.container(deployment, "keda-scaler")
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert f"--health-listen=0.0.0.0:{ports['health']}" in container["args"]
    assert f"--listen=0.0.0.0:{ports['grpc']}" in container["args"]
    assert container["readinessProbe"]["grpc"] == {"port": ports["health"], "service": SERVICE_NAME}
    assert container["livenessProbe"]["grpc"] == {"port": ports["health"], "service": LIVENESS_SERVICE}


def test_the_agent_reads_the_policy_and_each_hub_cache() -> None:
    hubs = ["/mnt/nvme/hf-hub", "/var/lib/hf"]
    daemonset = chart.one(chart.rendered(**EXTRA["agent-hub-caches"]), "DaemonSet", "extender-agent")
    pod = daemonset["spec"]["template"]["spec"]
    container = chart.container(daemonset, "agent")
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert "--policy=/etc/extender/policy.yaml" in container["args"]
    assert volumes[mounts["/etc/extender"]["name"]]["configMap"]["name"] == "extender-policy"
    given = [a.split("=", 1)[1] for a in container["args"] if a.startswith("--hub-cache=")]
    assert len(given) == len(hubs)
    for path, host in zip(given, hubs, strict=True):
        assert mounts[path]["readOnly"] is True
        assert volumes[mounts[path]["name"]]["hostPath"]["path"] == host
    default = chart.container(chart.one(chart.rendered(), "DaemonSet", "extender-agent"), "agent")
    assert not [a for a in default["args"] if a.startswith("--hub-cache")]


@pytest.mark.parametrize(("socket", "directory"), [
    pytest.param("/run/containerd/containerd.sock", "/run/containerd", id="containerd"),
    pytest.param("/var/run/crio/crio.sock", "/var/run/crio", id="cri-o"),
])
def test_the_agent_reads_the_runtime_through_its_socket_s_directory_read_only(socket: str, directory: str) -> None:
    daemonset = chart.one(chart.rendered(agent__criSocket=socket), "DaemonSet", "extender-agent")
    pod = daemonset["spec"]["template"]["spec"]
    container = chart.container(daemonset, "agent")
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    name = socket.rsplit("/", 1)[1]
    assert f"--cri-socket=/run/extender-cri/{name}" in container["args"]
    assert mounts["cri"] == {"name": "cri", "mountPath": "/run/extender-cri", "readOnly": True}
    # the directory, not the socket file: a runtime restarted makes a new socket, which a file mount would miss
    assert volumes["cri"]["hostPath"] == {"path": directory, "type": "DirectoryOrCreate"}
    assert pod["automountServiceAccountToken"] is False  # no API access comes with it


def test_the_agent_reads_no_runtime_by_default() -> None:
    daemonset = chart.one(chart.rendered(), "DaemonSet", "extender-agent")
    container = chart.container(daemonset, "agent")
    assert not [a for a in container["args"] if a.startswith("--cri-socket")]
    assert "cri" not in {v["name"] for v in daemonset["spec"]["template"]["spec"]["volumes"]}


# ---- release hygiene ----------------------------------------------------------------------------


def test_version_flag(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0
    assert capsys.readouterr().out.strip() == f"extender {__version__}"


def test_license_matches_pyproject() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["license"] == "Apache-2.0"
    text = (ROOT / "LICENSE").read_text()
    assert text.lstrip().startswith("Apache License") and "Version 2.0, January 2004" in text
    assert "END OF TERMS AND CONDITIONS" in text
    assert re.search(r"^\s*9\. Accepting Warranty or Additional Liability\.", text, re.MULTILINE)
