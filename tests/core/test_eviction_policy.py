"""The multi-model cache's eviction policy: its use counts (for `lfu`: counted, halved once a window of uses has
passed, zeros forgotten), and the victims it chooses."""

from __future__ import annotations

import random
from collections.abc import Callable

import pytest

from modelhost.core.cache_entry import CacheEntry
from modelhost.core.eviction_policy import POLICIES, SMALLEST_WINDOW, WINDOW_PER_ENTRY, EvictionPolicy, UseCounts


def test_uses_are_counted_per_key() -> None:
    counts = UseCounts()
    for key in ("a", "b", "a", "a"):
        counts.used(key, entries=2)
    assert (counts.count("a"), counts.count("b"), counts.count("never")) == (3, 1, 0)


def test_counts_halve_after_a_window_and_ones_are_forgotten() -> None:
    counts = UseCounts()
    for _ in range(9):
        counts.used("hot", entries=1)
    counts.used("once", entries=1)
    for _ in range(SMALLEST_WINDOW - 11):
        counts.used("filler", entries=1)
    assert counts.count("hot") == 9 and counts.count("once") == 1
    counts.used("filler", entries=1)  # the window's last use
    assert (counts.count("hot"), counts.count("once")) == (4, 0)
    assert len(counts) == 2  # "once" is gone, not kept at zero


def test_the_window_grows_with_the_entries_held() -> None:
    entries = 50
    counts = UseCounts()
    for _ in range(WINDOW_PER_ENTRY * entries - 1):
        counts.used("k", entries=entries)
    assert counts.count("k") == WINDOW_PER_ENTRY * entries - 1
    counts.used("k", entries=entries)
    assert counts.count("k") == WINDOW_PER_ENTRY * entries // 2


def _reference_victim(order: dict[str, CacheEntry], counts: UseCounts | None, key: str,
                      in_use: Callable[[CacheEntry], bool]) -> CacheEntry | None:
    """The policy as a pass over every entry in order of use (least recently used first): the specification."""
    best: CacheEntry | None = None
    best_count = 0
    awaited: CacheEntry | None = None
    for entry in order.values():
        if entry.key == key:
            continue
        count = counts.count(entry.key) if counts is not None else 0
        if best is not None and count >= best_count:
            continue
        if in_use(entry):
            continue
        if entry.first_run or entry.unused:
            awaited = awaited or entry
            continue
        best, best_count = entry, count
        if counts is None or count == 0:
            break
    return best or awaited


@pytest.mark.parametrize("name", POLICIES)
@pytest.mark.parametrize("seed", range(6))
def test_victims_are_those_a_pass_over_every_entry_chooses(name: str, seed: int) -> None:
    """Random charges, uses (enough for counts to halve), uncharges and flags; every victim compared with the
    reference's, evicted as the cache evicts it."""
    rng = random.Random(seed)
    policy = EvictionPolicy(name)
    counts = UseCounts() if name == "lfu" else None
    order: dict[str, CacheEntry] = {}
    busy: set[str] = set()
    keys = [f"m{i}" for i in range(40)]

    def in_use(entry: CacheEntry) -> bool:
        return entry.key in busy

    for step in range(6_000):
        roll = rng.random()
        idle = [k for k in keys if k not in order]
        if (roll < 0.1 or not order) and idle:
            entry = CacheEntry(rng.choice(idle), (), 1)
            order[entry.key] = entry
            policy.charged(entry.key)
        elif roll < 0.75 and order:
            used = rng.choice(list(order))
            order[used] = order.pop(used)
            policy.used(used, len(order))
            if counts is not None:
                counts.used(used, len(order))
        elif roll < 0.85 and order:
            entry = order[rng.choice(list(order))]
            flag = rng.choice(("first_run", "unused", "busy"))
            if flag == "busy":
                busy.symmetric_difference_update({entry.key})
            else:
                setattr(entry, flag, not getattr(entry, flag))
        else:
            loading = rng.choice(keys)
            expected = _reference_victim(order, counts, loading, in_use)
            assert policy.victim(order, loading, in_use) is expected, f"step {step}"
            if expected is not None and rng.random() < 0.7:
                del order[expected.key]
                policy.uncharged(expected.key)
    assert counts is None or counts.halvings > 0  # the run crossed a halving of the counts


def test_a_victim_is_found_without_passing_over_every_entry() -> None:
    """A thousand charged models, three in use: choosing a victim looks at those three and the victim, not at all."""
    policy = EvictionPolicy("lfu")
    order = {f"m{i}": CacheEntry(f"m{i}", (), 1) for i in range(1_000)}
    for key in order:
        policy.charged(key)
    for i, key in enumerate(order):
        for _ in range(1 + i % 7):
            policy.used(key, len(order))
    busy = {"m0", "m7", "m14"}  # the least used
    looked_at: list[str] = []

    def in_use(entry: CacheEntry) -> bool:
        looked_at.append(entry.key)
        return entry.key in busy

    assert policy.victim(order, "new", in_use) is order["m21"]
    assert sorted(looked_at) == ["m0", "m14", "m21", "m7"]
