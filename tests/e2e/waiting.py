"""Polling the platform's API in end-to-end tests."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from typing import TypeVar

from libs.cli.client import ApiError

T = TypeVar("T")


def wait_for(check: Callable[[], T], what: str | Callable[[], str], timeout: float = 15.0, every: float = 0.1) -> T:
    """Poll until `check` returns something truthy (API errors count as not yet); `what` says what failed."""
    deadline = time.monotonic() + timeout
    while True:
        result: T | None = None
        with contextlib.suppress(ApiError):
            result = check()
        if result:
            return result
        assert time.monotonic() < deadline, what() if callable(what) else what
        time.sleep(every)
