"""A job trace and a cluster given as teams' shares, read for `gpusched sim trace`: pure reading and checking,
no scheduling.

Trace CSV, either of two headers:
- Philly's, as `../shared/data/philly/philly_pollux_jobs.csv` has it: `timestamp` (submit, "YYYY-MM-DD
  HH:MM:SS", UTC), `duration` (s), `num_gpus`, `gpu_time` (ignored: duration x num_gpus), `cluster` (the team,
  a virtual-cluster hash);
- a generic one: `submit` (a date-time as above, or seconds, read as a UNIX time), `runtime` (s), `gpus`,
  `team`.
Rows need not be in order: jobs are sorted by submit time (then row). A runtime under one second is read as
one second (the platform refuses a zero duration).

Teams CSV: nodes per team, either Helios's `vc,node num` (`helios_philly_vc.csv`) or `team,nodes`. `scale`
multiplies each team's node count, rounded up, at least one node.
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from libs.sim.trace_outcome import TraceJob

PHILLY_COLUMNS = ("timestamp", "duration", "num_gpus", "cluster")
GENERIC_COLUMNS = ("submit", "runtime", "gpus", "team")
TEAM_FORMATS = (("vc", "node num"), ("team", "nodes"))
MIN_RUNTIME_S = 1.0


class TraceError(ValueError):
    """A trace or teams file that cannot be read as one: the message says which and why."""


@dataclass(frozen=True, slots=True)
class Trace:
    """The jobs of a window, submit times from its start, and what was left out."""

    jobs: tuple[TraceJob, ...]
    start: float  # UNIX time of the window's start (submit_s 0)
    length_s: float  # the window's length: to --end (unless --limit cut it short), else to the last submission
    dropped_teams: dict[str, int]  # jobs of teams the teams file does not name, by team
    rows: int  # rows of the file (before window, teams and limit)


def parse_time(text: str, where: str) -> float:
    """A UNIX time from "YYYY-MM-DD[ HH:MM[:SS]]" (UTC) or a number of seconds."""
    text = text.strip()
    try:
        return float(text)
    except ValueError:
        pass
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise TraceError(f"{where}: bad time {text!r}: use YYYY-MM-DD[ HH:MM:SS] or seconds") from None
    return (moment if moment.tzinfo else moment.replace(tzinfo=UTC)).timestamp()


def _open_rows(path: Path, what: str) -> tuple[list[str], list[dict[str, str]]]:
    try:
        with path.open(newline="") as handle:
            reader = csv.DictReader(handle)
            rows = list(reader)
            header = [h.strip() for h in reader.fieldnames or []]
    except FileNotFoundError:
        raise TraceError(f"{what} file {path} not found") from None
    except IsADirectoryError:
        raise TraceError(f"{what} file {path} is a directory") from None
    except (UnicodeDecodeError, csv.Error) as err:
        raise TraceError(f"{what} file {path}: not a CSV file ({err})") from None
    return header, [{(k or "").strip(): (v or "") for k, v in row.items()} for row in rows]


def read_teams(path: Path, scale: float = 1.0) -> dict[str, int]:
    """Nodes per team, scaled (rounded up, at least 1)."""
    if not scale > 0:
        raise TraceError(f"--scale must be > 0, got {scale}")
    header, rows = _open_rows(path, "teams")
    columns = next((f for f in TEAM_FORMATS if all(c in header for c in f)), None)
    if columns is None:
        formats = " or ".join(",".join(f) for f in TEAM_FORMATS)
        raise TraceError(f"teams file {path}: unknown format (header {','.join(header)!r}); expected {formats}")
    team_col, nodes_col = columns
    teams: dict[str, int] = {}
    for line, row in enumerate(rows, start=2):
        team = row[team_col].strip()
        try:
            nodes = float(row[nodes_col])
        except ValueError:
            raise TraceError(f"teams file {path}:{line}: bad node count {row[nodes_col]!r}") from None
        if not team or nodes <= 0:
            raise TraceError(f"teams file {path}:{line}: a team needs a name and at least one node")
        if team in teams:
            raise TraceError(f"teams file {path}:{line}: team {team!r} listed twice")
        teams[team] = max(1, math.ceil(nodes * scale - 1e-9))
    if not teams:
        raise TraceError(f"teams file {path}: no teams")
    return teams


def read_trace(path: Path, teams: dict[str, int] | None = None, start: float | None = None,
               end: float | None = None, limit: int | None = None) -> Trace:
    """The jobs submitted in [start, end) (UNIX times; None: from the first / to past the last), of teams in
    `teams` (others dropped and counted; None: keep all), the first `limit` of them."""
    header, rows = _open_rows(path, "trace")
    if all(c in header for c in PHILLY_COLUMNS):
        cols = PHILLY_COLUMNS
    elif all(c in header for c in GENERIC_COLUMNS):
        cols = GENERIC_COLUMNS
    else:
        raise TraceError(f"trace file {path}: bad columns {','.join(header)!r}; expected "
                         f"{','.join(PHILLY_COLUMNS)} (Philly) or {','.join(GENERIC_COLUMNS)}")
    submit_col, runtime_col, gpus_col, team_col = cols
    parsed: list[tuple[float, int, float, int, str]] = []
    for line, row in enumerate(rows, start=2):
        where = f"trace file {path}:{line}"
        submit = parse_time(row[submit_col], where)
        try:
            runtime = float(row[runtime_col])
            gpus_f = float(row[gpus_col])
        except ValueError:
            raise TraceError(f"{where}: bad runtime or GPU count in {row!r}") from None
        if not (math.isfinite(runtime) and runtime >= 0 and gpus_f >= 1 and gpus_f == int(gpus_f)):
            raise TraceError(f"{where}: runtime must be >= 0 and GPUs a whole number >= 1, in {row!r}")
        parsed.append((submit, line, max(MIN_RUNTIME_S, runtime), int(gpus_f), row[team_col].strip()))
    parsed.sort()
    if start is not None and end is not None and end <= start:
        raise TraceError("--end must be after --start")
    window = [p for p in parsed if (start is None or p[0] >= start) and (end is None or p[0] < end)]
    if not window:
        raise TraceError(f"trace file {path}: no jobs submitted in the window" if parsed
                         else f"trace file {path}: no jobs")
    dropped: dict[str, int] = {}
    kept: list[tuple[float, int, float, int, str]] = []
    for p in window:
        if teams is not None and p[4] not in teams:
            dropped[p[4]] = dropped.get(p[4], 0) + 1
        else:
            kept.append(p)
    truncated = limit is not None and limit < len(kept)
    if limit is not None:
        kept = kept[:max(0, limit)]
    if not kept:
        raise TraceError(f"trace file {path}: no jobs of the teams file's teams in the window")
    origin = window[0][0] if start is None else start
    last = kept[-1][0]
    length = (end - origin) if end is not None and not truncated else max(1.0, last - origin)
    jobs = tuple(TraceJob(job_id=f"j{i:06d}", team=team, submit_s=submit - origin, runtime_s=runtime, gpus=gpus)
                 for i, (submit, _, runtime, gpus, team) in enumerate(kept))
    return Trace(jobs=jobs, start=origin, length_s=length, dropped_teams=dropped, rows=len(rows))
