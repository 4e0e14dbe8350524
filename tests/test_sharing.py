"""extender.core.sharing: a fleet too small for every decision, shared by rounds and priority."""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

import pytest

from extender.core.errors import PolicyError
from extender.core.policy import parse_policy
from extender.core.sharing import Claim, share

ROOT = Path(__file__).resolve().parents[1]


class Row(NamedTuple):
    name: str
    claims: list[Claim]
    gpus: int
    want: dict[str, int]


def c(name: str, *, priority: int = 0, gpus: int = 1, minimum: int = 0, observed: int = 0, desired: int = 0) -> Claim:
    return Claim(name, priority, gpus, minimum, observed, desired)


ROWS = [
    Row("everything fits: every decision stands",
        [c("a", observed=2, desired=4), c("b", gpus=4, observed=1, desired=2)], 12, {"a": 4, "b": 2}),
    Row("a forecast never starves another's observed load, whatever the priority",
        # a (priority 9) forecasts 10 but observes 2; b observes 4: b's 4 come before a's forecast
        [c("a", priority=9, observed=2, desired=10), c("b", observed=4, desired=4)], 8, {"a": 4, "b": 4}),
    Row("observed needs that do not fit go by priority",
        [c("a", priority=1, observed=5, desired=5), c("b", observed=5, desired=5)], 6, {"a": 5, "b": 1}),
    Row("equal priority: shares of the round's target stay even",
        [c("a", observed=4, desired=4), c("b", observed=4, desired=4)], 4, {"a": 2, "b": 2}),
    Row("minimum replicas first",
        [c("a", priority=5, observed=8, desired=8), c("b", minimum=2, observed=0, desired=2)], 6, {"a": 4, "b": 2}),
    Row("a replica that does not fit drops out; a smaller one still gets the GPUs left",
        [c("big", gpus=8, observed=2, desired=2), c("small", observed=3, desired=3)], 11, {"big": 1, "small": 3}),
]


@pytest.mark.parametrize("row", ROWS, ids=[r.name for r in ROWS])
def test_share(row: Row) -> None:
    got = share(row.claims, row.gpus)
    assert got == row.want
    by_name = {cl.workload: cl for cl in row.claims}
    assert sum(n * by_name[w].gpus for w, n in got.items()) <= row.gpus
    assert all(got[w] <= by_name[w].desired for w in got)


def test_priority_out_of_range_is_a_policy_error_with_its_line() -> None:
    text = (ROOT / "scenarios/mixed-fleet-policy.yaml").read_text()
    anchor = "    capacity: {perReplica: 4, unit: requests/s}\n"
    line = text[: text.index(anchor)].count("\n") + 2
    with pytest.raises(PolicyError) as err:
        parse_policy(text.replace(anchor, anchor + "    priority: -1\n", 1), "p.yaml")
    (problem,) = err.value.problems
    assert (problem.line, problem.path) == (line, "profiles[0].priority")
    assert ">= 0" in problem.message
