"""Preemption: which running jobs are stopped for a job of higher priority, or to give a lender its quota back."""
