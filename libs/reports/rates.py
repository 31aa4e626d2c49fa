"""What a GPU-hour costs, per GPU model: configuration, not part of the log, so finance can re-price
history without touching what was decided."""

from __future__ import annotations

import os
import tomllib
from pathlib import Path

import msgspec

from libs.runtime.settings import REPO_ROOT

DEFAULT_RATES = REPO_ROOT / "infra" / "config" / "rates.toml"


class RatesError(ValueError):
    pass


class Rates(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    currency: str = "USD"
    # Price of one GPU-hour per model; models not listed cost `default`.
    per_gpu_hour: dict[str, float] = {}
    default: float = 0.0

    def per_hour(self, model: str) -> float:
        return self.per_gpu_hour.get(model, self.default)

    def cost(self, model: str, gpu_seconds: float) -> float:
        return gpu_seconds / 3600.0 * self.per_hour(model)


def load_rates(path: Path | str | None = None) -> Rates:
    """Rates from `path`, else $GPUSCHED_RATES, else infra/config/rates.toml; a missing default file means
    no prices (every cost 0), a bad file is an error that names the problem."""
    explicit = path or os.environ.get("GPUSCHED_RATES")
    file = Path(explicit) if explicit else DEFAULT_RATES
    if not file.exists():
        if explicit:
            raise RatesError(f"rates file {file} not found")
        return Rates()
    try:
        rates = msgspec.convert(tomllib.loads(file.read_text()), Rates)
    except (tomllib.TOMLDecodeError, msgspec.ValidationError) as err:
        raise RatesError(f"{file}: {err}") from err
    bad = {m: r for m, r in rates.per_gpu_hour.items() if r < 0}
    if bad or rates.default < 0:
        raise RatesError(f"{file}: rates must not be negative ({bad or rates.default})")
    return rates
