"""Flavors as names: a flavor is a GPU model's quota ("*", ANY: quota of any model). How a flavor is named in
events, which jobs may use it, which model a reservation is for, and which of a queue's flavors a reservation
is charged to when its queue's flavors change. The quota book (quota_math.py) and every fold of reservations
ask these."""

from __future__ import annotations

from contracts import JobSpec
from libs.core.kernel.accelerators import model_matches, one_model
from libs.core.kernel.queue_limits import ANY, Limits


def flavor_name(model: str) -> str:
    """The flavor as events carry it: "" for any model."""
    return "" if model == ANY else model


def flavor_matches(flavor: str, spec: JobSpec) -> bool:
    return flavor == ANY or model_matches(spec.gpu_models, flavor)


def reservation_model(flavor: str, placed_model: str, spec: JobSpec | None) -> str:
    """The GPU model a reservation is for: the model its job was placed on, else its flavor's model, else the
    one model the job asks for; "" when unknown (any model)."""
    if placed_model:
        return placed_model
    if flavor != ANY:
        return flavor
    return one_model(spec.gpu_models) if spec is not None else ""


def charged_flavor(limits: dict[str, Limits], flavor: str, model: str) -> str:
    """The flavor a reservation charged to `flavor`, for GPU model `model` ("" unknown), is charged to under its
    queue's current flavors (`limits`): its own while the queue still has it; else the flavor of its model,
    else "*" (it covers every model); else, no flavor covering it, where it is (it still binds there)."""
    if flavor in limits:
        return flavor
    if model and model in limits:
        return model
    return ANY if ANY in limits else flavor
