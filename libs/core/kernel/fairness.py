"""The pieces of the fair order that are arithmetic, not bookkeeping: decayed usage, budget periods."""

from __future__ import annotations

import datetime as dt
import math
from dataclasses import dataclass

DAY_S = 86_400.0


def period_start(ts: float, period: str) -> float:
    """Start (UTC) of the budget period holding `ts`: calendar day, ISO week (Monday) or month."""
    day = math.floor(ts / DAY_S) * DAY_S
    if period == "day":
        return day
    if period == "week":
        # 1970-01-01 was a Thursday: days since the epoch + 3 counts from a Monday.
        days = int(day // DAY_S)
        return (days - (days + 3) % 7) * DAY_S
    date = dt.datetime.fromtimestamp(ts, tz=dt.UTC)
    return dt.datetime(date.year, date.month, 1, tzinfo=dt.UTC).timestamp()


@dataclass(slots=True)
class DecayedUsage:
    """An exponentially weighted average of a usage signal with a half-life (Slurm's decayed usage, as an
    average in GPUs rather than a sum of GPU-seconds, so it compares with a nominal quota)."""

    average: float = 0.0
    since: float = 0.0

    def value(self, current: float, now: float, half_life_s: float) -> float:
        if half_life_s <= 0 or now <= self.since:
            return self.average if half_life_s > 0 else 0.0
        keep = 0.5 ** ((now - self.since) / half_life_s)
        return self.average * keep + current * (1.0 - keep)

    def advance(self, current: float, now: float, half_life_s: float) -> None:
        """Fold the signal's value up to `now` (call before the signal changes)."""
        self.average = self.value(current, now, half_life_s)
        self.since = max(self.since, now)
