"""Where the checkout is: a module of its own so that a command needing only that imports nothing else."""

from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
