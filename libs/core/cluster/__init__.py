"""The cluster model: nodes and GPUs as placement sees them (model.py, with its what-ifs), and where a job fits:
feasibility.py (where it could go at all), scoring.py and fragmentation.py (where it goes best), job_fit.py (a
gang all or nothing), shortfall.py (why it does not fit), MIG instances, request shapes and their caches."""
