"""Textbook scheduling policies to compare the platform against on a replayed trace: a pure, deterministic
discrete-event simulator (no clock, no I/O, no randomness) of FIFO, SJF and SRTF on nodes of GPUs.

Policies (`run_textbook(policy, ...)`):

- ``fifo``: first come, first served, *strict*: jobs start in submit order, and a head job that does not fit
  blocks every job behind it (head-of-line blocking, no backfill), as Helios's FIFO baseline.
- ``sjf``: non-preemptive shortest job first. Among waiting jobs the one with the shortest *actual* runtime
  (the oracle knows every runtime) starts first; a job that fits starts even if a shorter one waits because it
  does not fit (no head-of-line blocking). A started job runs to its end.
- ``srtf``: preemptive shortest remaining time first, with the textbook's free preemption. At every arrival
  and completion the waiting jobs are taken shortest remaining time first: one that fits the free GPUs starts;
  one that does not fit preempts running jobs with a *longer* remaining time if that makes room (never a job
  with a shorter one). Victims are taken longest remaining first: on each node, its longer jobs longest first
  until the job fits; the node chosen is the one whose shortest victim has the longest remaining time, then
  the one that stops the fewest GPUs, then the lowest index (for one GPU that is simply the running job with
  the longest remaining time). A job of several nodes preempts only on nodes all of whose jobs are longer.
  A preempted job keeps all its progress and goes back to waiting with its remaining time (preemption costs
  nothing: ``lost_gpu_s`` is always 0, and every stop counts in ``preemptions``, even one whose job resumes at
  once on other GPUs). Between events remaining times shrink only for running jobs, which never makes a
  waiting job shorter than a running one, so choosing at events only is exact.

Pools: partitioned (``shared=False``): each team has ``team_nodes[team]`` nodes of its own, and only its jobs run
there; a team not in ``team_nodes`` has none (its jobs are rejected). Shared: all the teams' nodes form one
pool with one queue for everyone (jobs of teams not in ``team_nodes`` join it too). A job that could never fit
its pool (more GPUs than the pool has) is rejected (``rejected=True``, never started).

Placement: nodes of ``gpus_per_node`` GPUs. A job of g <= gpus_per_node GPUs goes on one node with g free GPUs,
best fit: the node with the fewest free GPUs that still fits, ties by lowest node index. A job of more GPUs
takes ceil(g / gpus_per_node) nodes that are wholly free (the lowest indices): all their GPUs on all but the
last, the rest of g on the last (whose other GPUs stay free for others).

Ties between equal sizes or times are broken by submit time then job_id, so the same input always gives the
same output. Cost: each event costs O(queue classes x gpus_per_node) plus, for SRTF, a scan of the nodes when
a multi-GPU job may preempt (remembered per waiting job, and re-done only on nodes that released GPUs since).
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from math import inf

from libs.sim.trace_outcome import JobOutcome, TraceJob

POLICIES = ("fifo", "sjf", "srtf")
_PROGRESS_EVERY = 2048


class _Jobs:
    """The run's jobs as flat arrays indexed by position in the input, and what happens to them."""

    __slots__ = ("end", "finish", "first", "gpus", "preempted", "rem", "runtime", "segments", "seq", "submit")

    def __init__(self, jobs: Sequence[TraceJob], record: bool) -> None:
        n = len(jobs)
        self.submit = [j.submit_s for j in jobs]
        self.runtime = [j.runtime_s for j in jobs]
        self.gpus = [j.gpus for j in jobs]
        order = sorted(range(n), key=lambda i: (jobs[i].submit_s, jobs[i].job_id))
        self.seq = [0] * n
        for rank, i in enumerate(order):
            self.seq[i] = rank
        self.rem = list(self.runtime)
        self.finish = [inf] * n
        self.first: list[float | None] = [None] * n
        self.end: list[float | None] = [None] * n
        self.preempted = [0] * n
        self.segments: list[list[tuple[float, float]]] | None = [[] for _ in range(n)] if record else None


class _Pool:
    """One pool of nodes running one policy over its jobs, from the first arrival until the last job ends."""

    def __init__(self, policy: str, n_nodes: int, gpn: int, js: _Jobs, tick: Callable[[], None]) -> None:
        self.policy, self.n, self.gpn, self.js, self.tick = policy, n_nodes, gpn, js, tick
        self.free = [gpn] * n_nodes
        self.masks = [0] * (gpn + 1)  # masks[f]: bit i set when node i has exactly f free GPUs
        self.masks[gpn] = (1 << n_nodes) - 1
        self.on: list[dict[int, int]] = [{} for _ in range(n_nodes)]  # node -> {job: its GPUs there}
        self.where: dict[int, list[int]] = {}  # running job -> its nodes
        self.epoch: dict[int, int] = {}  # bumped at each start and stop: older heap entries are stale
        self.done: list[tuple[float, int, int, int]] = []  # (finish, seq, job, epoch)
        self.longest: list[tuple[float, int, int, int]] = []  # (-finish, -seq, job, epoch), SRTF only
        self.fifo: deque[int] = deque()
        self.classes: dict[int, list[tuple[float, int, int]]] = {}  # gpus -> heap of (key, seq, job)
        self.released: list[int] = []  # log of nodes that released GPUs, for SRTF's remembered checks
        self.memo: dict[int, tuple[int, int]] = {}  # waiting job -> (log length, nodes) when it could not preempt
        self._new_heads: list[int] = []  # size classes a just-preempted job now leads

    # placement -----------------------------------------------------------------------------------------

    def _take(self, i: int, g: int, j: int) -> None:
        f = self.free[i]
        bit = 1 << i
        self.masks[f] &= ~bit
        self.masks[f - g] |= bit
        self.free[i] = f - g
        self.on[i][j] = g

    def _give(self, i: int, j: int) -> None:
        g = self.on[i].pop(j)
        f = self.free[i]
        bit = 1 << i
        self.masks[f] &= ~bit
        self.masks[f + g] |= bit
        self.free[i] = f + g
        self.released.append(i)

    def fits(self, g: int) -> bool:
        gpn, masks = self.gpn, self.masks
        if g <= gpn:
            return any(masks[f] for f in range(g, gpn + 1))
        return -(-g // gpn) <= masks[gpn].bit_count()

    def _best(self, g: int) -> list[int]:
        gpn, masks = self.gpn, self.masks
        if g <= gpn:
            for f in range(g, gpn + 1):
                m = masks[f]
                if m:
                    return [(m & -m).bit_length() - 1]
            raise AssertionError("no node fits")  # pragma: no cover - callers check fits() first
        nodes, m = [], masks[gpn]
        for _ in range(-(-g // gpn)):
            low = m & -m
            nodes.append(low.bit_length() - 1)
            m ^= low
        return nodes

    def start(self, j: int, t: float, nodes: list[int] | None = None) -> None:
        js, gpn = self.js, self.gpn
        g = js.gpus[j]
        nodes = nodes if nodes is not None else self._best(g)
        left = g
        for i in nodes:
            share = min(left, gpn) if len(nodes) > 1 else g
            self._take(i, share, j)
            left -= share
        self.where[j] = nodes
        if js.first[j] is None:
            js.first[j] = t
        fin = t + js.rem[j]
        js.finish[j] = fin
        e = self.epoch[j] = self.epoch.get(j, 0) + 1
        heapq.heappush(self.done, (fin, js.seq[j], j, e))
        if self.policy == "srtf":
            heapq.heappush(self.longest, (-fin, -js.seq[j], j, e))
        self.memo.pop(j, None)
        if js.segments is not None:
            js.segments[j].append((t, fin))

    def _stop(self, j: int) -> None:
        for i in self.where.pop(j):
            self._give(i, j)
        self.epoch[j] += 1

    def preempt(self, j: int, t: float) -> None:
        js = self.js
        self._stop(j)
        js.rem[j] = js.finish[j] - t
        js.preempted[j] += 1
        if js.segments is not None:
            s0, _ = js.segments[j][-1]
            js.segments[j][-1] = (s0, t)
        self._enqueue(j)

    def _enqueue(self, j: int) -> None:
        js = self.js
        if self.policy == "fifo":
            self.fifo.append(j)
            return
        key = js.runtime[j] if self.policy == "sjf" else js.rem[j]
        heapq.heappush(self.classes.setdefault(js.gpus[j], []), (key, js.seq[j], j))

    # the event loop ------------------------------------------------------------------------------------

    def run(self, arrivals: list[int]) -> None:
        js, done = self.js, self.done
        ai, na = 0, len(arrivals)
        while ai < na or done:
            while done and self.epoch.get(done[0][2]) != done[0][3]:
                heapq.heappop(done)
            t_done = done[0][0] if done else inf
            t_arr = js.submit[arrivals[ai]] if ai < na else inf
            if t_done == inf and t_arr == inf:
                break
            t = min(t_done, t_arr)
            while done and done[0][0] <= t:
                _, _, j, e = heapq.heappop(done)
                if self.epoch.get(j) != e:
                    continue
                self._stop(j)
                js.end[j] = js.finish[j]
                self.tick()
            while ai < na and js.submit[arrivals[ai]] <= t:
                self._enqueue(arrivals[ai])
                ai += 1
            if self.policy == "fifo":
                self._decide_fifo(t)
            else:
                self._decide_shortest(t)

    def _decide_fifo(self, t: float) -> None:
        q, gpus = self.fifo, self.js.gpus
        while q and self.fits(gpus[q[0]]):
            self.start(q.popleft(), t)

    def _decide_shortest(self, t: float) -> None:
        """Waiting jobs shortest first (per size class, the head is the shortest): start each that fits, and
        under SRTF let one that does not fit preempt longer ones. A class whose head can do neither is done
        for this event: starting or preempting only takes room from every job that waited before it."""
        classes, srtf = self.classes, self.policy == "srtf"
        heads = [(h[0][0], h[0][1], g) for g, h in classes.items() if h]
        heapq.heapify(heads)
        while heads:
            _key, seq, g = heapq.heappop(heads)
            h = classes[g]
            if not h or h[0][1] != seq:
                continue  # stale: a preempted job became this class's head and has its own entry
            j = h[0][2]
            if self.fits(g):
                self.start(j, t)
            elif not (srtf and self._try_preempt(j, t)):
                continue
            heapq.heappop(h)
            if h:
                heapq.heappush(heads, (h[0][0], h[0][1], g))
            for victim_class in self._new_heads:
                vh = classes[victim_class]
                heapq.heappush(heads, (vh[0][0], vh[0][1], victim_class))
            self._new_heads = []

    # SRTF's preemption ---------------------------------------------------------------------------------

    def _longer(self, r: int, t: float, key: tuple[float, int]) -> bool:
        js = self.js
        return (js.finish[r] - t, js.seq[r]) > key

    def _try_preempt(self, j: int, t: float) -> bool:
        js, gpn = self.js, self.gpn
        g = js.gpus[j]
        key = (js.rem[j], js.seq[j])
        longest = self.longest
        while longest and self.epoch.get(longest[0][2]) != longest[0][3]:
            heapq.heappop(longest)
        if not longest or not self._longer(longest[0][2], t, key):
            return False  # nothing running is longer
        if g == 1:  # every node is full: stop the running job with the longest remaining time
            victims = [longest[0][2]]
            nodes = None
        else:
            found = self._victims_one_node(j, g, t, key) if g <= gpn else self._victims_nodes(j, g, t, key)
            if found is None:
                return False
            victims, nodes = found
        self.memo.pop(j, None)
        for r in victims:
            self._preempt_and_note(r, t)
        if nodes is None:
            nodes = self._best(g)
        self.start(j, t, nodes)
        return True

    def _preempt_and_note(self, r: int, t: float) -> None:
        g = self.js.gpus[r]
        h = self.classes.get(g)
        before = h[0][1] if h else None
        self.preempt(r, t)
        h = self.classes[g]
        if h[0][1] != before:
            self._new_heads.append(g)

    def _scan_nodes(self, j: int) -> list[int]:
        """The nodes worth scanning for job j: all of them, or those that released GPUs since j last failed
        (elsewhere jobs only got shorter, which never makes room for j)."""
        seen = self.memo.get(j)
        if seen is None:
            return list(range(self.n))
        dirty = set(self.released[seen[0]:])
        return sorted(dirty) if len(dirty) < self.n else list(range(self.n))

    def _victims_one_node(self, j: int, g: int, t: float, key: tuple[float, int]
                          ) -> tuple[list[int], list[int]] | None:
        js = self.js
        best: tuple[float, int, int, int] | None = None
        best_victims: list[int] = []
        for i in self._scan_nodes(j):
            on = self.on[i]
            avail = self.free[i]
            longer = []
            for r, share in on.items():
                rem = js.finish[r] - t
                if (rem, js.seq[r]) > key:
                    longer.append((rem, js.seq[r], r, share))
                    avail += share
            if avail < g:
                continue
            longer.sort(reverse=True)
            have, stopped, victims = self.free[i], 0, []
            for rem, sq, r, share in longer:
                victims.append(r)
                have += share
                stopped += js.gpus[r]
                if have >= g:
                    cost = (-rem, -sq, stopped, i)
                    if best is None or cost < best:
                        best, best_victims = cost, victims
                    break
        if best is None:
            self.memo[j] = (len(self.released), 0)
            return None
        return best_victims, [best[3]]

    def _victims_nodes(self, j: int, g: int, t: float, key: tuple[float, int]) -> tuple[list[int], list[int]] | None:
        js, gpn = self.js, self.gpn
        need = -(-g // gpn)
        seen = self.memo.get(j)
        nodes_to_scan = self._scan_nodes(j)
        if seen is not None and len(nodes_to_scan) < self.n:
            # seen[1] bounds how many nodes could host j (all their jobs longer) when j last failed; since then
            # only the nodes that released GPUs can have become able to.
            bound = seen[1] + len(nodes_to_scan)
            if bound < need:
                self.memo[j] = (len(self.released), bound)
                return None
            nodes_to_scan = list(range(self.n))
        ok: list[tuple[int, float, int, int, int]] = []
        for i in nodes_to_scan:
            on = self.on[i]
            if not on:
                ok.append((0, 0.0, 0, 0, i))
                continue
            low: tuple[float, int] | None = None
            for r in on:
                k = (js.finish[r] - t, js.seq[r])
                if k <= key:
                    break
                if low is None or k < low:
                    low = k
            else:
                assert low is not None
                ok.append((1, -low[0], -low[1], gpn - self.free[i], i))
        if len(ok) < need:
            self.memo[j] = (len(self.released), len(ok))
            return None
        ok.sort()
        nodes = [c[4] for c in ok[:need]]
        victims = sorted({r for i in nodes for r in self.on[i]}, key=lambda r: js.seq[r])
        return victims, nodes


def run_textbook(policy: str, jobs: Sequence[TraceJob], team_nodes: Mapping[str, int], shared: bool,
                 gpus_per_node: int = 8, progress: Callable[[int], None] | None = None) -> list[JobOutcome]:
    """Each job's fate under a textbook policy ("fifo", "sjf" or "srtf"; see the module doc), in input order.
    `progress(jobs done so far)` now and then and at the end (done: ended or rejected)."""
    return _simulate(policy, jobs, team_nodes, shared, gpus_per_node, progress)[0]


def run_textbook_segments(policy: str, jobs: Sequence[TraceJob], team_nodes: Mapping[str, int], shared: bool,
                          gpus_per_node: int = 8) -> tuple[list[JobOutcome], list[list[tuple[float, float]]]]:
    """As run_textbook, with each job's run segments [(start, stop), ...] too (for tests and plots)."""
    outcomes, segments = _simulate(policy, jobs, team_nodes, shared, gpus_per_node, None, record=True)
    assert segments is not None
    return outcomes, segments


def _simulate(policy: str, jobs: Sequence[TraceJob], team_nodes: Mapping[str, int], shared: bool,
              gpn: int, progress: Callable[[int], None] | None, record: bool = False
              ) -> tuple[list[JobOutcome], list[list[tuple[float, float]]] | None]:
    if policy not in POLICIES:
        raise ValueError(f"unknown textbook policy {policy!r}: one of {', '.join(POLICIES)}")
    if gpn < 1:
        raise ValueError("gpus_per_node must be at least 1")
    js = _Jobs(jobs, record)
    count = [0]

    def tick() -> None:
        count[0] += 1
        if progress is not None and count[0] % _PROGRESS_EVERY == 0:
            progress(count[0])

    pools: dict[str, tuple[int, list[int]]] = {}
    if shared:
        pools[""] = (sum(max(0, n) for n in team_nodes.values()), list(range(len(jobs))))
    else:
        for i, job in enumerate(jobs):
            pools.setdefault(job.team, (max(0, team_nodes.get(job.team, 0)), []))[1].append(i)
    rejected = [False] * len(jobs)
    for name in sorted(pools):
        n_nodes, members = pools[name]
        arrivals = []
        for i in sorted(members, key=lambda i: js.seq[i]):
            if n_nodes == 0 or js.gpus[i] > n_nodes * gpn:
                rejected[i] = True
                tick()
            else:
                arrivals.append(i)
        if arrivals:
            _Pool(policy, n_nodes, gpn, js, tick).run(arrivals)
    if progress is not None:
        progress(count[0])
    outcomes = [JobOutcome(job, js.first[i], js.end[i], rejected[i], js.preempted[i], 0.0, False)
                for i, job in enumerate(jobs)]
    return outcomes, js.segments
