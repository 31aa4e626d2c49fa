"""Times, sizes and CPU counts as users write them on a command line, for `gpusched submit`.

Times follow Slurm, whose `--time` most GPU users know: `M`, `M:S`, `H:M:S`, `D-H`, `D-H:M`, `D-H:M:S`; and
unit suffixes (`90s`, `30m`, `2h`, `1d`, `1h30m`). A bare number is minutes for a limit (`--time`, as Slurm) but
seconds for an estimate or an interval (what `--duration 5` always meant here). Sizes are binary, as Slurm's
`--mem`: `20G`, `20Gi` and `20GiB` are all 20 GiB; a bare number is MiB.
"""

from __future__ import annotations

import argparse
import math
import re
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

_UNIT_S = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_UNITS = re.compile(r"(\d+(?:\.\d+)?)\s*([smhd])", re.IGNORECASE)
_NUMBER = re.compile(r"\d+(?:\.\d+)?")
_SIZE = re.compile(r"(\d+(?:\.\d+)?)\s*(?:([kmgtp])(?:ib?|b)?)?", re.IGNORECASE)
_MIB_PER = {None: 1.0, "k": 1 / 1024, "m": 1.0, "g": 1024.0, "t": 1024.0**2, "p": 1024.0**3}


def _clock(text: str) -> float | None:
    """Slurm's forms with a colon or a dash, in seconds; None when `text` is none of them."""
    days = 0
    rest = text
    if "-" in text:
        head, _, rest = text.partition("-")
        if not head.isdigit():
            return None
        days = int(head)
    parts = rest.split(":")
    if len(parts) > 3 or not all(p.isdigit() for p in parts):
        return None
    values = [int(p) for p in parts]
    if "-" in text:  # D-H, D-H:M, D-H:M:S
        h, m, s = [*values, 0, 0][:3]
    elif len(values) == 3:  # H:M:S
        h, m, s = values
    elif len(values) == 2:  # M:S
        h, (m, s) = 0, values
    else:
        return None  # a bare number: its unit depends on the flag
    return float(days * 86400 + h * 3600 + m * 60 + s)


def parse_seconds(text: str, bare_unit_s: float = 1.0) -> float:
    """A time in seconds; a bare number counts `bare_unit_s` seconds each. Raises ValueError."""
    value = text.strip()
    if _NUMBER.fullmatch(value):
        seconds = float(value) * bare_unit_s
    elif (clock := _clock(value)) is not None:
        seconds = clock
    elif _UNITS.sub("", value).strip() == "" and _UNITS.search(value):
        seconds = sum(float(n) * _UNIT_S[u.lower()] for n, u in _UNITS.findall(value))
    else:
        raise ValueError(f"{text!r} is not a time: write seconds or minutes as the flag says, 90s, 30m, 2h, 1d, "
                         "1h30m, MM:SS, HH:MM:SS or D-HH:MM:SS")
    if seconds <= 0:
        raise ValueError(f"{text!r}: a time must be more than zero")
    return seconds


def time_limit(text: str) -> float:
    """`--time`, Slurm's way: a bare number is minutes."""
    return _arg(parse_seconds, text, 60.0)


def seconds(text: str) -> float:
    """An estimate or an interval: a bare number is seconds."""
    return _arg(parse_seconds, text, 1.0)


def parse_mib(text: str) -> int:
    """A size in MiB, rounded up: `512`, `512Mi`, `20G`, `20Gi`, `20GiB`, `1.5T`. Raises ValueError."""
    match = _SIZE.fullmatch(text.strip())
    if match is None:
        raise ValueError(f"{text!r} is not a size: write MiB, or a number with K, M, G or T (binary: G = Gi = GiB)")
    number, unit = float(match.group(1)), match.group(2)
    return math.ceil(number * _MIB_PER[unit.lower() if unit else None])


def mib(text: str) -> int:
    return _arg(parse_mib, text)


def cpu_milli(text: str) -> int:
    """CPUs as Kubernetes writes them: `2`, `0.5` or `500m`, in thousandths of a CPU."""
    value = text.strip()
    try:
        if value.endswith("m"):
            return int(value[:-1])
        return round(float(value) * 1000)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a CPU count: write 2, 0.5 or 500m") from None


def label(text: str) -> tuple[str, str]:
    """`key=value`."""
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"{text!r} is not a label: write key=value")
    return key, value


def _arg(parse: Callable[..., T], text: str, *more: float) -> T:
    """The parser's value, its ValueError as argparse's error for the flag."""
    try:
        return parse(text, *more)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None
