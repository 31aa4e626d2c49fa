"""Preemption: which running jobs are stopped for a job of higher priority, or to give a lender its quota back.

The package, in reading order (decider.py says what it decides and why):
  - state.py: what the decider knows, as data (the World: jobs running and waiting, policy, cluster, retries);
  - fold.py: one handler per event type, folding it into the World, deciding nothing;
  - cycle.py: the cycle, in numbered steps: which waiting job to consider, its victims, the decision;
  - tick_jobs.py: which waiting jobs a clock tick looks at again;
  - candidates.py: who may be a victim; ordering.py: the order victims are tried in;
  - reclaim.py: taking back the quota (and GPUs) a cohort lent; victim_sets.py: the least harmful victim set;
  - simulation.py: the what-if that judges a victim set by quota's and placement's rules, on the decider's own
    book and cluster inside their what-ifs (QuotaBook.what_if, Cluster.what_if), which roll every change back;
  - shortcuts.py: speed shortcuts, apart from the meaning; decider.py: the thin class that wires them.
"""
