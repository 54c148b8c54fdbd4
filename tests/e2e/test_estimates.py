"""Wait estimates that come true (issue 18), measured black-box: a short sale run by bench/estimate_sim.py
against the real processes (web, websockets, Celery worker and beat) of the test session's stack. Visitors
join in two bursts, a third of them walk away silently soon after joining, the rest stay, are admitted,
use the site and complete. The waits they were told at their joins are compared with the waits they had."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import estimate_sim  # noqa: E402

SALE = {
    "name": "test-short-sale",
    "policy": {
        "capacity": 100,
        "outflow_per_minute": 60,
        "burst": 3,
        "presence_timeout": 5,
        "claim_ttl": 12,
        "session_ttl": 600,
        "abandon_timeout": 60,
    },
    "arrivals": [{"at": 0, "count": 50, "over": 3}, {"at": 20, "count": 20, "over": 3}],
    "walk_away": {"share": 0.4, "after_seconds": [2, 10]},
    "service_seconds": [4, 12],
}


def test_a_short_sale_with_silent_walk_aways_is_told_waits_that_come_true(stack):
    product = estimate_sim.Product(stack.url, stack.manage)
    result = estimate_sim.run_scenario(product, SALE, seed=7)
    print(result)
    assert result["outcomes"].get("walked away", 0) >= 15  # the walk-aways the estimate must see through
    first, second = result["by_burst"]
    # The first burst was told its waits before anyone had walked away: nothing to go by but the record the
    # queue began from (the queue keeps what it learns for its next sale). The second joined once walk-aways
    # had shown: before this issue the estimate still counted every ticket ahead as one admission to wait
    # for, and told it about twice the wait it had (2.06 times at the median: error 106 %); with the share
    # found gone at the head, 1.25 (25 %); with walking away learnt as a rate, 0.98 and 1.00 in two runs
    # (errors 5 % and 3 %). Bounds with room for a noisy run.
    assert second["counted"] >= 8, result
    assert second["error_median"] <= 0.2, result
    assert 0.8 <= second["told_over_had_median"] <= 1.2, result
    assert first["counted"] >= 10 and result["within_range"] >= 0.6, result  # the range holds most waits
    # Every visitor's record is kept with the figures, and summarised again it gives the same figures.
    assert estimate_sim.summarise(estimate_sim.crowd_of(result))["error_median"] == result["error_median"]


def test_a_queue_s_next_sale_and_a_new_queue_are_told_their_first_waits_by_the_record_of_the_last(tmp_path):
    """A queue keeps its record across sales (walking away by time waited, how long slots are held, the
    range), and a new queue begins its record of walking away from the operator's other queues. On a product
    of its own, started as bin/run starts it (the session's stack has queues with records of their own):
    its first queue's first burst joins before anyone has walked away and is told the wait of the default
    crowd (a fifth walk away in their first 40 s); that queue's next sale, and a second queue's first sale,
    are told by the record of the first sale."""
    product, close = estimate_sim.own_product(tmp_path)
    try:
        first = estimate_sim.run_scenario(product, SALE, seed=11)
        later = estimate_sim.run_scenario(product, SALE, seed=12, slug=first["slug"])
        new = estimate_sim.run_scenario(product, SALE, seed=13, others=1)
    finally:
        close()
    print(first["by_burst"], later["by_burst"], new["by_burst"])
    assert first["sale"] == "first" and later["sale"] == "later" and later["slug"] == first["slug"]
    assert new["sale"] == "new" and new["slug"] != first["slug"]
    first_burst, first_burst_later, first_burst_new = (sale["by_burst"][0] for sale in (first, later, new))
    assert min(burst["counted"] for burst in (first_burst, first_burst_later, first_burst_new)) >= 10
    # 40 % walk away, more than the default's fifth, and it could not know: told more than its waits, and
    # less than the walk-free wait (1.20-1.36 of its waits when a first queue began from nobody walking
    # away; 1.13 with the default crowd).
    assert 1.0 <= first_burst["told_over_had_median"] <= 1.3, first
    for sale, burst in ((later, first_burst_later), (new, first_burst_new)):
        assert 0.8 <= burst["told_over_had_median"] <= 1.15, sale
    # the queue's own record of its first sale (a new queue's begins from it, scaled down to a few visitors)
    assert first_burst_later["error_median"] < first_burst["error_median"], later
