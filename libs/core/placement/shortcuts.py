"""Placement's speed shortcuts, apart from the meaning: answers remembered while nothing they depend on changed.

- A request that did not fit does not fit for an identical request either (placement_shape) while the decider's
  generation stays. Within one pass over the waiting jobs a failure always stands; beyond it, only a pure one
  (its answer depended on the cluster alone), and only while the placer is consistent (a placement cache
  refreshed out of step would make the next try see another cluster).
- The starving job's shadow time depends on its request and on capacity, running jobs and policy, all of
  which bump the generation when they change: between such changes the last pure answer stands.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from contracts import JobSpec
from libs.core.cluster.shortfall import Shortfall

# (the starving job's shadow time, the running jobs that end by then); None: it could never fit.
ShadowAnswer = tuple[float, tuple[str, ...]] | None


@dataclass(slots=True)
class Shortcuts:
    # request shape -> (why it did not fit, the pass that found it (0: none), was the answer pure?)
    failed: dict[tuple[object, ...], tuple[Shortfall, int, bool]] = field(default_factory=dict)
    failed_generation: int = 0
    current_pass: int = 0  # the pass over the waiting jobs under way (0: none)
    passes: int = 0
    # The last pure shadow: ((generation, job, its spec), the answer).
    shadow: tuple[tuple[int, str, JobSpec], ShadowAnswer] | None = None

    def begin_pass(self) -> None:
        self.passes += 1
        self.current_pass = self.passes

    def end_pass(self) -> None:
        self.current_pass = 0

    def known_failure(self, shape: tuple[object, ...], generation: int, pure: Callable[[], bool]
                      ) -> Shortfall | None:
        """The failure an identical request met, if it still stands (see the module doc)."""
        if self.failed_generation != generation:
            self.failed.clear()
            self.failed_generation = generation
        known = self.failed.get(shape)
        if known is None:
            return None
        shortfall, found_in_pass, was_pure = known
        if (found_in_pass and found_in_pass == self.current_pass) or (was_pure and pure()):
            return shortfall
        return None

    def remember_failure(self, shape: tuple[object, ...], shortfall: Shortfall, pure: bool) -> None:
        self.failed[shape] = (shortfall, self.current_pass, pure)

    def known_shadow(self, key: tuple[int, str, JobSpec]) -> tuple[bool, ShadowAnswer]:
        """(is a shadow known for the key?, the answer known)."""
        if self.shadow is not None and self.shadow[0] == key:
            return True, self.shadow[1]
        return False, None

    def remember_shadow(self, key: tuple[int, str, JobSpec], answer: ShadowAnswer, pure: bool) -> None:
        self.shadow = (key, answer) if pure else None
