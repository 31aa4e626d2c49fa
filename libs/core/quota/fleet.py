"""Which GPU models the cluster has, as quota sees it: the healthy GPUs of each model on the registered nodes
not cordoned (libs/core/kernel/usable_flavors.py ModelCounts, whose rule of the flavors a job can use the
preemption decider applies too).

Quota does not place; it only needs to know whether a flavor could ever be served, so that a job allowed
several models does not take quota of a model no node has (its reservation would time out again and again
while quota of a model the cluster has sits idle), and whether the present nodes could hold a job at all, were
every running job gone (the starvation rule, libs/core/kernel/starvation.py: a job they could not hold is no starving
job, and holds nobody in quota). That second answer comes from placement's own fit (libs/core/cluster/job_fit.py) on an
empty copy of the inventory (EmptyInventory of libs/core/cluster/starving_room.py, the one placement asks too):
the registered nodes, those lost or cordoned (out of placement, so they would not take it either) and unhealthy
GPUs kept out as placement keeps them out.
"""

from __future__ import annotations

import msgspec

from contracts import EventBase, JobSpec
from libs.core.cluster.starving_room import EmptyInventory
from libs.core.kernel.quota_math import ANY
from libs.core.kernel.usable_flavors import MODEL_EVENTS, ModelCounts


class Fleet(ModelCounts):
    def __init__(self) -> None:
        super().__init__()
        # The present nodes with nothing on them: could they hold a job with every running job gone?
        self.inventory = EmptyInventory()

    def fold(self, event: EventBase) -> None:
        if isinstance(event, MODEL_EVENTS):
            self.inventory.fold(event)
        super().fold(event)

    def could_place(self, flavors: tuple[str, ...], spec: JobSpec) -> bool:
        """Could the present nodes hold the job, with every running job gone, under one of `flavors` (quota of a
        model's flavor runs the job on that model)? Asked by placement's fit; kept until the inventory changes.
        Before any node has registered the inventory is not known (quota alone, as in a test of its rules): it could."""
        if not self.inventory.cluster.nodes:
            return True
        for flavor in flavors:
            narrowed = spec if flavor == ANY or spec.gpu_models == (flavor,) else msgspec.structs.replace(
                spec, gpu_models=(flavor,))
            if self.inventory.could_hold(narrowed):
                return True
        return False
