"""The kernel every decider stands on: the decider protocol and derived ids, which run is current, policy and
quota arithmetic, retries, and the rules several deciders apply (starvation and backfill, attained service)."""
