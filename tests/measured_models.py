"""Stand-ins for loaded versions as the metrics read them: a name, a version, statistics, a queue depth."""

from __future__ import annotations

from dataclasses import dataclass, field

from modelhost.core.statistics import ModelStatistics


@dataclass
class QueueDepth:
    depth: int = 0

    def queued(self) -> int:
        return self.depth


@dataclass
class MeasuredVersion:
    name: str
    version: int
    statistics: ModelStatistics = field(default_factory=ModelStatistics)
    scheduler: QueueDepth = field(default_factory=QueueDepth)
