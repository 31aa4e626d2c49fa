"""The cluster model: nodes and GPUs as placement sees them, and where a job fits (scoring, shapes, MIG)."""
