"""Several servers' repository indexes as one (Ray Serve's replicas): each version in the most a server says of it."""

from __future__ import annotations

from modelhost.core.control import merged_index
from modelhost.core.model_record import IndexEntry


def test_a_version_takes_the_state_of_the_server_that_says_most_of_it() -> None:
    first = [IndexEntry("a", "1", "READY", ""), IndexEntry("b", "1", "UNAVAILABLE", "unloaded"),
             IndexEntry("c", "", "", ""), IndexEntry("d", "", "", "")]
    second = [IndexEntry("a", "1", "UNAVAILABLE", "unloaded"), IndexEntry("a", "2", "LOADING", ""),
              IndexEntry("b", "", "", ""), IndexEntry("c", "10", "READY", ""), IndexEntry("c", "9", "READY", ""),
              IndexEntry("d", "", "", "")]
    assert merged_index([first, second]) == [
        IndexEntry("a", "1", "READY", ""), IndexEntry("a", "2", "LOADING", ""),
        IndexEntry("b", "1", "UNAVAILABLE", "unloaded"),  # a version known anywhere hides the name-only entry
        IndexEntry("c", "9", "READY", ""), IndexEntry("c", "10", "READY", ""),
        IndexEntry("d", "", "", "")]
    assert merged_index([second, first]) == merged_index([first, second])
    assert merged_index([[], first]) == sorted(first, key=lambda e: e.name)
