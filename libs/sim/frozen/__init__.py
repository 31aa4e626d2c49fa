"""The frozen net: what today's deciders decide on a broad, fixed set of inputs, recorded compactly
(tests/golden/frozen/<set>.json) so that a rewrite of the decision core can be checked for equivalence (the
same decisions, byte for byte), not only for determinism.

- digest.py: a run's log as a small, exact record (per deciding service: count, SHA-256, checkpoints);
- compare.py: a frozen record against a fresh one, with the first place they part;
- sets.py: the named sets of runs (scenario files, seeded sequences, Kueue and Philly slices, node health);
- sequences.py, node_health.py: the seeded world sequences those sets run;
- store.py: the frozen files.

`scripts/freeze_decisions.py` records and checks; tests/test_frozen_decisions.py checks every run."""
