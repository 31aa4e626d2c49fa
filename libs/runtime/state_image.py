"""A service's in-memory state as bytes, and back into the same live objects.

A handler names its state's roots (`snapshot_roots()`: the decider, a ledger, an executor's books). `capture`
pickles them; `restore` loads the bytes and puts each root's state back into the live object, in place, so
whoever holds a reference to it (admission's API holds its decider) sees the restored state.

Pickle rather than a schema of each decider's fields: the restored state must make exactly the decisions the
original would have made, and those depend on more than the deciders' data (the placer's caches, the order
of every dict, numpy arrays). Pickle copies the whole object graph as it is: shared references stay shared,
dicts keep their order. Two things it cannot carry are handled here:

- references from inside the state back to a root: a root is never copied, a reference to it loads as the
  live root;
- registries keyed by `id(obj)` (`Cluster._watchers`: which array views have seen which changes): a loaded
  object has another id, so each registry is re-keyed to its objects' new ids;
- which fields of a msgspec Struct hold their default object itself: with `omit_defaults`, msgspec leaves a
  field out of the encoding when its value *is* the default (an equal string or float made elsewhere is
  encoded), and a decision's bytes (so its chain link) must not change because its state was loaded. A
  Struct is stored as the fields that are not their default object, and loaded through its constructor,
  which gives the others their default object again.

Loading pickled bytes runs code named in them: `restore` is only ever given bytes whose SHA-256 matched the
manifest the service itself wrote (libs/runtime/snapshots.py), from a store only the service may write to.
"""

from __future__ import annotations

import contextvars
import dataclasses
import functools
import io
import pickle
from collections.abc import Mapping
from typing import Any

import msgspec

from libs.core.cluster.model import Cluster

# Per class, the attribute holding a registry keyed by id(obj).
IDENTITY_KEYED: Mapping[type, str] = {Cluster: "_watchers"}
PROTOCOL = 5

# The live roots while loading: what a back-reference to a root loads as.
_LIVE: contextvars.ContextVar[Mapping[str, object]] = contextvars.ContextVar("live_roots")
_NO_DEFAULT = object()  # never any field's value


def _live_root(name: str) -> object:
    return _LIVE.get()[name]


def _struct(cls: type[msgspec.Struct], values: tuple[object, ...], defaulted: tuple[int, ...]) -> msgspec.Struct:
    """The Struct with these field values, the `defaulted` ones left to the constructor's default object."""
    names = _struct_fields(cls)[0]
    fields = dict(zip(names, values, strict=True))
    for i in defaulted:
        del fields[names[i]]
    return cls(**fields)


def _one_of_a_kind(value: object) -> bool:
    """Is there only ever one such object (so that pickle gives back the very same)?"""
    if value is None or value is _NO_DEFAULT or isinstance(value, bool):
        return True
    if type(value) is int:
        return -5 <= value <= 256  # CPython's small ints
    return type(value) in (str, tuple) and not value  # the empty string and the empty tuple


@functools.cache
def _struct_fields(cls: type[msgspec.Struct]) -> tuple[tuple[str, ...], tuple[object, ...], tuple[int, ...]]:
    """A Struct type's field names, each one's default object (_NO_DEFAULT for none or a factory's), and the
    fields whose default object pickle would not give back as itself."""
    fields = msgspec.structs.fields(cls)
    defaults = tuple(_NO_DEFAULT if f.default is msgspec.NODEFAULT else f.default for f in fields)
    return tuple(f.name for f in fields), defaults, tuple(i for i, d in enumerate(defaults) if not _one_of_a_kind(d))


def _struct_reduction(obj: msgspec.Struct) -> Any:
    _, defaults, unique = _struct_fields(type(obj))
    if not unique:
        return NotImplemented
    values = msgspec.structs.astuple(obj)
    defaulted = tuple(i for i in unique if values[i] is defaults[i])
    if not defaulted:
        return NotImplemented  # msgspec's own reduction gives the same (none holds its default object)
    return _struct, (type(obj), tuple(values), defaulted)


def _slotted(cls: type, values: tuple[object, ...]) -> object:
    obj: object = object.__new__(cls)
    for name, value in zip(_dataclass_fields(cls), values, strict=True):
        object.__setattr__(obj, name, value)
    return obj


_FIELDS: dict[type, tuple[str, ...]] = {}


def _dataclass_fields(cls: type) -> tuple[str, ...]:
    names = _FIELDS.get(cls)
    if names is None:
        names = _FIELDS[cls] = tuple(f.name for f in dataclasses.fields(cls))
    return names


class _Pickler(pickle.Pickler):
    def __init__(self, file: io.BytesIO, roots: Mapping[str, object]) -> None:
        super().__init__(file, protocol=PROTOCOL)
        self.root_names = {id(obj): name for name, obj in roots.items()}
        # Every object pickled (but the builtin containers and scalars the pickler never shows us), by id.
        self.seen: dict[int, object] = {}
        self.registries: list[object] = []

    def reducer_override(self, obj: Any) -> Any:
        name = self.root_names.get(id(obj))
        if name is not None:
            return _live_root, (name,)
        if isinstance(obj, msgspec.Struct):  # a value: never a key of an identity-keyed registry
            return _struct_reduction(obj)
        self.seen[id(obj)] = obj
        if type(obj) in IDENTITY_KEYED:
            self.registries.append(obj)
        elif _slotted_dataclass(type(obj)):
            # What the dataclass's own __getstate__ does, without looking its fields up for every object.
            cls = type(obj)
            return _slotted, (cls, tuple(getattr(obj, name) for name in _dataclass_fields(cls)))
        return NotImplemented


_SLOTTED: dict[type, bool] = {}


def _slotted_dataclass(cls: type) -> bool:
    """Is it a dataclass with slots only, pickled through the __getstate__ dataclasses generate (which looks the
    fields up again for every object: most of the time a large state takes to encode)?"""
    known = _SLOTTED.get(cls)
    if known is None:
        getstate = getattr(getattr(cls, "__getstate__", None), "__name__", "")
        known = _SLOTTED[cls] = (dataclasses.is_dataclass(cls) and getstate == "_dataclass_getstate"
                                 and all("__dict__" not in vars(c) for c in cls.__mro__[:-1]))
    return known


def _state_of(obj: object) -> object:
    if isinstance(obj, dict):
        return dict(obj)
    return obj.__getstate__()


def _set_state(obj: object, state: Any) -> None:
    if isinstance(obj, dict):
        obj.clear()
        obj.update(state)
        return
    setstate = getattr(type(obj), "__setstate__", None)
    if setstate is not None:
        setstate(obj, state)
        return
    attrs, slots = state if isinstance(state, tuple) else (state, None)
    if attrs is not None or hasattr(obj, "__dict__"):
        live = vars(obj)
        live.clear()
        live.update(attrs or {})
    for key, value in (slots or {}).items():
        setattr(obj, key, value)


def capture(roots: Mapping[str, object]) -> bytes:
    """The roots' whole state, as bytes for `restore`."""
    buffer = io.BytesIO()
    pickler = _Pickler(buffer, roots)
    pickler.dump({name: _state_of(obj) for name, obj in roots.items()})
    # The second record shares the first's memo: its objects are references to those already written.
    fixups = []
    for registry in pickler.registries:
        attr = IDENTITY_KEYED[type(registry)]
        entries = getattr(registry, attr)
        # An entry whose object is not part of the state belonged to an object gone since: dropped.
        fixups.append((registry, attr, [(pickler.seen[key], value) for key, value in entries.items()
                                        if key in pickler.seen]))
    pickler.dump(fixups)
    return buffer.getvalue()


def restore(roots: Mapping[str, object], image: bytes) -> None:
    """Put the state `capture` took back into the live roots (the same names, the same kinds of object)."""
    token = _LIVE.set(roots)
    try:
        unpickler = pickle.Unpickler(io.BytesIO(image))
        states = unpickler.load()
        fixups = unpickler.load()
    finally:
        _LIVE.reset(token)
    if set(states) != set(roots):
        raise ValueError(f"state image holds {sorted(states)}, the service has {sorted(roots)}")
    for name, obj in roots.items():
        _set_state(obj, states[name])
    for registry, attr, entries in fixups:
        setattr(registry, attr, {id(obj): value for obj, value in entries})
