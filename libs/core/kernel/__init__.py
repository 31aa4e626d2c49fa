"""The kernel every decider stands on: the decider protocol and derived ids, which run is current, policy, queue
limits and quota arithmetic, retries, and the rules several deciders apply (the wait reason codes, the nomination's
lapse, starvation and backfill, attained service)."""
