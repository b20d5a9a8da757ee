"""The multi-model cache's use counts (its `lfu` policy): counted, halved once a window of uses has passed, zeros
forgotten."""

from __future__ import annotations

from modelhost.core.eviction_policy import SMALLEST_WINDOW, WINDOW_PER_ENTRY, UseCounts


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
