"""The Helm chart (deploy/helm/extender) rendered, and the kustomize tree generated from it.

The chart is the one source of the deployment. ``deploy/kustomize`` is written from it by
:func:`write_kustomize` (``scripts/render-kustomize``) and checked to be current by
tests/test_packaging.py. How the tree is cut:

* every **variant** is one choice per dimension: the overlay (``self-managed``,
  ``second-scheduler``), Redis (the chart's StatefulSet, or yours by URL) and where the scaler's
  decisions go (External Metrics API, or KEDA, each with certificates from cert-manager or from
  Secrets); each choice stands for a set of kustomize components (:data:`VARIANT_CHOICES`);
* each variant is rendered with ``helm template`` (Helm's own labels off, no Secret holding
  credentials: kustomize users create ``extender-redis`` themselves);
* every rendered object goes to the one place (base, overlay or component) whose variants are
  exactly the variants that render it, with the same content. An object that fits no place means
  the chart mixes two choices in one object, and generation fails naming it;
* the policy ConfigMap becomes a ``configMapGenerator`` over ``base/policy.yaml``, so kustomize users
  edit one file; the APIService's ``caBundle`` of the Secret path is left out (it is yours: a patch in
  your overlay, docs/install.md).

Objects keep the comments the chart's templates give them: each is written as Helm printed it.
"""

from __future__ import annotations

import argparse
import itertools
import os
import subprocess
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
CHART = ROOT / "deploy" / "helm" / "extender"
KUSTOMIZE = ROOT / "deploy" / "kustomize"
EXAMPLES = ROOT / "deploy" / "examples"
NAMESPACE = "kube-system"
HEADER = ("# Generated from deploy/helm/extender by scripts/render-kustomize: do not edit (edit the chart and\n"
          "# run it again; tests/test_packaging.py fails while this is not current).\n")
#: The caBundle rendered for the Secret path; the generated component leaves it out.
CA_BUNDLE_PLACEHOLDER = "UExBQ0VIT0xERVI="

Key = tuple[str, str, str]  # (kind, namespace, name)

#: Values of the kustomize rendering: no Helm labels, no Secret with credentials.
KUSTOMIZE_VALUES = {"helmLabels": "false", "redis.secret.create": "false"}

#: One choice per dimension: its Helm values and the kustomize components (or overlay) it stands for.
VARIANT_CHOICES: dict[str, dict[str, tuple[dict[str, str], tuple[str, ...]]]] = {
    "overlay": {
        "self-managed": ({"mode": "self-managed"}, ("components/self-managed",)),
        "second-scheduler": ({"mode": "second-scheduler"}, ("components/second-scheduler",)),
    },
    "redis": {
        "statefulset": ({"redis.mode": "statefulset"}, ("components/redis-statefulset",)),
        "url": ({"redis.mode": "url"}, ()),
    },
    "metrics": {
        "cert-manager": ({"metrics.mode": "external-metrics", "metrics.externalMetrics.certificates": "cert-manager"},
                         ("components/external-metrics", "components/external-metrics-cert-manager")),
        "ca-secret": ({"metrics.mode": "external-metrics", "metrics.externalMetrics.certificates": "secret",
                       "metrics.externalMetrics.caBundle": CA_BUNDLE_PLACEHOLDER},
                      ("components/external-metrics", "components/external-metrics-ca-secret")),
        "keda-cert-manager": ({"metrics.mode": "keda", "metrics.keda.certificates": "cert-manager"},
                              ("components/keda", "components/keda-cert-manager")),
        "keda-secret": ({"metrics.mode": "keda", "metrics.keda.certificates": "secret"}, ("components/keda",)),
    },
}
#: The components each overlay (deploy/kustomize/overlays/NAME) is made of, besides its own.
OVERLAY_DEFAULTS = {"redis": "statefulset", "metrics": "cert-manager"}

#: Kinds whose definitions come with another project (cert-manager, KEDA): not served by a bare API server.
FOREIGN_KINDS = {"Certificate", "Issuer", "ClusterIssuer", "ScaledObject", "TriggerAuthentication", "PodMonitor",
                 "PrometheusRule"}
MONITORING = ROOT / "deploy" / "monitoring"
MONITORING_HEADER = ("# Generated from deploy/helm/extender (monitoring.enabled=true) by scripts/render-kustomize: do\n"
                     "# not edit (edit the chart and run it again; tests/test_monitoring.py fails while this is not\n"
                     "# current). Namespace kube-system: change it to where you installed extender.\n")
#: deploy/monitoring file -> the kinds it holds, from the chart with ``monitoring.enabled=true``.
MONITORING_FILES = {"podmonitors.yaml": ("PodMonitor",), "prometheusrule.yaml": ("PrometheusRule",)}


@dataclass(frozen=True)
class Variant:
    overlay: str
    redis: str
    metrics: str

    @property
    def name(self) -> str:
        return f"{self.overlay}+redis-{self.redis}+{self.metrics}"

    def values(self) -> dict[str, str]:
        out = dict(KUSTOMIZE_VALUES)
        for dimension, choice in (("overlay", self.overlay), ("redis", self.redis), ("metrics", self.metrics)):
            out.update(VARIANT_CHOICES[dimension][choice][0])
        return out

    def places(self) -> tuple[str, ...]:
        """The kustomize directories this variant is made of: base, its overlay, its components."""
        parts = [VARIANT_CHOICES[d][c][1] for d, c in (("overlay", self.overlay), ("redis", self.redis),
                                                        ("metrics", self.metrics))]
        return ("base", *itertools.chain.from_iterable(parts))

    def components(self) -> tuple[str, ...]:
        return tuple(p for p in self.places() if p.startswith("components/"))


OVERLAYS = tuple(VARIANT_CHOICES["overlay"])


def variants() -> list[Variant]:
    return [Variant(*choice) for choice in itertools.product(*(list(c) for c in VARIANT_CHOICES.values()))]


def default_variant(overlay: str) -> Variant:
    return Variant(overlay, OVERLAY_DEFAULTS["redis"], OVERLAY_DEFAULTS["metrics"])


# ---- tools --------------------------------------------------------------------------------------


def _built(script: str, what: str) -> Path:
    """The bin folder a scripts/build-* script prints; builds first (progress on the terminal) when missing."""
    found = subprocess.run([str(ROOT / "scripts" / script), "--print"], capture_output=True, text=True, check=False)
    if found.returncode == 0:
        return Path(found.stdout.strip())
    done = subprocess.run([str(ROOT / "scripts" / script)], stdout=subprocess.PIPE, stderr=sys.__stderr__,
                          text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"scripts/{script} failed (exit {done.returncode}); it builds {what}")
    return Path(done.stdout.strip().splitlines()[-1])


@cache
def helm() -> Path:
    return _built("build-helm", "helm") / "helm"


@cache
def kubectl() -> Path:
    return _built("build-cluster", "kubectl") / "kubectl"


def run(args: Sequence[str | Path], *, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([str(a) for a in args], capture_output=True, text=True, timeout=120, check=False)
    if check and done.returncode != 0:
        raise AssertionError(f"{' '.join(map(str, args))} failed ({done.returncode}):\n{done.stderr}")
    return done


# ---- rendering ----------------------------------------------------------------------------------


def helm_template(values: dict[str, str], *, chart: Path = CHART, check: bool = True,
                  flags: Sequence[str | Path] = ()) -> subprocess.CompletedProcess[str]:
    """``helm template`` with ``values`` given as ``--set`` (strings as ``--set-string``; a comma,
    which separates assignments in ``--set``, escaped), then ``flags`` (``-f FILE``,
    ``--skip-schema-validation``, ...)."""
    sets: list[str] = []
    for name, value in sorted(values.items()):
        flag = "--set-string" if name.endswith(("caBundle", "url")) else "--set"
        sets += [flag, f"{name}={value.replace(',', chr(92) + ',')}"]
    return run([helm(), "template", "extender", chart, "--namespace", NAMESPACE, *sets, *flags], check=check)


def chunks(text: str) -> list[tuple[dict[str, Any], str]]:
    """Each object of a multi-document YAML stream with its own text (comments kept, Helm's
    ``# Source:`` lines dropped); documents that hold only comments are skipped."""
    out: list[tuple[dict[str, Any], str]] = []
    for part in ("\n" + text).split("\n---\n"):
        body = "\n".join(line for line in part.strip("\n").splitlines() if not line.startswith("# Source:"))
        body = body.rstrip() + "\n"  # parsed as written: a block scalar at the end keeps its newline
        doc = yaml.safe_load(body) if body.strip() else None
        if doc:
            out.append((doc, body))
    return out


def key(doc: dict[str, Any]) -> Key:
    meta = doc.get("metadata", {})
    return doc["kind"], meta.get("namespace", ""), meta["name"]


def by_key(docs: Iterable[dict[str, Any]]) -> dict[Key, dict[str, Any]]:
    out: dict[Key, dict[str, Any]] = {}
    for doc in docs:
        assert key(doc) not in out, f"{key(doc)} twice"
        out[key(doc)] = doc
    return out


@cache
def render(variant: Variant) -> tuple[tuple[dict[str, Any], str], ...]:
    return tuple(chunks(helm_template(variant.values()).stdout))


def objects(variant: Variant) -> dict[Key, dict[str, Any]]:
    return by_key(doc for doc, _ in render(variant))


@cache
def _rendered(values: frozenset[tuple[str, str]]) -> tuple[dict[str, Any], ...]:
    return tuple(doc for doc, _ in chunks(helm_template(dict(values)).stdout))


def rendered(**values: str) -> list[dict[str, Any]]:
    """The chart with Helm's defaults and ``values`` (dotted names with ``__`` for ``.``, as
    ``redis__mode="url"``), as parsed objects (fresh copies: callers may change them)."""
    import copy

    return copy.deepcopy(list(_rendered(frozenset((k.replace("__", "."), v) for k, v in values.items()))))


def one(docs: Iterable[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    """The only object of ``kind`` (named ``name``) among ``docs``."""
    (found,) = [d for d in docs if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)]
    return found


def container(workload: dict[str, Any], name: str) -> dict[str, Any]:
    found: dict[str, Any] = next(c for c in workload["spec"]["template"]["spec"]["containers"] if c["name"] == name)
    return found


# ---- the command lines rendered -----------------------------------------------------------------

#: Written in place of a value the kubelet fills in (secretKeyRef, configMapKeyRef, ...).
FROM_THE_CLUSTER = "<set by the kubelet>"
#: What the kubelet writes for a downward-API field whose shape a command checks at start (the agent
#: refuses a $NODE_NAME that is no node name).
FIELD_VALUES = {"spec.nodeName": "gpu-node-1"}
#: The same for a variable read from a Secret or a ConfigMap: the store URL is refused at start unless
#: it is a Redis URL (the rendered Secret holds one; its host differs between installs).
SECRET_VALUES = {"REDIS_URL": "redis://redis.example:6379/0"}


def env_value(entry: Mapping[str, Any]) -> str:
    """The value a container's environment entry has when the pod runs, or a stand-in for it."""
    if "value" in entry:
        return str(entry["value"])
    field = entry.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath")
    if field is not None:
        return FIELD_VALUES.get(field, FROM_THE_CLUSTER)
    return SECRET_VALUES.get(str(entry.get("name")), FROM_THE_CLUSTER)


@dataclass(frozen=True)
class Command:
    """An ``extender`` command line a rendered container runs: where, its arguments, environment and mounts."""

    where: str
    args: tuple[str, ...]
    environ: Mapping[str, str]
    mounts: tuple[str, ...]


def containers(source: str, docs: list[dict[str, Any]]) -> list[Command]:
    """Every container of ``docs``' workloads that runs ``extender`` (tests/test_rendered_commands.py)."""
    out: list[Command] = []
    for doc in docs:
        if doc["kind"] not in ("Deployment", "DaemonSet", "StatefulSet", "Job"):
            continue
        pod = doc["spec"]["template"]["spec"]
        for c in [*pod.get("initContainers", []), *pod["containers"]]:
            command = list(c.get("command", []))
            if command[:1] != ["extender"]:
                continue
            environ = {e["name"]: env_value(e) for e in c.get("env", [])}
            mounts = tuple(m["mountPath"] for m in c.get("volumeMounts", []))
            args = tuple(command[1:] + list(c.get("args", [])))
            out.append(Command(f"{source}/{doc['metadata']['name']}/{c['name']}", args, environ, mounts))
    return out


# ---- the kustomize tree -------------------------------------------------------------------------


def _strip_generated(doc: dict[str, Any], text: str) -> tuple[dict[str, Any], str]:
    """The caBundle of the Secret path leaves the generated object (yours, by a patch)."""
    if doc["kind"] == "APIService" and doc["spec"].get("caBundle") == CA_BUNDLE_PLACEHOLDER:
        doc = {**doc, "spec": {k: v for k, v in doc["spec"].items() if k != "caBundle"}}
        text = "".join(line for line in text.splitlines(keepends=True)
                       if CA_BUNDLE_PLACEHOLDER not in line and "base64 of the PEM of the CA" not in line)
    return doc, text


def plan() -> dict[str, list[str]]:
    """Each kustomize directory and the texts of the objects it holds; fails on an object no place fits."""
    every = variants()
    seen: dict[tuple[Key, str], list[tuple[Variant, str]]] = {}  # each version of each object
    for variant in every:
        for rendered_doc, rendered_text in render(variant):
            doc, text = _strip_generated(rendered_doc, rendered_text)
            seen.setdefault((key(doc), yaml.safe_dump(doc, sort_keys=True)), []).append((variant, text))
    places: dict[str, list[str]] = {"base": []}
    for variant in every:
        for place in variant.places():
            places.setdefault(place, [])
    for (k, _), found in sorted(seen.items()):
        where = {v for v, _ in found}
        homes = [p for p in places if {v for v in every if p in v.places()} == where]
        if len(homes) != 1:
            raise ValueError(f"{k} differs between variants in a way no kustomize place expresses "
                             f"(this version rendered by {sorted(v.name for v in where)})")
        if k == ("ConfigMap", NAMESPACE, "extender-policy"):
            continue  # the configMapGenerator of base
        places[homes[0]].append(found[0][1])
    return places


def policy_text() -> str:
    doc = objects(default_variant("self-managed"))[("ConfigMap", NAMESPACE, "extender-policy")]
    return str(doc["data"]["policy.yaml"])


def kustomization(place: str, *, resources: Sequence[str], components: Sequence[str] = ()) -> str:
    doc: dict[str, Any] = {"apiVersion": "kustomize.config.k8s.io/v1beta1" if not place.startswith("components/")
                           else "kustomize.config.k8s.io/v1alpha1",
                           "kind": "Component" if place.startswith("components/") else "Kustomization"}
    if resources:
        doc["resources"] = list(resources)
    if components:
        doc["components"] = list(components)
    if place == "base":
        doc["configMapGenerator"] = [{
            "name": "extender-policy", "namespace": NAMESPACE, "files": ["policy.yaml"],
            "options": {"disableNameSuffixHash": True,
                        "labels": {"app.kubernetes.io/name": "extender", "app.kubernetes.io/part-of": "extender"}}}]
    return HEADER + yaml.safe_dump(doc, sort_keys=False)


def tree() -> dict[Path, str]:
    """Every file of deploy/kustomize, by path relative to it."""
    files: dict[Path, str] = {}
    for place, texts in plan().items():
        directory = Path(place)
        if texts:
            files[directory / "resources.yaml"] = HEADER + "---\n".join(texts)
        files[directory / "kustomization.yaml"] = kustomization(place, resources=["resources.yaml"] if texts else [])
    for overlay in OVERLAYS:
        files[Path("overlays") / overlay / "kustomization.yaml"] = kustomization(
            f"overlays/{overlay}", resources=["../../base"],
            components=[f"../../{c}" for c in default_variant(overlay).components()])
    files[Path("base/policy.yaml")] = policy_text()
    return files


def write_kustomize(root: Path = KUSTOMIZE) -> list[Path]:
    """Write :func:`tree` under ``root``, removing files it no longer has; returns the files written."""
    wanted = tree()
    for old in sorted(root.rglob("*"), reverse=True) if root.exists() else []:
        relative = old.relative_to(root)
        if old.is_file() and relative not in wanted:
            old.unlink()
        elif old.is_dir() and not any(old.iterdir()):
            old.rmdir()
    for relative, text in wanted.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return [root / r for r in sorted(wanted)]


def kustomize_build(directory: Path) -> dict[Key, dict[str, Any]]:
    return by_key(d for d in yaml.safe_load_all(run([kubectl(), "kustomize", directory]).stdout) if d)


def variant_overlay(variant: Variant, directory: Path, *, root: Path = KUSTOMIZE) -> Path:
    """A kustomization in ``directory`` that builds ``variant`` from the tree at ``root``: the base and
    the variant's components (for the Secret path, with the caBundle patch an admin adds)."""
    directory.mkdir(parents=True, exist_ok=True)

    def relative(place: str) -> str:  # kustomize takes no absolute paths
        return os.path.relpath(root / place, directory)

    doc: dict[str, Any] = {"apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
                           "resources": [relative("base")],
                           "components": [relative(c) for c in variant.components()]}
    if variant.metrics == "ca-secret":
        doc["patches"] = [{"target": {"kind": "APIService", "name": "v1beta1.external.metrics.k8s.io"},
                           "patch": yaml.safe_dump([{"op": "add", "path": "/spec/caBundle",
                                                     "value": CA_BUNDLE_PLACEHOLDER}])}]
    (directory / "kustomization.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    return directory


def monitoring_files() -> dict[Path, str]:
    """The Prometheus Operator manifests of deploy/monitoring, as the chart renders them (without Helm's labels)."""
    texts = chunks(helm_template({**KUSTOMIZE_VALUES, "monitoring.enabled": "true"}).stdout)
    return {MONITORING / name: MONITORING_HEADER + "---\n".join(text for doc, text in texts if doc["kind"] in kinds)
            for name, kinds in MONITORING_FILES.items()}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="write deploy/kustomize from the Helm chart")
    parser.add_argument("--check", action="store_true", help="only say whether deploy/kustomize is current")
    args = parser.parse_args(argv)
    if args.check:
        stale = [str(p) for p, text in tree().items() if not (KUSTOMIZE / p).exists()
                 or (KUSTOMIZE / p).read_text() != text]
        stale += [str(p.relative_to(ROOT)) for p, text in monitoring_files().items()
                  if not p.exists() or p.read_text() != text]
        print("\n".join(stale) or "deploy/kustomize is current")
        return 1 if stale else 0
    for path in write_kustomize():
        print(path.relative_to(ROOT))
    for path, text in monitoring_files().items():
        path.write_text(text)
        print(path.relative_to(ROOT))
    return 0


if __name__ == "__main__":
    sys.exit(main())
