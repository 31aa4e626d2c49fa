"""Quota: which waiting job gets quota, in which flavor, borrowing and lending within the cohort."""
