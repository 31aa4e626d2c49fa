"""Placement: which nodes and GPUs a job with quota runs on.

decider.py wires the parts: state.py (what it knows), fold.py (one handler per event type), cycle.py (what a
trigger decides, in numbered steps), attempt.py (one job tried inside a cluster what-if), order.py (the orders
jobs are taken in), nomination.py and starvation.py (the holds), codes.py (its reason codes) and shortcuts.py
(answers remembered while nothing they depend on changed)."""
