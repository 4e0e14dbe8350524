"""The ``scrape`` source end to end: pods discovered through the Kubernetes API double, scraped over HTTP.

Each "pod" is a vLLM-format endpoint on its own loopback address (127.0.0.2, 127.0.0.3) and one shared
port, as pods of a Deployment share a container port. The official client lists them from the API
double with the profile's label selector; counters are set by the test and the clock is passed in,
so rates are exact.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from extender.kube.client import KubeClient
from extender.scaler.pods import count_replicas, label_selector, workload_pods
from extender.scaler.scrape import ScrapeSource
from extender.scaler.serve import KubePodLister
from tests.kube_double import KubeDouble
from tests.scaler_policy import make_policy
from tests.vllm_endpoint import Counters, MetricsEndpoint, pod, serving

pytestmark = pytest.mark.integration

T0 = 1_735_689_600.0


@pytest.fixture
def double() -> Iterator[KubeDouble]:
    with KubeDouble.running() as d:
        yield d


@pytest.fixture
def endpoints() -> Iterator[list[MetricsEndpoint]]:
    with serving(("127.0.0.2", "127.0.0.3")) as eps:
        yield eps


def test_scrape_through_the_api_double(double: KubeDouble, endpoints: list[MetricsEndpoint], tmp_path: Path) -> None:
    port = endpoints[0].port
    profile = make_policy(port=port).profile("qwen3")
    double.apply(pod("qwen3-a", "127.0.0.2"))
    double.apply(pod("qwen3-b", "127.0.0.3"))
    double.apply(pod("qwen3-c", "", ready=False, phase="Pending"))  # starting: counted, not scraped
    double.apply(pod("other", "127.0.0.4", labels={"extender.io/workload": "llama"}))
    client = KubeClient.connect(str(double.write_kubeconfig(tmp_path / "kubeconfig")))
    try:
        lister = KubePodLister(client)
        source = ScrapeSource.for_profile(profile)

        def observe(now: float) -> tuple[float | None, bool, float]:
            pods = workload_pods(lister.list_pods(label_selector(profile)), profile, "default")
            assert count_replicas(pods).__dict__ == {"ready": 2, "starting": 1}
            obs = source.observe(pods, now)
            return obs.rate, obs.complete, obs.queue

        endpoints[0].counters, endpoints[1].counters = Counters(requests=1000), Counters(requests=500)
        assert observe(T0) == (None, False, 0.0)
        endpoints[0].counters = Counters(requests=1150, waiting=2)
        endpoints[1].counters = Counters(requests=530, waiting=1)
        # (1150 - 1000) / 15 + (530 - 500) / 15 = 10 + 2
        rate, complete, queue = observe(T0 + 15)
        assert rate == pytest.approx(12.0)
        assert (complete, queue) == (True, 3.0)
        endpoints[1].fail_next = 1
        endpoints[0].counters = Counters(requests=1300)
        rate, complete, _ = observe(T0 + 30)
        assert rate == pytest.approx(10.0)
        assert not complete  # b failed: a lower bound
        endpoints[1].counters = Counters(requests=590)
        endpoints[0].counters = Counters(requests=1450)
        rate, complete, _ = observe(T0 + 45)
        assert rate == pytest.approx(10.0 + 2.0)  # b over its 30 s: 60 / 30
        assert complete
        assert all(ep.scrapes == 4 for ep in endpoints)
    finally:
        client.close()
    # the scaler listed pods with the profile's selector, in one call per tick
    assert double.count("list", "pods") == 4
