"""Placement: which nodes and GPUs a job with quota runs on."""
