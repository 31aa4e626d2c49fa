"""Quota wiring: the pure quota core on the reactor shell; at start it brings the log's policy in line
with the operator's policy file (an audited input event per change)."""

from __future__ import annotations

import logging
import time

from libs.bus.jetstream import Bus
from libs.core.quota.decider import QuotaDecider
from libs.runtime.handler import DeciderHandler
from libs.runtime.main import service_main
from libs.runtime.policy_file import load_policy, policy_changes
from libs.runtime.reactor import Reactor
from libs.runtime.service import run_service
from libs.runtime.settings import Settings

log = logging.getLogger(__name__)


async def serve(settings: Settings) -> None:
    decider = QuotaDecider()
    wanted = load_policy(settings.policy_file)

    async def apply_policy_file(bus: Bus, reactor: Reactor) -> None:
        changes = policy_changes(decider.state.policy, wanted, version=await bus.last_seq(), now=time.time())
        await bus.publish(changes)
        log.info("policy %s: %d change(s) published", settings.policy_file, len(changes))

    await run_service(settings, DeciderHandler(decider), on_ready=apply_policy_file)


def main() -> None:
    service_main("quota", serve)
