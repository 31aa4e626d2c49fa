"""Preemption wiring: the pure preemption core on the reactor shell, nothing else."""

from libs.core.preemption.decider import PreemptionDecider
from libs.runtime.main import decider_main


def main() -> None:
    decider_main("preemption", PreemptionDecider)
