"""Binding times: when a value becomes known.

    STATIC  < ADAPTER < DYNAMIC
    (weights) (per tenant) (per request)

A value's binding time is the join (max) of the binding times it depends on.
"""

import enum

from stageml.errors import StageSpecError


class BindingTime(enum.IntEnum):
    """An ordered binding time; `join` is max, `parse` reads a name."""

    STATIC = 0
    ADAPTER = 1
    DYNAMIC = 2

    def join(self, *others: "BindingTime") -> "BindingTime":
        return max((self, *others))

    @classmethod
    def parse(cls, name: "str | BindingTime") -> "BindingTime":
        if isinstance(name, BindingTime):
            return name
        try:
            return cls[str(name).strip().upper()]
        except KeyError:
            raise StageSpecError(
                f"unknown binding time {name!r}: use one of static, adapter, dynamic"
            ) from None

    @property
    def label(self) -> str:
        return self.name.lower()
