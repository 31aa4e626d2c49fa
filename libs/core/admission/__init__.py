"""Admission: a job is checked, refused with a specific code or accepted; idempotency keys; inference services."""
