"""What a backend probe prints: its objects as plain JSON values."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import msgspec


def plain(value: Any) -> Any:
    """JSON-ready: Structs and dataclasses as dicts with every field (defaults included), NaN as null."""
    if isinstance(value, msgspec.Struct):
        return {k: plain(v) for k, v in msgspec.structs.asdict(value).items()}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    if isinstance(value, float) and math.isnan(value):
        return None
    return value
