"""The cluster as integer arrays, one row per node, for vectorised scoring (numpy, integers only, so that
every machine computes the same scores). Rows follow the Cluster's node order and are refreshed lazily,
only for the nodes whose capacity changed.

Free GPU memory is the Cluster's, which charges a fraction declaring no memory its share of the GPU's memory;
a request of such a fraction needs that share free (`share_memory`, `fraction_room`)."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from libs.core.cluster.model import Cluster
from libs.core.cluster.nodes import FULL, Node
from libs.core.kernel.accelerators import GPU, kind_of, model_matches

I64 = npt.NDArray[np.int64]
# Padding, unhealthy GPUs and GPUs serving MIG (MIG-enabled, or holding MIG instances still): never a candidate
# for a share, never idle share.
UNUSABLE = -1
# Up to this many nodes, row-by-row questions are answered in plain Python (numpy's cost per call dominates).
FEW_NODES = 64
# Change logs (rows in the order they changed, for caches that catch up from them) are cleared past this
# length; the epoch tells a cache that read an older log to start afresh.
LOG_LIMIT = 1 << 16


class ChangeLog:
    """The rows a table changed, in order; readers remember (epoch, position) and read on from there."""

    def __init__(self) -> None:
        self.rows: list[int] = []
        self.epoch = 0

    def add(self, rows: list[int]) -> None:
        if len(self.rows) > LOG_LIMIT:
            self.rows = []
            self.epoch += 1
        self.rows.extend(rows)


class ClusterArrays:
    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.version = -1
        self.changes = ChangeLog()
        self._rebuild()

    def _rebuild(self) -> None:
        self.cluster.changed_since(self)  # registers this view; everything is read afresh below
        nodes = self.cluster.sorted_nodes()
        self.nodes: list[Node] = list(nodes)
        self.index = {n.name: i for i, n in enumerate(nodes)}
        n = len(nodes)
        width = max((len(x.gpus) for x in nodes), default=1) or 1
        self.width = width
        self.free: I64 = np.full((n, width), UNUSABLE, dtype=np.int64)
        self.free_rows: list[list[int]] = [[UNUSABLE] * width for _ in range(n)]  # `free` as lists, row by row
        self.free_mem: I64 = np.zeros((n, width), dtype=np.int64)
        self.cpu: I64 = np.zeros(n, dtype=np.int64)
        self.mem: I64 = np.zeros(n, dtype=np.int64)
        self.rdma: I64 = np.zeros(n, dtype=np.int64)
        self.online = np.zeros(n, dtype=bool)
        self.online_rows: list[bool] = [False] * n  # `online` as a list
        # The same as lists, for row-by-row questions on small clusters: free memory, CPU, memory, RDMA NICs,
        # and over usable GPUs (healthy, not MIG): is there any, their free share, how many are idle.
        self.free_mem_rows: list[list[int]] = [[0] * width for _ in range(n)]
        self.host_rows: list[tuple[int, int, int]] = [(0, 0, 0)] * n
        self.usable_rows: list[tuple[bool, int, int]] = [(False, 0, 0)] * n
        # Per row, the free shares (sorted) of the GPUs with no memory overdrawn: what a request of whole GPUs
        # (which asks no GPU memory) can count on.
        self.share_rows: list[list[int]] = [[] for _ in range(n)]
        # Per row, the largest fraction declaring no memory one of its usable GPUs could take: within its free
        # share, and with its share of the GPU's memory free (UNUSABLE: none).
        self.fraction_room: list[int] = [UNUSABLE] * n
        # Each GPU's whole memory (0: padding), and per fraction size the share of it that fraction holds.
        self.memory: I64 = np.zeros((n, width), dtype=np.int64)
        for i, x in enumerate(nodes):
            for j, g in enumerate(x.gpus):
                self.memory[i, j] = g.memory_mib
        self.memory_rows: list[list[int]] = self.memory.tolist()
        self._share_memory: dict[int, I64] = {}
        self._share_memory_rows: dict[int, list[list[int]]] = {}
        self._same_rows: dict[int, list[int]] = {}
        # Free share on each node's usable GPUs (idle_share, kept row by row), and as a list.
        self.idle: I64 = np.zeros(n, dtype=np.int64)
        self.idle_rows: list[int] = [0] * n
        # model_mask / gpu_mask per allowed-models tuple (they change only with the set of nodes).
        self._model_masks: dict[tuple[str, ...], npt.NDArray[np.bool_]] = {}
        self._gpu_masks: dict[tuple[str, ...], npt.NDArray[np.bool_]] = {}
        self._gpu_mask_rows: dict[tuple[str, ...], list[list[bool]]] = {}
        self.models = sorted({g.model for x in nodes for g in x.gpus})
        # No NPU among them: a job naming no model may use every device (the masks' quick case).
        self.gpus_only = all(kind_of(m) == GPU for m in self.models)
        model_id = {m: i for i, m in enumerate(self.models)}
        # A node's model: the model of its first GPU; -1 without GPUs. Nodes mixing models are rare and
        # handled GPU by GPU (gpu_model) where it matters.
        self.model: I64 = np.array([model_id[x.gpus[0].model] if x.gpus else -1 for x in nodes], dtype=np.int64)
        self.model_rows: list[int] = self.model.tolist()
        self._model_mask_rows: dict[tuple[str, ...], list[bool]] = {}
        self.gpu_model: I64 = np.full((n, width), -1, dtype=np.int64)
        for i, x in enumerate(nodes):
            for j, g in enumerate(x.gpus):
                self.gpu_model[i, j] = model_id[g.model]
        self.mixed = bool(((self.gpu_model != self.model[:, None]) & (self.gpu_model >= 0)).any())
        for i in range(n):
            self._fill(i)
        self.version = self.cluster.version

    def _fill(self, row: int) -> None:
        node = self.nodes[row]
        width = self.width
        free = [UNUSABLE] * width
        mem = [0] * width
        shares: list[int] = []  # free shares of the usable GPUs whose memory is not overdrawn
        overdrawn = 0
        room = UNUSABLE
        idle = usable_share = idle_gpus = 0
        usable = False
        for j, g in enumerate(node.gpus):
            if g.healthy and not g.mig_enabled and not g.mig_instances:  # Gpu.takes_shares, inlined: hot
                share = g.free_milli
                memory = g.free_memory_mib
                free[j] = share
                mem[j] = memory
                if memory >= 0:
                    shares.append(share)
                    if share > room:  # the largest fraction whose share of memory is free: M*m//FULL <= memory
                        whole = g.memory_mib
                        room = max(room, share if whole <= 0 else min(share, ((memory + 1) * FULL - 1) // whole))
                else:
                    overdrawn += 1
                if share > 0:
                    idle += share
                if share >= 0:
                    usable = True
                    usable_share += share
                    idle_gpus += share == FULL
        # Padding and unusable GPUs (UNUSABLE, no memory) count among the shares too.
        shares += [UNUSABLE] * (width - len(shares) - overdrawn)
        shares.sort()
        # The arrays are written only where the row changed: at this size numpy's cost per call dominates.
        if free != self.free_rows[row]:
            self.free[row] = free
        if mem != self.free_mem_rows[row]:
            self.free_mem[row] = mem
        self.free_rows[row] = free
        self.free_mem_rows[row] = mem
        self.share_rows[row] = shares
        self.fraction_room[row] = room
        host = (node.free_cpu_milli, node.free_memory_mib, node.free_rdma_nics)
        if host != self.host_rows[row]:
            self.host_rows[row] = host
            self.cpu[row], self.mem[row], self.rdma[row] = host
        self.usable_rows[row] = (usable, usable_share, idle_gpus)
        if idle != self.idle_rows[row]:
            self.idle_rows[row] = idle
            self.idle[row] = idle
        online = bool(node.online)
        if online != self.online_rows[row]:
            self.online_rows[row] = online
            self.online[row] = online

    def refresh(self) -> list[int]:
        """Bring the arrays up to date; returns the rows that changed."""
        if self.cluster.version != self.version:
            self._rebuild()
            return list(range(len(self.nodes)))
        rows = [self.index[name] for name in self.cluster.changed_since(self)]
        for i in rows:
            self._fill(i)
        if rows:
            self.changes.add(rows)
        return rows

    def share_memory(self, milli: int) -> I64:
        """Per GPU, the memory a fraction of `milli` declaring none would hold there (read only: shared)."""
        found = self._share_memory.get(milli)
        if found is None:
            found = self._share_memory[milli] = self.memory * milli // FULL  # share_memory_mib, GPU by GPU
            found.flags.writeable = False
        return found

    def share_memory_rows(self, milli: int) -> list[list[int]]:
        """share_memory as lists, row by row (read only: shared)."""
        found = self._share_memory_rows.get(milli)
        if found is None:
            found = self._share_memory_rows[milli] = self.share_memory(milli).tolist()
        return found

    def same_row(self, value: int) -> list[int]:
        """`value` for every GPU column of a row (read only: shared)."""
        found = self._same_rows.get(value)
        if found is None:
            found = self._same_rows[value] = [value] * self.width
        return found

    def model_ids(self, models: tuple[str, ...]) -> list[int]:
        return [i for i, m in enumerate(self.models) if model_matches(models, m)]

    def model_mask(self, models: tuple[str, ...]) -> npt.NDArray[np.bool_]:
        """Nodes with at least one GPU of an allowed model (read only: shared between callers)."""
        mask = self._model_masks.get(models)
        if mask is None:
            mask = self._model_masks[models] = self._model_mask(models)
            mask.flags.writeable = False
        return mask

    def model_mask_rows(self, models: tuple[str, ...]) -> list[bool]:
        """model_mask as a list."""
        mask = self._model_mask_rows.get(models)
        if mask is None:
            mask = self._model_mask_rows[models] = self.model_mask(models).tolist()
        return mask

    def _model_mask(self, models: tuple[str, ...]) -> npt.NDArray[np.bool_]:
        if not models and self.gpus_only:
            return self.model >= 0
        ids = self.model_ids(models)
        if self.mixed:
            return np.asarray(np.isin(self.gpu_model, ids).any(axis=1))
        return np.isin(self.model, ids)

    def gpu_mask(self, models: tuple[str, ...]) -> npt.NDArray[np.bool_]:
        """GPUs of an allowed model (read only: shared between callers)."""
        mask = self._gpu_masks.get(models)
        if mask is None:
            mask = self._gpu_masks[models] = self._gpu_mask(models)
            mask.flags.writeable = False
        return mask

    def _gpu_mask(self, models: tuple[str, ...]) -> npt.NDArray[np.bool_]:
        if not models and self.gpus_only:
            return self.gpu_model >= 0
        return np.isin(self.gpu_model, self.model_ids(models))

    def usable_free(self, models: tuple[str, ...], whole: bool) -> tuple[bool, int]:
        """Over usable GPUs (healthy, not MIG, on online nodes) of the allowed models: is there any, and
        their free share (`whole`: only idle GPUs count, a whole share each)."""
        if len(self.nodes) > FEW_NODES:
            usable = (self.free >= 0) & self.online[:, None] & self.gpu_mask(models)
            if not usable.any():
                return False, 0
            if whole:
                return True, int((self.free[usable] == FULL).sum()) * FULL
            return True, int(self.free[usable].sum())
        if not models and self.gpus_only:  # any GPU: every usable one, as counted row by row when filled
            found, total = False, 0
            for online, (any_usable, share, idle_gpus) in zip(self.online_rows, self.usable_rows, strict=True):
                if online and any_usable:
                    found = True
                    total += idle_gpus if whole else share
            return found, total * FULL if whole else total
        masks = self._gpu_mask_rows.get(models)
        if masks is None:
            masks = self._gpu_mask_rows[models] = self.gpu_mask(models).tolist()
        found, total = False, 0
        for online, row, mask in zip(self.online_rows, self.free_rows, masks, strict=True):
            if not online:
                continue
            for free, allowed in zip(row, mask, strict=True):
                if allowed and free >= 0:
                    found = True
                    total += (free == FULL) if whole else free
        return found, total * FULL if whole else total

    def idle_share(self) -> I64:
        return self.idle.copy()
