"""Objects that compare loosely or answer for others: the unusual inputs that tell identity from
equality, and a memo that answers for the copy (as pyro's does)."""

from __future__ import annotations

import ctypes
from typing import Any

import torch


class EqualsEveryClass(type):
    """A metaclass under which a class compares equal to every class (a matcher, a class
    registry keyed loosely): identity is all that tells two classes apart."""

    def __eq__(cls, other: object) -> bool:
        return isinstance(other, type)

    __hash__ = type.__hash__


class EqualsEverything:
    """Instances compare equal to every object, as ``unittest.mock.ANY`` does; hashed by
    identity."""

    def __eq__(self, other: object) -> bool:
        return True

    __hash__ = object.__hash__


class SuppliesTagged(dict):  # type: ignore[type-arg]
    """A memo that answers a detached alias for every tensor tagged ``supplied`` (as pyro's
    memo does for all of them), so the copy never meets those."""

    def get(self, key: Any, default: Any = None) -> Any:
        result = super().get(key, default)
        if result is default:
            old = ctypes.cast(key, ctypes.py_object).value
            if isinstance(old, torch.Tensor) and getattr(old, "supplied", False):
                self[key] = result = old.detach()
        return result
