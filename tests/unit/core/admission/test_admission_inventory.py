"""Admission against the inventory: every job that could never fit the registered nodes is rejected at once
with its own code and the numbers; nothing is rejected for capacity before a first node registers."""

from __future__ import annotations

import msgspec
import pytest

from contracts import GpuSpec, JobAdmitted, JobRejected, JobSubmitted, NodeLost, NodeRegistered, NodeSpec
from libs.core.admission.capacity import Inventory, Rejection
from libs.core.admission.decider import AdmissionDecider
from libs.core.admission.validation import validate
from libs.core.kernel import mig_profiles
from libs.core.kernel.policy import PolicyBook
from tests.unit.builders import EventFeed, Job, brief, job, node, of, queue

QUEUES = (queue("ml-dev", "ml", None),)
H100_MIB = 81_559  # what the driver reports for an H100 80GB
A100_40GB_MIB = 40_960


def mig_node(name: str, gpus: int, gpu_memory_mib: int, **host: int) -> NodeSpec:
    return NodeSpec(name=name, labels={"rack": "r2"}, gpus=tuple(
        GpuSpec(index=i, model="A100", memory_mib=gpu_memory_mib, mig_enabled=True) for i in range(gpus)), **host)


# a: 8 A100 80GB, 2 NICs; b: 4 H100, twice a's CPU and memory, no NIC; c: 4 A100 80GB; m: 2 MIG-enabled A100 40GB
# with the most memory of all. Racks: r1 = a, b; r2 = c, m.
NODES = (
    msgspec.structs.replace(node("a", 8, "A100"), rdma_nics=2, labels={"rack": "r1"}),
    msgspec.structs.replace(node("b", 4, "H100", cpu_milli=128_000, memory_mib=1_024_000, gpu_memory_mib=H100_MIB),
                            labels={"rack": "r1"}),
    msgspec.structs.replace(node("c", 4, "A100"), labels={"rack": "r2"}),
    mig_node("m", 2, A100_40GB_MIB, cpu_milli=32_000, memory_mib=2_048_000),
)


def book() -> PolicyBook:
    policy = PolicyBook()
    policy.set_queues(QUEUES)
    return policy


def inventory(*nodes: NodeSpec) -> Inventory:
    inv = Inventory()
    for n in nodes or NODES:
        inv.register(NodeRegistered(id=n.name, ts=0.0, source="test", node=n))
    return inv


def dev() -> Job:
    return job(queue="ml-dev")


def mig(profile: str) -> Job:
    return dev().having(mig_profile=profile)


@pytest.mark.parametrize(("j", "code", "numbers"), [
    pytest.param(dev().host(cpu_milli=200_000), "exceeds_node_cpu", ("200000", "128000"),
                 id="more CPU than any node"),
    pytest.param(dev().models("A100").host(memory_mib=600_000), "exceeds_node_memory", ("600000", "512000"),
                 id="more memory than any node of the allowed model (MIG-only nodes do not count)"),
    pytest.param(dev().having(rdma_nics=3), "exceeds_node_rdma", ("3", "2"), id="more RDMA NICs than any node"),
    pytest.param(dev().having(gpu_memory_mib=90_000), "exceeds_gpu_memory", ("90000", "81920"),
                 id="more memory per GPU than any GPU"),
    pytest.param(dev().models("H100").having(gpu_memory_mib=81_700), "exceeds_gpu_memory", ("81700", "81559"),
                 id="more memory per GPU than any GPU of the allowed model"),
    pytest.param(dev().host(cpu_milli=100_000).having(rdma_nics=2), "exceeds_node_resources", ("100000", "2 RDMA"),
                 id="enough CPU on one node and enough NICs on another but never both on one"),
    pytest.param(dev().gpus(9), "exceeds_node_capacity", ("9", "8"), id="more GPUs than any node"),
    pytest.param(dev().gpus(4).replicas(3).having(topology="node", topology_required=True),
                 "exceeds_topology_node", ("3", "2"), id="a gang on one node larger than any node"),
    pytest.param(dev().replicas(2).having(topology="node", topology_required=True, spread=True),
                 "exceeds_topology_node", ("2", "1"), id="a gang on one node that also spreads over nodes"),
    pytest.param(dev().gpus(4).replicas(4).having(topology="rack", topology_required=True),
                 "exceeds_topology_rack", ("4", "3"), id="a gang on one rack larger than any rack"),
    pytest.param(dev().having(topology="zone", topology_required=True), "unknown_topology", ("zone",),
                 id="a required topology that names no domain"),
    pytest.param(dev().replicas(4).having(spread=True), "exceeds_spread_nodes", ("4", "3"),
                 id="spread over more replicas than there are nodes"),
    pytest.param(dev().models("A100").gpus(4).replicas(3).having(spread=True), "exceeds_spread_nodes", ("3", "2"),
                 id="spread over more replicas than there are nodes that can hold one"),
    pytest.param(dev().gpus(4).replicas(4), "exceeds_one_gpu_model", ("4", "A100", "H100"),
                 id="a gang that fits only over two GPU models (3 replicas on A100, 1 on H100)"),
    pytest.param(dev().gpus(4).replicas(5), "exceeds_cluster_capacity", ("20", "16"),
                 id="a gang of more GPUs than the cluster's plain ones (MIG-enabled ones do not count)"),
    pytest.param(dev().gpus(3).replicas(5), "exceeds_cluster_capacity", ("5", "4"),
                 id="a gang whose replicas never fit at once though its GPU count does"),
    pytest.param(mig("banana"), "unknown_mig_profile", ("banana",), id="a MIG profile name that is no profile"),
    pytest.param(mig("3g.40gb"), "unknown_mig_profile", ("3g.40gb", "3g.20gb"),
                 id="an A100 80GB profile on the A100 40GB"),
    pytest.param(mig("1g.999gb"), "exceeds_mig_gpu_memory", ("1022976", "40960"),
                 id="a MIG profile with more memory than the GPU"),
    pytest.param(mig("1g.10gb").models("H100"), "no_mig_enabled_gpu", ("H100",),
                 id="no MIG-enabled GPU of the allowed models"),
    pytest.param(mig("3g.20gb").replicas(5), "exceeds_cluster_capacity", ("5", "4"),
                 id="more MIG instances than the MIG-enabled GPUs hold"),
    pytest.param(mig("1g.5gb").host(cpu_milli=40_000), "exceeds_node_cpu", ("40000", "32000"),
                 id="more CPU than the nodes of MIG-enabled GPUs have"),
    pytest.param(mig("7g.40gb").having(gpu_memory_mib=40_961), "exceeds_gpu_memory", ("40961", "40960"),
                 id="more GPU memory than the instances of the profile hold"),
])
def test_a_job_that_could_never_fit_the_inventory_is_rejected_with_its_own_code(
        j: Job, code: str, numbers: tuple[str, ...]) -> None:
    rejection = validate(j.spec, book(), inventory())
    assert rejection is not None
    assert rejection.code == code, rejection.message
    for number in numbers:  # what it needs and the most there is
        assert number in rejection.message, rejection.message


@pytest.mark.parametrize("j", [
    pytest.param(dev().host(cpu_milli=128_000, memory_mib=1_024_000), id="all of the largest node's host"),
    pytest.param(dev().having(gpu_memory_mib=81_700), id="GPU memory that only some model has"),
    pytest.param(dev().gpus(8).having(rdma_nics=2), id="the one node with GPUs and NICs enough"),
    pytest.param(dev().gpus(4).replicas(2).having(topology="node", topology_required=True),
                 id="a gang that fills the largest node"),
    pytest.param(dev().gpus(2).replicas(4).having(topology="rack", topology_required=True),
                 id="a gang that fills the largest rack's GPUs of one model"),
    pytest.param(dev().gpus(4).replicas(3).having(topology="node"), id="a preferred topology never rejects"),
    pytest.param(dev().replicas(2).having(spread=True), id="one replica on each node of plain GPUs of one model"),
    pytest.param(dev().gpus(4).replicas(3), id="a gang of every A100 node's GPUs in 4s"),
    pytest.param(dev().fraction(250).replicas(48).having(gpu_memory_mib=20_000),
                 id="quarter GPUs, 4 to each plain A100"),
    pytest.param(mig("1g.5gb").replicas(14), id="every 1g.5gb instance of both A100 40GB"),
    pytest.param(mig("3g.20gb").replicas(4).having(topology="node", topology_required=True),
                 id="two 3g.20gb on each GPU of one node"),
    pytest.param(mig("7g.40gb").models("A100").host(memory_mib=2_000_000), id="a whole 40GB GPU as MIG"),
])
def test_a_job_the_inventory_could_hold_is_accepted(j: Job) -> None:
    assert validate(j.spec, book(), inventory()) is None


def test_a_mig_enabled_gpu_of_no_known_product_offers_no_profile() -> None:
    other = inventory(NodeSpec(name="x", gpus=(GpuSpec(index=0, model="X1", memory_mib=48_000, mig_enabled=True),)))
    unknown = validate(mig("2g.24gb").spec, book(), other)
    assert unknown is not None and unknown.code == "unknown_mig_profile"
    assert "X1 48000 MiB: no MIG profile table known" in unknown.message
    too_big = validate(mig("1g.48gb").spec, book(), other)  # 48 GB is more than 48000 MiB, rounded up to 47 GB
    assert too_big is not None and too_big.code == "exceeds_mig_gpu_memory"


def test_a_mig_job_asking_more_gpu_memory_than_its_instance_holds_is_rejected() -> None:
    instance = 2 * (A100_40GB_MIB // 8)  # 1g.10gb takes 2 of the 8 memory slices
    assert validate(mig("1g.10gb").having(gpu_memory_mib=instance).spec, book(), inventory()) is None
    rejection = validate(mig("1g.10gb").having(gpu_memory_mib=instance + 1).spec, book(), inventory())
    assert rejection is not None and rejection.code == "exceeds_gpu_memory"
    assert rejection.message == f"a replica needs {instance + 1} MiB on its GPU; the largest 1g.10gb instance has " \
                                f"{instance} MiB"


def test_the_profile_table_knows_each_product_by_its_model_and_reported_memory() -> None:
    assert mig_profiles.lookup("A100", 40_960, "3g.20gb") == mig_profiles.MigProfile("3g.20gb", 3, 20_480, 2)
    assert mig_profiles.lookup("A100", 81_920, "3g.20gb") is None
    assert mig_profiles.lookup("A100", 81_920, "3g.40gb") == mig_profiles.MigProfile("3g.40gb", 3, 40_960, 2)
    assert mig_profiles.lookup("H100", H100_MIB, "7g.80gb") == mig_profiles.MigProfile("7g.80gb", 7, 81_920, 1)
    assert mig_profiles.lookup("H100", 95_830, "3g.47gb") is not None  # H100 NVL 94GB
    assert mig_profiles.lookup("H200", 143_771, "1g.18gb+me") == mig_profiles.MigProfile("1g.18gb+me", 1, 18_432, 1)
    assert mig_profiles.lookup("A30", 24_576, "4g.24gb") == mig_profiles.MigProfile("4g.24gb", 4, 24_576, 1)
    assert mig_profiles.lookup("T4", 15_360, "1g.5gb") is None  # no MIG at all
    assert mig_profiles.lookup("A100", 0, "1g.5gb") is None  # memory unknown: which A100 is unknown
    assert mig_profiles.parse("1c.3g.20gb") is None and mig_profiles.parse("2g.10gb") == (2, 10_240)


def test_a_node_with_enough_gpus_but_too_little_memory_does_not_count() -> None:
    small = msgspec.structs.replace(node("small", 8), memory_mib=100_000)
    big = msgspec.structs.replace(node("big", 2), memory_mib=800_000)
    rejection = validate(dev().gpus(4).host(memory_mib=200_000).spec, book(), inventory(small, big))
    assert rejection is not None and rejection.code == "exceeds_node_memory"
    assert rejection.message == ("a replica needs 200000 MiB of memory; the largest node that can hold a "
                                 "replica's GPUs has 100000")


def test_gpus_of_the_memory_asked_must_be_enough_on_one_node() -> None:
    mixed = NodeSpec(name="mixed", cpu_milli=64_000, memory_mib=512_000, gpus=tuple(
        GpuSpec(index=i, model="A100", memory_mib=81_920 if i < 4 else A100_40GB_MIB) for i in range(8)))
    rejection = validate(dev().gpus(5).having(gpu_memory_mib=60_000).spec, book(), inventory(mixed))
    assert rejection is not None and rejection.code == "exceeds_node_capacity"
    assert rejection.message == "a replica needs 5 GPUs with 60000 MiB each; the largest node has 4 such GPUs"
    assert validate(dev().gpus(4).having(gpu_memory_mib=60_000).spec, book(), inventory(mixed)) is None


def test_re_registering_a_node_replaces_its_capacity() -> None:
    inv = inventory(msgspec.structs.replace(node("a", 8), cpu_milli=64_000))
    assert validate(dev().host(cpu_milli=96_000).spec, book(), inv) is not None
    inv.register(NodeRegistered(id="r", ts=1.0, source="test",
                                node=msgspec.structs.replace(node("a", 8), cpu_milli=128_000)))
    assert validate(dev().host(cpu_milli=96_000).spec, book(), inv) is None
    assert sum(inv.shapes.values()) == 1


# --- before any node registers, and after every node is lost -------------------------------------------------

def test_a_valid_job_submitted_before_any_node_registers_is_admitted() -> None:
    feed = EventFeed(AdmissionDecider())
    feed.queues(*QUEUES)
    assert brief(feed.submit("j1", dev().gpus(8))) == [("JobSubmitted", "j1"), ("JobAdmitted", "j1")]
    feed.nodes(*NODES)
    [rejected] = feed.submit("j2", dev().gpus(9))
    assert isinstance(rejected, JobRejected) and rejected.code == "exceeds_node_capacity"


def test_before_any_node_registers_policy_and_the_spec_itself_are_still_checked() -> None:
    feed = EventFeed(AdmissionDecider())
    feed.queues(*QUEUES)
    assert [r.code for r in of(feed.submit("j1", job(team="nobody")), JobRejected)] == ["unknown_team"]
    assert [r.code for r in of(feed.submit("j2", mig("banana")), JobRejected)] == ["unknown_mig_profile"]


def test_nodes_lost_stay_in_the_inventory_they_may_come_back() -> None:
    feed = EventFeed(AdmissionDecider())
    feed.queues(*QUEUES)
    feed.nodes(*NODES)
    for n in NODES:
        feed.send(NodeLost, node=n.name, reason="heartbeat")
    out = feed.submit("j1", dev().gpus(8))
    assert [type(d) for d in out] == [JobSubmitted, JobAdmitted]
    assert [r.code for r in of(feed.submit("j2", dev().gpus(9)), JobRejected)] == ["exceeds_node_capacity"]


def test_mig_enabled_gpus_never_count_for_whole_or_fractional_gpus() -> None:
    inv = inventory(mig_node("m", 8, A100_40GB_MIB, cpu_milli=64_000, memory_mib=512_000), node("a", 4))
    rejection = validate(dev().gpus(6).spec, book(), inv)
    assert rejection is not None and rejection.code == "exceeds_node_capacity"
    assert rejection.message == ("a replica needs 6 GPUs of any model; the largest node has 4 that are not "
                                 "MIG-enabled (those take MIG profiles only)")
    assert validate(dev().fraction(500).replicas(8).spec, book(), inv) is None
    beyond = validate(dev().fraction(500).replicas(9).spec, book(), inv)
    assert beyond is not None and beyond.code == "exceeds_cluster_capacity"


def test_racks_of_nodes_alike_add_up_and_a_node_without_the_label_is_in_no_rack() -> None:
    alike = [msgspec.structs.replace(node(f"n{i}", 8), labels={"rack": f"r{i % 2}"}) for i in range(4)]
    inv = inventory(*alike, node("unlabelled", 8))
    gang = dev().gpus(4).having(topology="rack", topology_required=True)
    assert validate(gang.replicas(4).spec, book(), inv) is None
    rejection = validate(gang.replicas(5).spec, book(), inv)
    assert rejection == Rejection("exceeds_topology_rack", "the gang of 5 replicas must share one rack; the largest "
                                  "rack holds at most 4")
    inv.register(NodeRegistered(id="again", ts=1.0, source="test", node=alike[0]))  # the same node, registered again
    assert validate(gang.replicas(5).spec, book(), inv) == rejection
    inv.register(NodeRegistered(id="moved", ts=2.0, source="test",
                                node=msgspec.structs.replace(node("unlabelled", 8), labels={"rack": "r0"})))
    assert validate(gang.replicas(6).spec, book(), inv) is None


def test_a_removed_node_offers_nothing_more_and_one_lost_still_does() -> None:
    inv = inventory()
    asks_h100 = dev().gpus(4).models("H100").spec
    assert inv.verdict(asks_h100) is None
    inv.unregister("b")  # the only H100 node leaves the inventory
    rejection = inv.verdict(asks_h100)
    assert rejection is not None and "H100" in rejection.message
    inv.register(NodeRegistered(id="b-again", ts=1.0, source="test", node=NODES[1]))
    assert inv.verdict(asks_h100) is None
    decider = AdmissionDecider()
    for n in NODES:
        decider.fold(NodeRegistered(id=n.name, ts=0.0, source="test", node=n))
    decider.fold(NodeLost(id="lost", ts=1.0, source="test", node="b", reason="heartbeat_timeout"))
    assert "b" in decider.state.inventory.nodes  # lost may come back: it still counts
    decider.fold(NodeLost(id="gone", ts=2.0, source="test", node="b", reason="removed", removed=True))
    assert "b" not in decider.state.inventory.nodes
