"""Why a submission is refused: a code a program can act on and a message a person can."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Rejection:
    code: str
    message: str
