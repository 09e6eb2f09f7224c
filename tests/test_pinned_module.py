"""The module copier's behaviours that a mutation run of ``_module`` found unpinned (issue 20).

Each test copies a model with the shim (``copy.deepcopy`` in mode silent, or another mode) and
natively (the shim off), and compares the two object graphs with ``support.graphdiff``: the
shim's shortcuts must make exactly what native deepcopy makes, for every value a module's state
can hold.  The survivors that no input can tell apart from the code as written are in
``tools/mutation-equivalents/_module.toml``.
"""

from __future__ import annotations

import copy
from typing import Any, Dict

import pytest
import torch.nn as nn
from support.graphdiff import GraphDiff, native_and_shim

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning:torch")


def same_as_native(source: Any, mode: str = "silent") -> Any:
    """The shim's copy of ``source``, after checking it is the graph native deepcopy makes."""
    native, shim = native_and_shim(source, mode)
    GraphDiff(source, native, shim).check()
    return shim


class _EqualsEveryClass(type):
    """A metaclass under which a class compares equal to every class (a matcher, a class
    registry keyed loosely): identity is all that tells two classes apart."""

    def __eq__(cls, other: object) -> bool:
        return isinstance(other, type)

    __hash__ = type.__hash__


class LooseSet(set, metaclass=_EqualsEveryClass):  # type: ignore[type-arg]
    """A set subclass of a class that compares equal to set, dict, OrderedDict, tuple..."""


class _ParameterEqualsEveryClass(type(nn.Parameter)):  # type: ignore[misc]
    def __eq__(cls, other: object) -> bool:
        return isinstance(other, type)

    __hash__ = type.__hash__


class LooseParameter(nn.Parameter, metaclass=_ParameterEqualsEveryClass):
    """A Parameter subclass with its own __deepcopy__, of a class that compares equal to
    nn.Parameter: deepcopy calls the subclass's, never Parameter's."""

    def __deepcopy__(self, memo: Dict[int, Any]) -> Any:
        made = super().__deepcopy__(memo)
        made.own_deepcopy = True
        return made


# --- sets and hook dicts met twice: one copy, found in the memo ---------------------------


def _hook(module: nn.Module, args: Any, output: Any) -> None:
    pass


def test_a_set_of_atoms_shared_by_two_attributes_and_two_modules_stays_one_set() -> None:
    """A non-empty set of atoms met again (another attribute, another module) is the copy
    memoised the first time, as natively."""
    names = {"a", "b"}
    model = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2))
    model[0].names = model[0].again = model[1].names = names
    copied = same_as_native(model)
    assert copied[0].names is copied[0].again is copied[1].names
    assert copied[0].names == names and copied[0].names is not names


def test_a_hook_dict_of_functions_shared_by_two_modules_stays_one_dict() -> None:
    """A non-empty hook dict of functions met again (two modules holding the same one) is the
    copy memoised the first time, as natively."""
    model = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2))
    model[0].register_forward_hook(_hook)
    model[1]._forward_hooks = model[0]._forward_hooks
    copied = same_as_native(model)
    assert copied[1]._forward_hooks is copied[0]._forward_hooks
    assert list(copied[0]._forward_hooks.values()) == [_hook]


# --- classes that compare equal to the types the shortcuts are for ------------------------


def test_a_set_subclass_equal_to_set_is_copied_by_its_own_reduction() -> None:
    """Only an exact set takes the set shortcut: a subclass whose class compares equal to set
    is copied by its reduction, keeping its type and instance state."""
    model = nn.Linear(2, 2)
    model.tags = LooseSet({"a", "b"})
    model.tags.note = "kept"  # type: ignore[attr-defined]
    copied = same_as_native(model)
    assert type(copied.tags) is LooseSet and copied.tags.note == "kept"


def test_a_parameter_subclass_equal_to_parameter_keeps_its_own_deepcopy() -> None:
    """Only an exact nn.Parameter is copied by calling Parameter.__deepcopy__ directly: a
    subclass whose class compares equal to Parameter gets its own __deepcopy__."""
    model = nn.Linear(2, 2)
    model.weight = LooseParameter(model.weight.detach().clone())
    copied = same_as_native(model)
    assert type(copied.weight) is LooseParameter and copied.weight.own_deepcopy
