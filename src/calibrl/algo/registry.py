"""Named registries of the algorithm core: a formula becomes selectable by decorating it.

``@ESTIMATORS.register("grpo")`` above a function is all it takes for a config to name it: the config schema's
enums are read from the registries (``calibrl.config.schema``), and the trainers look formulas up by name.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

T = TypeVar("T")


class Registry(Generic[T]):
    """Names -> objects of one kind (advantage estimators, loss aggregations, KL estimators)."""

    def __init__(self, kind: str):
        self.kind = kind
        self._items: dict[str, T] = {}

    def register(self, name: str, *aliases: str) -> Callable[[T], T]:
        """Decorator: register the decorated object under ``name`` (and ``aliases``); returns it unchanged."""

        def add(obj: T) -> T:
            for key in (name, *aliases):
                if key in self._items and self._items[key] is not obj:
                    raise ValueError(f"{self.kind} {key!r} is registered already ({self._items[key]!r})")
                self._items[key] = obj
            return obj

        return add

    def __getitem__(self, name: str) -> T:
        try:
            return self._items[name]
        except KeyError:
            raise ValueError(f"unknown {self.kind} {name!r}; choose one of {self.names()}") from None

    def __contains__(self, name: object) -> bool:
        return name in self._items

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def names(self) -> list[str]:
        return sorted(self._items)

    def unregister(self, name: str) -> None:
        """Remove ``name`` (tests that register a formula of their own clean up with this)."""
        self._items.pop(name, None)
