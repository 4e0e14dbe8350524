"""``429 Too Many Requests`` and ``Retry-After``: the wait the API server asks for is read and kept.

An API server under load answers the requests API Priority and Fairness (or the max-in-flight
filter) cannot seat with ``429`` and ``Retry-After: N`` (seconds), and puts ``N`` in the Status's
``details.retryAfterSeconds`` too. A reflector that retried sooner would only add to the load it
was turned away for. Through the official client over real HTTP, against the local API double:
the real API server cannot be made to throttle on demand.
"""

from __future__ import annotations

import threading
from typing import Any, NamedTuple

import pytest

from extender.core.backoff import Backoff
from extender.kube.client import KubeClient
from extender.kube.errors import MAX_RETRY_AFTER_S, KubeApiError
from extender.kube.reflector import Reflector
from tests.kube_double import KubeDouble
from tests.kube_double.waiting import wait_until

pytestmark = pytest.mark.integration


class Case(NamedTuple):
    name: str
    headers: dict[str, str]
    details: dict[str, Any]
    expected: float | None


CASES = [
    Case("header", {"Retry-After": "3"}, {}, 3.0),
    Case("details-only", {}, {"retryAfterSeconds": 2}, 2.0),
    Case("header-before-details", {"Retry-After": "4"}, {"retryAfterSeconds": 1}, 4.0),
    Case("zero", {"Retry-After": "0"}, {}, 0.0),
    Case("neither", {}, {}, None),
    Case("capped", {"Retry-After": "86400"}, {}, MAX_RETRY_AFTER_S),
    Case("http-date-passed", {"Retry-After": "Wed, 21 Oct 2015 07:28:00 GMT"}, {}, 0.0),
    # neither delay-seconds nor a date: the usual backoff applies
    Case("negative", {"Retry-After": "-1"}, {}, None),
    Case("fraction", {"Retry-After": "1.5"}, {}, None),
    Case("not-ascii-digit", {"Retry-After": "\u00b2"}, {}, None),
    Case("details-not-a-number", {}, {"retryAfterSeconds": "soon"}, None),
]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_the_wait_the_server_asked_for_is_on_the_error(double: KubeDouble, kube: KubeClient, case: Case) -> None:
    """A create: urllib3 never retries a POST, so every answer reaches the caller."""
    double.fail("create", "jobs", 429, headers=case.headers, details=case.details)
    with pytest.raises(KubeApiError, match=r"^creating job warm/j: 429 TooManyRequests") as raised:
        kube.create_job("warm", {"metadata": {"name": "j"}})
    assert raised.value.status == 429
    assert raised.value.retry_after_s == case.expected


def test_a_short_retry_after_is_waited_for_in_the_call(double: KubeDouble, kube: KubeClient) -> None:
    double.apply({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n0"}})
    double.fail("list", "nodes", 429, headers={"Retry-After": "0"})
    nodes, _ = kube.list("nodes")
    assert [n["metadata"]["name"] for n in nodes] == ["n0"]
    assert double.count("list", "nodes") == 2


def test_a_long_retry_after_ends_the_call_at_once(double: KubeDouble, kube: KubeClient) -> None:
    """urllib3 alone would sleep the 30 s, three times over, where no stop reaches it."""
    double.fail("list", "nodes", 429, headers={"Retry-After": "30"}, times=4)
    with pytest.raises(KubeApiError, match=r"^listing nodes: 429") as raised:
        kube.list("nodes")
    assert raised.value.retry_after_s == 30.0
    assert double.count("list", "nodes") == 1


class BackoffCase(NamedTuple):
    name: str
    at_least: float | None
    low: float
    high: float


BACKOFF_CASES = [
    BackoffCase("nothing-asked", None, 0.8, 1.2),  # initial 1 s, jitter 0.2
    BackoffCase("asked-less", 0.5, 0.8, 1.2),
    BackoffCase("asked-more", 7.0, 7.0, 7.0),
    BackoffCase("asked-past-the-cap", 60.0, 10.0, 10.0),
]


@pytest.mark.parametrize("case", BACKOFF_CASES, ids=[c.name for c in BACKOFF_CASES])
def test_a_backoff_waits_at_least_what_was_asked_up_to_its_cap(case: BackoffCase) -> None:
    backoff = Backoff(initial_s=1.0, max_s=10.0)
    assert case.low <= backoff.next(at_least=case.at_least) <= case.high
    assert backoff.failures == 1


class Recording(Backoff):
    """A backoff that notes what each retry was asked to wait at least, and waits a hundredth of a second."""

    def __init__(self) -> None:
        super().__init__()
        self.asked: list[float | None] = []

    def next(self, at_least: float | None = None) -> float:
        self.asked.append(at_least)
        super().next(at_least)
        return 0.01


def test_a_reflector_turned_away_waits_at_least_the_retry_after(double: KubeDouble, kube: KubeClient) -> None:
    double.apply({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n0"}})
    double.fail("list", "nodes", 429, headers={"Retry-After": "7"})
    double.fail("list", "nodes", 503)
    backoff = Recording()
    listed: list[int] = []
    reflector = Reflector(kube, "nodes", on_replace=lambda items: listed.append(len(list(items))),
                          on_event=lambda etype, obj: None, backoff=backoff)
    stop = threading.Event()
    thread = threading.Thread(target=reflector.run, args=(stop,))
    thread.start()
    try:
        wait_until(lambda: listed, what="the list after the refusals")
    finally:
        stop.set()
        reflector.interrupt()
        thread.join(30)
    assert listed == [1]
    assert backoff.asked == [7.0, None]  # the 429's wait, then plain backoff for the 503
