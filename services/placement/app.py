"""Placement wiring: the pure placement core on the reactor shell, nothing else."""

from libs.core.placement.decider import PlacementDecider
from libs.runtime.main import decider_main


def main() -> None:
    decider_main("placement", PlacementDecider)
