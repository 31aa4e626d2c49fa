"""Accounting: GPU time, budgets and the books the read models need, folded from the log."""
