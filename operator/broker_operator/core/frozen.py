"""``replace`` for the core's frozen state classes: ``dataclasses.replace`` at a fraction of its cost.

Why: the engine runs two decision steps per heartbeat, and each step rebuilds its state
with about five replaces of ``EngineState`` (20 fields) and ``BrokerKnowledge``.
``dataclasses.replace`` reads every field through ``getattr`` and calls ``__init__``;
at 2,000 clusters that was a fifth of the operator's CPU (bench/bench_operator.py,
docs/benchmarks.md). Copying the instance dictionary and updating it gives the same
object for a frozen dataclass whose ``__init__`` only stores its fields, which is what
the state classes are. Any other class (``__post_init__``, ``init=False`` fields,
``__slots__``) goes through ``dataclasses.replace`` unchanged.
"""

from __future__ import annotations

import dataclasses
from typing import Any, TypeVar

__all__ = ["replace"]

T = TypeVar("T")

# Per class: its field names if the fast path applies to it, else None.
_PLAIN_FIELDS: dict[type, frozenset[str] | None] = {}


def _plain_fields(cls: type) -> frozenset[str] | None:
    if not dataclasses.is_dataclass(cls) or hasattr(cls, "__post_init__") or hasattr(cls, "__slots__"):
        return None
    fields = dataclasses.fields(cls)
    if any(not f.init for f in fields):
        return None
    return frozenset(f.name for f in fields)


def replace(obj: T, /, **changes: Any) -> T:
    """A copy of ``obj`` with ``changes``, as ``dataclasses.replace`` returns it."""
    cls = type(obj)
    try:
        names = _PLAIN_FIELDS[cls]
    except KeyError:
        names = _PLAIN_FIELDS[cls] = _plain_fields(cls)
    if names is None or not names.issuperset(changes):
        return dataclasses.replace(obj, **changes)  # type: ignore[type-var]  # its TypeError for a bad name
    copy = object.__new__(cls)
    state = copy.__dict__  # a frozen dataclass refuses setattr, not its own dictionary
    state.update(obj.__dict__)
    state.update(changes)
    return copy
