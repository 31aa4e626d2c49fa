"""Where a job's replicas fit: one replica at a time through the scoring policies, a gang all or nothing and
on one GPU model, with topology (one node, rack or block), spread across nodes, and MIG instances.

A gang's replicas work as one, so they run on GPUs of one model: the model its spec names (quota's flavor,
when quota reserved one, becomes the spec's model in placement), else of the models it may use the one that
fits it best: the least free capacity that could still hold every replica, then the model's name.

`Placer` keeps the array view and the fragmentation models of one Cluster; the placement service, the
preemption simulation and the FGD benchmark all place through it, so they agree by construction.
"""

from __future__ import annotations

from collections.abc import Iterable

import msgspec
import numpy as np

from contracts import JobSpec, ReplicaPlacement
from libs.core.cluster.arrays import ClusterArrays
from libs.core.cluster.device_groups import (
    GPUSCHED,
    GROUP_POLICIES,
    Demand,
    choose_in_groups,
    demand_by_model,
    uses_groups,
)
from libs.core.cluster.feasibility import Mask, Request, feasible_rows, node_hosts
from libs.core.cluster.fragmentation import FragModel, packing_shapes
from libs.core.cluster.mig_instance_fit import choose_mig, offers
from libs.core.cluster.model import Cluster
from libs.core.cluster.nodes import FULL, Node
from libs.core.cluster.score_cache import ScoreCache
from libs.core.cluster.scoring import DEFAULT_POLICY, POLICIES, Choice, choose
from libs.core.cluster.shapes import TypicalShapes, shared_pairing
from libs.core.cluster.shortfall import TOPOLOGY, Shortfall, explain_shortfall
from libs.core.kernel.accelerators import one_model
from libs.core.kernel.mig_profiles import instance_milli
from libs.core.kernel.policy import demand_milli

TOPOLOGY_LABELS = ("rack", "block")


def placement_shape(spec: JobSpec, policy: str) -> tuple[object, ...]:
    """Everything about a job that placement looks at: two jobs with the same shape fit or fail together."""
    return (policy, spec.replicas, spec.gpus, spec.gpu_milli, spec.gpu_memory_mib, spec.cpu_milli, spec.memory_mib,
            spec.gpu_models, spec.mig_profile, spec.rdma_nics, spec.topology, spec.topology_required, spec.spread,
            spec.priority)


class Placer:
    def __init__(self, cluster: Cluster, typical: TypicalShapes | None = None, score_cache: bool = True) -> None:
        self.cluster = cluster
        # FGD and packing scores per request shape, re-scored only where nodes changed (None: score afresh).
        self.scores = ScoreCache() if score_cache else None
        self.arrays = ClusterArrays(cluster)
        self.typical = typical
        # The fragmentation models, one per scoring policy that asked for one: FGD's (its typical shapes) and
        # packing's (with the scarce rare shapes and the multi-copy measure). Made on first use.
        self.frags: dict[str, FragModel] = {}
        # Bringing the models up to date is deferred until a replica is actually scored (most failed attempts
        # never need it): the rows refreshed since, and the policies that asked for their model meanwhile.
        # Folding them in later gives the same models, because the array rows do not change between refreshes.
        self._pending_rows: set[int] = set()
        self._pending_want: set[str] = set()
        # Rows refreshed outside a sync (gang domains, explanations): the models keep their older values
        # until they change again or are rebuilt, so until then they depend on more than the cluster now.
        self.stale: dict[str, set[int]] = {}
        self._demand: tuple[tuple[int, int], dict[str, Demand]] | None = None

    def set_typical(self, typical: TypicalShapes | None) -> None:
        self.typical = typical
        self.frags.clear()
        self._pending_rows.clear()
        self._pending_want.clear()
        self.stale.clear()

    def consistent(self) -> bool:
        """Are the fragmentation models (once synced) a function of the cluster's current state alone?"""
        return not any(self.stale.values())

    def _wants_frag(self, policy: str) -> bool:
        return self.typical is not None and bool(self.typical.shapes) and policy in ("fgd", "packing")

    def _refresh_for_sync(self, policy: str) -> None:
        """The arrays part of a sync, now; the models' part is pending until `_flush`."""
        rows = self.arrays.refresh()
        if rows:
            self._pending_rows.update(rows)
        if self._wants_frag(policy):
            self._pending_want.add(policy)

    def _flush(self) -> None:
        """Fold the pending syncs into the fragmentation models: as if each had updated them right away."""
        rows, want = self._pending_rows, self._pending_want
        if not rows and not want:
            return
        self._pending_rows, self._pending_want = set(), set()
        version = self.arrays.version
        for policy, frag in list(self.frags.items()):
            if frag.version != version:  # the nodes changed: made again when next asked for
                del self.frags[policy]
                self.stale.pop(policy, None)
            elif rows:
                frag.update(sorted(rows))
                self.stale[policy].difference_update(rows)
        for policy in sorted(want - self.frags.keys()):
            assert self.typical is not None
            if policy == "packing":
                model = FragModel(self.arrays, packing_shapes(self.typical, self.arrays), multi_copy=True,
                                  pairing=shared_pairing(self.typical))
            else:
                model = FragModel(self.arrays, self.typical)
            self.frags[policy] = model
            self.stale[policy] = set()

    def _frag(self, policy: str) -> FragModel | None:
        return self.frags.get(policy) if self._wants_frag(policy) else None

    def refresh_outside_sync(self) -> None:
        """Refresh the arrays without updating the fragmentation models for the rows that changed."""
        self._flush()
        rows = self.arrays.refresh()
        if rows:
            for policy, frag in self.frags.items():
                if frag.version == self.arrays.version:
                    self.stale.setdefault(policy, set()).update(rows)

    # --- one replica -------------------------------------------------------------------------------

    def place_replica(self, spec: JobSpec, replica: int, policy: str = DEFAULT_POLICY, salt: int = 0,
                      allowed: Mask | None = None) -> ReplicaPlacement | None:
        """Choose and allocate one replica; None when it fits nowhere (within `allowed` rows)."""
        if spec.mig_profile:
            return self._place_mig(spec, replica, allowed)
        # The models registered now decide the rule: the arrays brought up to date first (after a registration
        # they still list the models of before, and a first NPU job would be placed as GPUs are, across rings).
        rows = self.arrays.refresh()
        if rows:
            self._pending_rows.update(rows)
        if uses_groups(spec, self.arrays.models):
            return self._place_in_groups(spec, replica, policy, allowed)
        policy = policy if policy in POLICIES else DEFAULT_POLICY
        self._refresh_for_sync(policy)
        req = Request.of(spec)
        if self.scores is not None and allowed is None and self._wants_frag(policy):
            self._flush()
            frag = self._frag(policy)
            kept = None if frag is None else self.scores.scores(self.arrays, frag, req, policy, salt)
            if kept is not None:
                choice = kept.pick()
                return None if choice is None else self._allocate(spec, replica, choice, req)
        ok = feasible_rows(self.arrays, req, allowed)
        if not ok.any():
            return None  # fits nowhere: no need to score, nor to bring the fragmentation model up to date
        self._flush()
        choice = choose(self.arrays, self._frag(policy), req, policy, salt, allowed, ok)
        if choice is None:
            return None
        return self._allocate(spec, replica, choice, req)

    def _allocate(self, spec: JobSpec, replica: int, choice: Choice, req: Request) -> ReplicaPlacement:
        placement = self._placement(spec, replica, choice, req)
        self.cluster.allocate((placement,))
        return placement

    def _placement(self, spec: JobSpec, replica: int, choice: Choice, req: Request) -> ReplicaPlacement:
        node = self.arrays.nodes[choice.row]
        indices = tuple(node.gpus[j].index for j in choice.gpus)
        return ReplicaPlacement(
            replica=replica, node=node.name, gpu_indices=indices, gpu_milli=req.milli if indices else 0,
            gpu_memory_mib=spec.gpu_memory_mib if indices else 0, cpu_milli=spec.cpu_milli,
            memory_mib=spec.memory_mib, model=node.gpus[choice.gpus[0]].model if indices else "",
            rdma_nics=spec.rdma_nics)

    def _place_mig(self, spec: JobSpec, replica: int, allowed: Mask | None) -> ReplicaPlacement | None:
        """Best fit on MIG slices (mig_fit), over the nodes as they are now."""
        rows = self.arrays.refresh()  # the rows (and after a registration, the nodes) the cluster has now
        if rows:
            self._pending_rows.update(rows)
        nodes = self.arrays.nodes
        host = [(allowed is None or bool(allowed[i])) and node_hosts(n, spec) for i, n in enumerate(nodes)]
        choice = choose_mig(nodes, spec, host)
        if choice is None:
            return None
        placement = ReplicaPlacement(
            replica=replica, node=choice.node.name, gpu_indices=(choice.gpu.index,),
            gpu_milli=instance_milli(spec.mig_profile), gpu_memory_mib=choice.memory_mib, cpu_milli=spec.cpu_milli,
            memory_mib=spec.memory_mib, mig_slices=choice.slices, rdma_nics=spec.rdma_nics, model=choice.gpu.model)
        self.cluster.allocate((placement,))
        return placement

    def _place_in_groups(self, spec: JobSpec, replica: int, policy: str, allowed: Mask | None
                         ) -> ReplicaPlacement | None:
        """Whole NPUs inside their interconnect groups (device_groups), over the nodes as they are now (the
        arrays were brought up to date by place_replica)."""
        nodes = self.arrays.nodes
        with_models = self.arrays.model_mask_rows(tuple(spec.gpu_models))  # only these can hold it: asked first
        host = [with_models[i] and (allowed is None or bool(allowed[i])) and node_hosts(n, spec)
                for i, n in enumerate(nodes)]
        choice = choose_in_groups(nodes, spec, host, self._group_demand(),
                                  policy if policy in GROUP_POLICIES else GPUSCHED)
        if choice is None:
            return None
        placement = ReplicaPlacement(
            replica=replica, node=choice.node.name, gpu_indices=tuple(g.index for g in choice.devices),
            gpu_milli=FULL, gpu_memory_mib=spec.gpu_memory_mib, cpu_milli=spec.cpu_milli,
            memory_mib=spec.memory_mib, model=choice.devices[0].model, rdma_nics=spec.rdma_nics)
        self.cluster.allocate((placement,))
        return placement

    def _group_demand(self) -> dict[str, Demand]:
        """demand_by_model, kept until the typical shapes or the registered models change."""
        key = (id(self.typical), self.arrays.version)
        if self._demand is None or self._demand[0] != key:
            self._demand = (key, demand_by_model(self.typical, self.arrays.models))
        return self._demand[1]

    # --- a gang --------------------------------------------------------------------------------------

    def place_gang(self, spec: JobSpec, policy: str = DEFAULT_POLICY, salt: int = 0
                   ) -> tuple[ReplicaPlacement, ...] | Shortfall:
        """Place every replica or none: on failure the cluster is left exactly as it was."""
        placed = self._gang(spec, policy, salt)
        if placed is not None:
            return placed
        if spec.topology and spec.topology_required:
            return Shortfall(TOPOLOGY, f"no single {spec.topology} can host all {spec.replicas} replicas",
                             demand_milli(spec))
        return self.explain(spec)

    def _gang(self, spec: JobSpec, policy: str, salt: int) -> tuple[ReplicaPlacement, ...] | None:
        """place_gang without the explanation of a failure: None."""
        if spec.topology:
            for domain in self._domains(spec):
                placed = self._try_all(spec, policy, salt, domain)
                if placed is not None:
                    return placed
            if spec.topology_required:
                return None
        return self._try_all(spec, policy, salt, None)

    def _try_all(self, spec: JobSpec, policy: str, salt: int, allowed: Mask | None
                 ) -> tuple[ReplicaPlacement, ...] | None:
        """Every replica within `allowed` rows, on one GPU model, or None (the cluster left as it was)."""
        if not _needs_one_model(spec):
            return self._try_replicas(spec, policy, salt, allowed)
        for model in self._gang_models(spec, policy, allowed):
            placed = self._try_replicas(msgspec.structs.replace(spec, gpu_models=(model,)), policy, salt, allowed)
            if placed is not None:
                return placed
        return None

    def _gang_models(self, spec: JobSpec, policy: str, allowed: Mask | None) -> list[str]:
        """The GPU models a gang may take that could hold all its replicas within `allowed` rows by their free
        capacity (whole GPUs idle, shares, MIG slices), best fit first: the least free, then the name."""
        # The arrays brought up to date as placing the first replica does (place_replica, _place_mig).
        if spec.mig_profile:
            rows = self.arrays.refresh()
            if rows:
                self._pending_rows.update(rows)
            return _mig_models(self.arrays.nodes, spec, allowed)
        self._refresh_for_sync(policy if policy in POLICIES else DEFAULT_POLICY)
        a = self.arrays
        req = Request.of(spec)
        usable = (a.free >= 0) & a.online[:, None]
        if allowed is not None:
            usable &= allowed[:, None]
        free = np.where(usable, np.minimum(a.free, FULL), 0)
        slots = free // req.milli  # how many of the request's GPUs each GPU could take by its share
        ranked = []
        for model_id in a.model_ids(tuple(spec.gpu_models)):
            mine = a.gpu_model == model_id
            if int(slots[mine].sum()) >= spec.replicas * req.gpus:
                ranked.append((int(free[mine].sum()), a.models[model_id]))
        return [model for _, model in sorted(ranked)]

    def _try_replicas(self, spec: JobSpec, policy: str, salt: int, allowed: Mask | None
                      ) -> tuple[ReplicaPlacement, ...] | None:
        if spec.replicas == 1:  # nothing to undo when the one replica fits nowhere
            placement = self.place_replica(spec, 0, policy, salt, allowed.copy() if allowed is not None else None)
            return None if placement is None else (placement,)
        placed: list[ReplicaPlacement] = []
        mask = allowed.copy() if allowed is not None else None
        with self.cluster.what_if() as attempt:  # all or nothing: a replica that fits nowhere undoes the others
            for replica in range(spec.replicas):
                placement = self.place_replica(spec, replica, policy, salt, mask)
                if placement is None:
                    return None
                placed.append(placement)
                if spec.spread:
                    if mask is None:
                        mask = np.ones(len(self.arrays.nodes), dtype=bool)
                    mask[self.arrays.index[placement.node]] = False
            attempt.keep()
        return tuple(placed)

    def place_apart(self, spec: JobSpec, avoid: Iterable[str], policy: str = DEFAULT_POLICY, salt: int = 0
                    ) -> tuple[ReplicaPlacement, ...] | None:
        """Place away from the nodes `avoid` (a service's other replicas): first off their racks (where nodes
        carry rack labels), then off the nodes themselves; None when neither fits (the caller may then place
        anywhere: spreading is a preference)."""
        self._refresh_for_sync(policy)
        nodes = self.arrays.nodes
        used = {self.arrays.index[n] for n in avoid if n in self.arrays.index}
        if not used:
            return None
        racks = {nodes[i].labels.get("rack", "") for i in used} - {""}
        off_nodes = np.ones(len(nodes), dtype=bool)
        off_nodes[sorted(used)] = False
        masks = [off_nodes]
        if racks:
            masks.insert(0, np.array([n.labels.get("rack", "") not in racks for n in nodes], dtype=bool))
        for mask in masks:
            if mask.any():
                placed = self._try_all(spec, policy, salt, mask)
                if placed is not None:
                    return placed
        return None

    def _domains(self, spec: JobSpec) -> list[Mask]:
        """Candidate domains for a gang, fullest first (best fit), each as a row mask."""
        self.refresh_outside_sync()
        nodes = self.arrays.nodes
        if spec.topology == "node":
            keys = [n.name for n in nodes]
        elif spec.topology in TOPOLOGY_LABELS:
            keys = [n.labels.get(spec.topology, "") for n in nodes]
        else:
            return []
        idle = self.arrays.idle_share()
        totals: dict[str, int] = {}
        for key, share in zip(keys, idle.tolist(), strict=True):
            if key:
                totals[key] = totals.get(key, 0) + share
        order = sorted(totals, key=lambda k: (totals[k], k))
        key_array = np.array(keys, dtype=object)
        return [key_array == k for k in order if totals[k] >= demand_milli(spec) or spec.mig_profile]

    def fits(self, spec: JobSpec) -> bool:
        """Would the job fit now? Leaves the cluster unchanged (a what-if)."""
        with self.cluster.what_if():
            if self.cluster.placer is self and self.typical is not None and self.typical.shapes:
                # Explaining a failure refreshes this very placer's arrays (see explain_shortfall), which its
                # fragmentation model would notice: keep doing it, so that the model stays as it always was.
                return not isinstance(self.place_gang(spec), Shortfall)
            return self._gang(spec, DEFAULT_POLICY, 0) is not None

    def explain(self, spec: JobSpec) -> Shortfall:
        return explain_shortfall(placer_for(self.cluster), spec)


def _needs_one_model(spec: JobSpec) -> bool:
    """Is the job a gang taking GPUs without naming the one model they must be of?"""
    return (spec.replicas > 1 and not one_model(spec.gpu_models)
            and (spec.gpus > 0 or spec.gpu_milli > 0 or bool(spec.mig_profile)))


def _mig_models(nodes: list[Node], spec: JobSpec, allowed: Mask | None) -> list[str]:
    """_gang_models for MIG instances: the models whose free compute slices, on GPUs that offer the profile
    and take MIG now, could hold an instance per replica; the fewest free slices first, then the name."""
    free: dict[str, int] = {}
    slots: dict[str, int] = {}
    for i, node in enumerate(nodes):
        if not node.online or (allowed is not None and not allowed[i]):
            continue
        for g in node.gpus:
            if not (offers(g, spec) and g.takes_mig and g.mig_product is not None):
                continue
            profile = g.mig_product.profile(spec.mig_profile)
            assert profile is not None  # offers() said so
            free[g.model] = free.get(g.model, 0) + g.free_slices
            slots[g.model] = slots.get(g.model, 0) + g.free_slices // profile.slices
    return sorted((m for m in free if slots[m] >= spec.replicas), key=lambda m: (free[m], m))




def placer_for(cluster: Cluster) -> Placer:
    """The Placer of a cluster (one per cluster, created on first use)."""
    placer = cluster.placer
    if not isinstance(placer, Placer):
        placer = cluster.placer = Placer(cluster)
    return placer


def place_gang(cluster: Cluster, spec: JobSpec, policy: str = DEFAULT_POLICY, salt: int = 0
               ) -> tuple[ReplicaPlacement, ...] | Shortfall:
    return placer_for(cluster).place_gang(spec, policy, salt)


def place_replica(cluster: Cluster, spec: JobSpec, replica: int) -> ReplicaPlacement | None:
    return placer_for(cluster).place_replica(spec, replica)


def fits(cluster: Cluster, spec: JobSpec) -> bool:
    return placer_for(cluster).fits(spec)
