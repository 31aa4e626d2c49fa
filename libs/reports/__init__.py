"""Reports computed from the log: GPU usage and cost per any grouping, and the capacity trend."""
