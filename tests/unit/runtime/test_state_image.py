"""A state image puts a service's state back into the very objects others hold, references and all."""

from __future__ import annotations

from dataclasses import dataclass, field

import msgspec
import pytest

from contracts import GpuSpec, NodeSpec
from libs.core.cluster.arrays import ClusterArrays
from libs.core.cluster.model import Cluster
from libs.core.placement.decider import PlacementDecider
from libs.runtime import state_image


class Book:
    def __init__(self) -> None:
        self.entries: dict[str, int] = {}
        self.owner: Book | None = None  # a reference back to the root


@dataclass(slots=True)
class Slotted:
    items: list[int] = field(default_factory=list)


def node(name: str) -> NodeSpec:
    return NodeSpec(name=name, gpus=tuple(GpuSpec(index=i, model="A100") for i in range(2)))


def test_roots_are_restored_in_place_and_references_to_them_stay_live() -> None:
    book, slotted, plain = Book(), Slotted([1, 2]), {"a": 1}
    book.entries["x"] = 1
    book.owner = book
    image = state_image.capture({"book": book, "slotted": slotted, "plain": plain})

    other, other_slotted, other_plain = Book(), Slotted(), dict[str, int]()
    held = other  # e.g. an HTTP API holding the service's decider
    state_image.restore({"book": other, "slotted": other_slotted, "plain": other_plain}, image)
    assert held is other and other.entries == {"x": 1} and other.owner is other
    assert other_slotted.items == [1, 2] and other_plain == {"a": 1}


def test_registries_keyed_by_object_identity_follow_the_restored_objects() -> None:
    cluster = Cluster()
    cluster.register(node("n1"))
    view = ClusterArrays(cluster)
    cluster.register(node("n2"))  # a change the view has not seen yet
    holder = {"cluster": cluster, "view": view}
    image = state_image.capture({"state": holder})

    restored: dict[str, object] = {}
    state_image.restore({"state": restored}, image)
    new_cluster, new_view = restored["cluster"], restored["view"]
    assert isinstance(new_cluster, Cluster)
    assert set(new_cluster._watchers) == {id(new_view)}
    assert new_cluster.changed_since(new_view) == cluster.changed_since(view)


def test_an_image_of_other_roots_is_refused() -> None:
    image = state_image.capture({"decider": PlacementDecider()})
    with pytest.raises(ValueError, match="holds"):
        state_image.restore({"ledger": {}}, image)


class Spec(msgspec.Struct, frozen=True, omit_defaults=True):
    priority: str = "training"
    share: float = 0.0
    tags: tuple[str, ...] = ()


def test_a_loaded_struct_encodes_as_the_original_did() -> None:
    """msgspec omits a field whose value is its default object, and encodes an equal value made elsewhere: a
    decision's bytes must not change because the state it came from was loaded."""
    made_elsewhere = Spec(priority="".join(["train", "ing"]), share=float("0"))
    state = {"default": Spec(), "equal": made_elsewhere, "same": made_elsewhere}
    before = [msgspec.json.encode(v) for v in state.values()]
    assert before == [b"{}", b'{"priority":"training","share":0.0}', b'{"priority":"training","share":0.0}']

    loaded: dict[str, Spec] = {}
    state_image.restore({"state": loaded}, state_image.capture({"state": state}))
    assert [msgspec.json.encode(v) for v in loaded.values()] == before
    assert loaded["equal"] is loaded["same"]  # shared, as it was


@dataclass(frozen=True, slots=True)
class Run:
    job: str
    gpus: float = 1.0


def test_slotted_and_frozen_dataclasses_come_back_whole_and_shared() -> None:
    run = Run("j1", 0.5)
    state = {"runs": [run, run, Slotted([3])]}
    loaded: dict[str, list[object]] = {}
    state_image.restore({"state": loaded}, state_image.capture({"state": state}))
    first, second, slotted = loaded["runs"]
    assert first == run and first is second and slotted == Slotted([3])
    with pytest.raises(AttributeError):
        first.job = "j2"  # type: ignore[misc]
