"""What a job may ask of accelerators whatever the cluster holds: the kinds and vendors its models name, and
the device counts and sharing those models allow (libs/core/kernel/accelerators.py holds each model's rules).

- A model entry "KIND:*" must name a known kind ("gpu:*", "npu:*").
- Models of two vendors in one job are refused (`mixed_vendors`) unless the job says `mixed_vendors`: CUDA code
  does not run on an NPU nor CANN code on a GPU, so a job that may run on both must say its code does. Such a
  job still runs all its replicas on one model (a gang never spans models), whichever vendor has room.
- A MIG profile splits an NVIDIA GPU and a vNPU template ("vir04") an Ascend NPU: a job asking one must be able
  to run on that kind. An NPU is shared by templates only, never by a fraction (`gpu_milli`).
- A whole-device count no model of the job allows on one server (3 Ascend 910 NPUs: a server gives 1, 2, 4 or
  8) is refused (`device_count_not_allowed`), as no placement could ever give it.
"""

from __future__ import annotations

from contracts import JobSpec
from libs.core.admission.rejection import Rejection
from libs.core.kernel.accelerators import (
    GPU,
    KINDS,
    NPU,
    accelerator,
    count_fits_server,
    is_pattern,
    kinds_named,
    vendors_named,
    wildcard_kind,
)
from libs.core.kernel.mig_profiles import is_vnpu


def accelerator_problem(spec: JobSpec) -> Rejection | None:
    """Why the job's ask of accelerators can never be served; None when it can."""
    for entry in spec.gpu_models:
        kind = wildcard_kind(entry)
        if kind is not None and kind not in KINDS:
            return Rejection("unknown_accelerator_kind", f"{entry!r} names no kind of accelerator "
                             f"(one of {', '.join(k + ':*' for k in KINDS)})")
    vendors = vendors_named(spec.gpu_models)
    if len(vendors) > 1 and not spec.mixed_vendors:
        return Rejection("mixed_vendors", f"models {', '.join(spec.gpu_models)} are of {' and '.join(sorted(vendors))}"
                         ": say mixed_vendors if the job's code runs on both (it still runs on one model)")
    kinds = kinds_named(spec.gpu_models)
    if spec.mig_profile:
        split_kind, split = (NPU, "vNPU template") if is_vnpu(spec.mig_profile) else (GPU, "MIG profile")
        if split_kind not in kinds:
            return Rejection("split_of_another_kind", f"{split} {spec.mig_profile!r} splits an "
                             f"{split_kind.upper()}; the job's models ({', '.join(spec.gpu_models) or 'any GPU'}) "
                             f"name no {split_kind.upper()}")
    if spec.gpu_milli > 0 and GPU not in kinds:
        return Rejection("fraction_of_npu", "an NPU is shared by vNPU templates (mig_profile: vir02, vir04, ...), "
                         "not by a fraction: ask a template or whole NPUs")
    return _count_problem(spec)


def _count_problem(spec: JobSpec) -> Rejection | None:
    named = [m for m in spec.gpu_models if not is_pattern(m)]
    if spec.gpu_milli > 0 or spec.mig_profile or not named or len(named) != len(spec.gpu_models):
        return None
    if any(count_fits_server(m, spec.gpus) for m in named):
        return None
    allowed = "; ".join(f"{m}: {', '.join(map(str, accelerator(m).counts_per_server))}" for m in named)
    return Rejection("device_count_not_allowed", f"a server gives one replica {allowed} devices, "
                     f"not {spec.gpus}: ask for one of those counts per replica")
