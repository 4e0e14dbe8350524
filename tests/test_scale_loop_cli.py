"""``extender scale`` as a command: usage errors, ``--once``, and the full process (gunicorn + loop thread).

The full-process test starts ``python -m extender.scaler scale`` (the entry ``extender scale`` uses)
with the loop and the External Metrics API in one gunicorn worker, reads a decision the loop
published through the API, and stops it with SIGTERM: the worker's exit hook stops the loop, which
releases the lock. Waits are bounded polls for a state, never assertions on time.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from extender import cli
from extender.scaler.loop import TickReport
from extender.state import connect
from extender.state.lock import LeaderLock
from tests.conftest import RedisServer
from tests.kube_double import KubeDouble
from tests.kube_double.waiting import wait_until
from tests.net import free_port, stop
from tests.scaler_policy import policy_text
from tests.vllm_endpoint import Counters, MetricsEndpoint, pod, serving

ROOT = Path(__file__).resolve().parent.parent
SETTLE_S = 60.0


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[tuple[KubeDouble, MetricsEndpoint, Path, Path]]:
    with serving(("127.0.0.2",)) as (endpoint,), KubeDouble.running() as double:
        endpoint.counters = Counters(rate=8.0)
        double.apply(pod("qwen3-a", "127.0.0.2"))
        policy = tmp_path / "policy.yaml"
        policy.write_text(policy_text(port=endpoint.port))
        yield double, endpoint, policy, double.write_kubeconfig(tmp_path / "kubeconfig")


USAGE = [
    ("no-policy", ["scale"], 2, "--policy FILE is required"),
    ("cert-without-key", ["scale", "--policy", "p.yaml", "--tls-cert", "c.pem"], 2, "go together"),
    ("two-modes", ["scale", "--policy", "p.yaml", "--once", "--no-loop"], 2, "exclude each other"),
    ("api-without-tls", ["scale", "--policy", "p.yaml"], 2, "served over TLS"),
    # it was silently ignored: with the API, /metrics is on --bind
    ("metrics-bind-beside-the-api", ["scale", "--policy", "p.yaml", "--no-loop", "--insecure-no-auth",
                                     "--bind", "127.0.0.1:6443", "--metrics-bind", "127.0.0.1:9090"], 2,
     "--metrics-bind goes with --no-metrics-api only"),
    ("metrics-bind-with-once", ["scale", "--policy", "p.yaml", "--once", "--metrics-bind", "127.0.0.1:9090"], 2,
     "--metrics-bind goes with --no-metrics-api only"),
    ("missing-policy-file", ["scale", "--policy", "/nonexistent/p.yaml", "--once"], 1, "cannot read"),
]


@pytest.mark.parametrize(("argv", "code", "words"), [u[1:] for u in USAGE], ids=[u[0] for u in USAGE])
def test_usage_errors(argv: list[str], code: int, words: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(argv) == code
    assert words in capsys.readouterr().err


def test_a_policy_without_autoscaling_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    text = policy_text()
    start = text.index("    autoscaling:\n      namespace: default")
    end = text.index("  - name: llama")
    text = text[:start] + text[end:]
    start = text.index("    autoscaling:\n      namespace: ml")
    end = text.index("  - name: batch")
    policy = tmp_path / "p.yaml"
    policy.write_text(text[:start] + text[end:])
    assert cli.main(["scale", "--policy", str(policy), "--once"]) == 1
    assert "no profile with an autoscaling section" in capsys.readouterr().err


def test_serving_checks_its_store_before_starting(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    policy = tmp_path / "p.yaml"
    policy.write_text(policy_text())
    argv = ["scale", "--policy", str(policy), "--insecure-no-auth", "--no-loop",
            "--redis-url", f"redis://127.0.0.1:{free_port()}/0"]  # nothing listens there
    assert cli.main(argv) == 1
    err = capsys.readouterr().err
    assert "not starting" in err and "Redis is unavailable" in err


@pytest.mark.integration
@pytest.mark.parametrize(("flags", "out"), [
    pytest.param([], "", id="text"),
    pytest.param(["--json"], "null", id="json"),  # it printed null, exit 1, and nothing on stderr
    pytest.param(["--json", "--last", "3"], "[]", id="json-last-3"),
    # past a 64-bit index: "extender: reading the decisions of ...: value is not an integer or out of range"
    pytest.param(["--json", "--last", "99999999999999999999"], "[]", id="json-last-past-any-index"),
])
def test_explain_without_a_decision_says_so_in_every_format(flags: list[str], out: str, redis_server: RedisServer,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["scale", "explain", "never-scaled", "--redis-url", redis_server.url, *flags]) == 1
    captured = capsys.readouterr()
    assert captured.out.strip() == out
    assert captured.err.startswith("extender scale explain: no decision recorded for 'never-scaled'")


@pytest.mark.integration
def test_once_runs_one_tick_and_releases(cluster: tuple[KubeDouble, MetricsEndpoint, Path, Path],
                                         redis_server: RedisServer, capsys: pytest.CaptureFixture[str]) -> None:
    _, _, policy, kubeconfig = cluster
    argv = ["scale", "--policy", str(policy), "--kubeconfig", str(kubeconfig), "--redis-url", redis_server.url,
            "--once"]
    assert cli.main([*argv, "--identity", "first"]) == 0
    out = capsys.readouterr().out
    assert "leader first (fencing token 1)" in out
    assert "qwen3: hold at 1 (current 1 ready + 0 starting)" in out
    assert "no observation this tick" in out  # one tick: no previous counters to make a rate from
    assert cli.main([*argv, "--identity", "second"]) == 0  # the first released the lock
    assert "leader second (fencing token 2)" in capsys.readouterr().out


@pytest.mark.integration
def test_once_fails_when_a_workload_got_no_decision(cluster: tuple[KubeDouble, MetricsEndpoint, Path, Path],
                                                    redis_server: RedisServer,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    """It exited 0 with every workload undecided: a script or a probe running it saw success."""
    double, _, policy, kubeconfig = cluster
    double.fail("list", "pods", 500)
    assert cli.main(["scale", "--policy", str(policy), "--kubeconfig", str(kubeconfig),
                     "--redis-url", redis_server.url, "--once"]) == 1
    assert "qwen3: no decision: listing pods" in capsys.readouterr().out


def test_leader_tick_listeners_see_every_led_tick(redis_server: RedisServer) -> None:
    from extender.scaler.loop import ScaleLoop
    from extender.state.decisions import DecisionStore
    from extender.state.history import HistoryStore
    from tests.scaler_policy import make_policy

    client = connect(redis_server.url, "/nonexistent")
    seen: list[TickReport] = []

    def broken(report: TickReport) -> None:
        raise RuntimeError("a listener's bug must not stop the scaler")

    class NoPods:
        def list_pods(self, label_selector: str, namespace: str | None = None) -> list[dict[str, Any]]:
            return []

    loop = ScaleLoop(policy=make_policy(), lock=LeaderLock(client, "a", ttl_s=45), history=HistoryStore(client),
                     decisions=DecisionStore(client), pods=NoPods(), on_leader_tick=[broken, seen.append])
    loop.tick()
    loop.tick()
    assert [r.token for r in seen] == [1, 1]
    standby = ScaleLoop(policy=make_policy(), lock=LeaderLock(client, "b", ttl_s=45), history=HistoryStore(client),
                        decisions=DecisionStore(client), pods=NoPods(), on_leader_tick=[seen.append])
    standby.tick()
    assert len(seen) == 2


def get_json(url: str) -> tuple[int, Any]:
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"null")


@pytest.mark.integration
def test_the_full_process_publishes_what_the_loop_decides(cluster: tuple[KubeDouble, MetricsEndpoint, Path, Path],
                                                          redis_server: RedisServer, tmp_path: Path) -> None:
    _, _, policy, kubeconfig = cluster
    port = free_port()
    log = tmp_path / "scale.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "extender.scaler", "scale", "--policy", str(policy), "--kubeconfig", str(kubeconfig),
             "--redis-url", redis_server.url, "--bind", f"127.0.0.1:{port}", "--insecure-no-auth", "--tick", "0.2",
             "--lease-ttl", "2", "--identity", "scaler-x"],
            cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    base = f"http://127.0.0.1:{port}"
    url = (f"{base}/apis/external.metrics.k8s.io/v1beta1/namespaces/default/extender-forecast-load"
           "?labelSelector=workload%3Dqwen3")
    try:
        def served() -> dict[str, Any] | None:
            # "window" is set once a decision (not the "0" placeholder) is served
            assert process.poll() is None, log.read_text()[-3000:]
            try:
                code, body = get_json(url)
            except (urllib.error.URLError, ConnectionError):
                return None
            found: dict[str, Any] = body["items"][0] if code == 200 else {}
            return found if found.get("window") and found["value"] != "0" else None

        item: dict[str, Any] = wait_until(served, timeout_s=SETTLE_S, interval_s=0.05, what="a decision served",
                                          report=lambda: log.read_text()[-3000:])
        assert item["metricLabels"] == {"workload": "qwen3"}
        assert item["window"] == 1  # the 0.2 s tick, rounded to whole seconds (at least 1)
        # /readyz reports the tick once it has returned (after its writes and the warmer's turn),
        # so it may trail the published value by one tick: poll it, bounded like the wait above
        code, ready = wait_until(lambda: (got := get_json(f"{base}/readyz"))[1].get("leader") is not None and got,
                                 timeout_s=SETTLE_S, interval_s=0.05, what="/readyz to name the leader")
        assert (code, ready["loop"], ready["leader"]) == (200, "running", "scaler-x")
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            exit_code = process.wait(timeout=SETTLE_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
            raise
    assert exit_code == 0, log.read_text()[-3000:]
    assert LeaderLock(connect(redis_server.url, tmp_path), "observer", ttl_s=1).current() is None


def test_a_policy_that_autoscales_nothing_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from tests.gpu_policy import GPU_LLM_POLICY  # a valid policy whose one profile has no autoscaling section

    policy = tmp_path / "policy.yaml"
    policy.write_text(GPU_LLM_POLICY)
    assert cli.main(["scale", "--policy", str(policy), "--once", "--redis-url", "redis://127.0.0.1:1/0"]) == 1
    err = capsys.readouterr().err
    assert f"extender scale: {policy} has no profile with an autoscaling section" in err and "nothing to scale" in err


def api_only(policy: Path, redis_url: str, port: int, log: Path) -> subprocess.Popen[bytes]:
    """``extender scale --no-loop`` (the External Metrics API alone, as deployed: gunicorn) on ``port``,
    its output in ``log``."""
    with log.open("wb") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "extender.scaler", "scale", "--policy", str(policy), "--no-loop",
             "--redis-url", redis_url, "--bind", f"127.0.0.1:{port}", "--insecure-no-auth",
             "--kubeconfig", str(log.parent / "unused-kubeconfig")],
            cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"})


@pytest.mark.integration
def test_an_api_only_scaler_follows_policy_edits(redis_server: RedisServer, tmp_path: Path) -> None:
    # `extender scale --no-loop` read the policy once: a workload moved to another namespace was
    # still served in the old one until a restart. The ConfigMap layout (..data swap) is followed.
    from tests.test_fault_reload import ConfigMapVolume

    volume = ConfigMapVolume(tmp_path / "config")
    volume.publish(policy_text())
    port = free_port()
    log = tmp_path / "scale.log"
    process = api_only(volume.path, redis_server.url, port, log)

    def code_in(namespace: str) -> int:
        url = (f"http://127.0.0.1:{port}/apis/external.metrics.k8s.io/v1beta1/namespaces/{namespace}/"
               "extender-forecast-load?labelSelector=workload%3Dqwen3")
        try:
            return get_json(url)[0]
        except (urllib.error.URLError, ConnectionError):
            return -1

    def until(check: Any, what: str) -> None:
        def done() -> bool:
            assert process.poll() is None, log.read_text()[-3000:]
            return bool(check())

        wait_until(done, timeout_s=SETTLE_S, what=what, interval_s=0.1, report=lambda: log.read_text()[-3000:])

    try:
        until(lambda: code_in("default") == 200, "qwen3 served in default")
        assert code_in("staging") == 404
        volume.publish("apiVersion: extender.io/v1alpha1\nkind: Policy\nprofiles: [{name: 7}]\n")  # invalid
        until(lambda: "keeping the last good policy" in log.read_text(), "the invalid edit reported")
        assert code_in("default") == 200  # the last good policy stays
        volume.publish(policy_text().replace("namespace: default", "namespace: staging"))
        until(lambda: code_in("staging") == 200, "qwen3 served in staging after the edit")
        assert code_in("default") == 404
    finally:
        stop(process, SETTLE_S)


@pytest.mark.integration
def test_an_api_only_scaler_measures_what_it_served(redis_server: RedisServer, tmp_path: Path) -> None:
    # the process as deployed (gunicorn, create_worker_app's wiring, the policy watch): the time of
    # the decision served, the "0" of a workload without one, no series for a name the policy does
    # not list, and a workload the edited policy drops leaves no time behind
    from prometheus_client.parser import text_string_to_metric_families

    from extender.state.decisions import DecisionStore, Published
    from tests.test_fault_reload import ConfigMapVolume

    client = connect(redis_server.url, tmp_path)
    store = DecisionStore(client)
    decided = Published(desired=3, load=11.0, unit="requests/s", t=1_735_732_790.0, window=15, token=1)
    client.hset(store.published_key, "qwen3", decided.encode())
    volume = ConfigMapVolume(tmp_path / "config")
    volume.publish(policy_text())
    port = free_port()
    log = tmp_path / "scale.log"
    process = api_only(volume.path, redis_server.url, port, log)
    base = f"http://127.0.0.1:{port}"

    def ask(namespace: str, workload: str) -> int:
        url = (f"{base}/apis/external.metrics.k8s.io/v1beta1/namespaces/{namespace}/extender-desired-replicas"
               f"?labelSelector=workload%3D{workload}")
        try:
            return get_json(url)[0]
        except (urllib.error.URLError, ConnectionError):
            return -1

    def served() -> dict[tuple[str, str, str], float]:
        """(sample, workload, state) -> value of the API's own families on its /metrics."""
        with urllib.request.urlopen(f"{base}/metrics", timeout=2) as r:
            text = r.read().decode()
        return {(s.name, s.labels["workload"], s.labels.get("state", "")): s.value
                for f in text_string_to_metric_families(text) for s in f.samples
                if s.name.startswith("extender_served_") and s.labels["api"] == "external-metrics"}

    def until(check: Any, what: str) -> None:
        def done() -> bool:
            assert process.poll() is None, log.read_text()[-3000:]
            return bool(check())

        wait_until(done, timeout_s=SETTLE_S, what=what, interval_s=0.1, report=lambda: log.read_text()[-3000:])

    counter = "extender_served_values_total"
    try:
        until(lambda: ask("default", "qwen3") == 200, "qwen3 served")
        assert [ask("ml", "llama"), ask("ml", "llama"), ask("default", "made-up")] == [200, 200, 404]
        assert served() == {
            ("extender_served_decision_timestamp_seconds", "qwen3", ""): decided.t,
            ("extender_served_decision_window_seconds", "qwen3", ""): 15.0,
            (counter, "qwen3", "decided"): 1.0, (counter, "qwen3", "undecided"): 0.0,
            (counter, "llama", "decided"): 0.0, (counter, "llama", "undecided"): 2.0,
        }
        volume.publish(policy_text().replace("name: qwen3", "name: qwen4"))
        until(lambda: ask("default", "qwen4") == 200, "the edited policy taken")
        assert {k: v for k, v in served().items() if k[1] != "llama"} == {
            (counter, "qwen3", "decided"): 1.0, (counter, "qwen3", "undecided"): 0.0,  # counters stay
            (counter, "qwen4", "decided"): 0.0, (counter, "qwen4", "undecided"): 1.0,
        }
    finally:
        stop(process, SETTLE_S)
        client.close()
