"""Behaviours no test held (issue 28): each of these tests fails with a plausible bug seeded
into the package (named in its docstring) and passes without it."""

from __future__ import annotations

import copy
import warnings
from collections import OrderedDict
from typing import Any, Dict, List

import pytest
import torch
import torch.nn as nn
from support.models import resolve, with_history

import deepcopy_shim
from deepcopy_shim import DetachedCopyError, DetachedTensorsWarning, NonLeafTensorError

MODES = ["warn", "silent", "strict"]


class Bare(torch.Tensor):
    """A tensor subclass torch cannot deep-copy even as a leaf (no `new_empty` of its own)."""


class CatchesItsOnlyTensor:
    """Copies its one tensor with history; torch fails on its detached copy; it falls back."""

    def __init__(self) -> None:
        self.t = with_history().as_subclass(Bare)

    def __deepcopy__(self, memo: Dict[int, Any]) -> str:
        try:
            copy.deepcopy(self.t, memo)
        except DetachedCopyError:
            return "fallback"
        return "copied"


@pytest.mark.parametrize("door", ["scope", "deepcopy()", "enable()"])
def test_warn_says_nothing_when_the_only_tensor_it_met_failed_and_the_copy_completed(door: str) -> None:
    """Seeded: a record that reports when it met any tensor (not only one it detached) warns
    "detached 0 tensors", which `-W error` turns into a failure of a completed copy."""
    root = {"held": CatchesItsOnlyTensor()}
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # any warning at all fails the copy
        if door == "scope":
            with deepcopy_shim.enabled("warn"):
                made = copy.deepcopy(root)
        elif door == "deepcopy()":
            made = deepcopy_shim.deepcopy(root, "warn")
        else:
            deepcopy_shim.enable("warn")
            made = copy.deepcopy(root)
    assert made == {"held": "fallback"}


def test_warn_says_nothing_however_many_tensors_it_met_all_failed() -> None:
    """The same with 300 tensors, each failed and caught: counts past Python's small-int cache
    are compared by value (`is not` on two lengths of 300 would report 0 detached tensors)."""
    root = [CatchesItsOnlyTensor() for _ in range(300)]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with deepcopy_shim.enabled("warn"):
            made = copy.deepcopy(root)
    assert made == ["fallback"] * 300


def test_strict_on_a_direct_deepcopy_call_has_torchs_error_as_its_cause() -> None:
    """Seeded: the refusal of a tensor copied with no deepcopy frame above it (the caller
    calls `t.__deepcopy__({})` itself) raised without its cause."""
    tensor = with_history()
    with deepcopy_shim.enabled("strict"), pytest.raises(NonLeafTensorError) as refused:
        tensor.__deepcopy__({})
    cause = refused.value.__cause__
    assert type(cause) is RuntimeError and "graph leaves" in str(cause)
    assert refused.value.paths == ("",) and refused.value.tensors == (tensor,)


class LookupFails(Exception):
    pass


class AsksElsewhere(nn.Module):
    """A module whose `__getattr__` raises something other than AttributeError for names it
    does not know (a config lookup that raises its own error)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(2, 2)

    def __getattr__(self, name: str) -> Any:
        try:
            return super().__getattr__(name)
        except AttributeError:
            raise LookupFails(name) from None


@pytest.mark.parametrize("mode", [None, "off", *MODES])
def test_a_getattr_that_raises_another_error_for_deepcopy_raises_it_as_natively(mode: Any) -> None:
    """Seeded: the module descriptor catching every exception of a class's `__getattr__` (not
    only AttributeError), so the copy goes on where native raises."""
    model = AsksElsewhere()
    with pytest.raises(LookupFails, match="__deepcopy__"):
        copy.deepcopy(model)  # natively
    if mode is None:  # the patch installed, no mode in this thread
        deepcopy_shim.enable("warn")
        with deepcopy_shim.enabled("off"), pytest.raises(LookupFails, match="__deepcopy__"):
            copy.deepcopy(model)
        return
    with deepcopy_shim.enabled(mode), pytest.raises(LookupFails, match="__deepcopy__"):
        copy.deepcopy(model)


class Caches(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(2, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.last = self.fc(x)
        return self.last


def _named_sequential() -> nn.Sequential:
    seq = nn.Sequential(OrderedDict(first=Caches(), second=Caches()))
    seq(torch.ones(1, 2))
    return seq


def _trimmed_sequential() -> nn.Sequential:
    seq = nn.Sequential(Caches(), Caches(), Caches())
    seq(torch.ones(1, 2))
    del seq[0]  # the members keep their names "1" and "2"; seq[0] is the one named "1"
    return seq


@pytest.mark.parametrize("make", [_named_sequential, _trimmed_sequential])
def test_a_sequential_member_is_spelled_by_its_position(make: Any) -> None:
    """Seeded: a Sequential's member spelled by its name (`.first.last`, `[1].last`), which
    `Sequential.__getitem__` does not read (it takes a position)."""
    seq = make()
    expected = ["[0].last", "[1].last"]
    found = [path for path, _ in deepcopy_shim.find_nonleaf_tensors(seq)]
    assert found == expected
    for path, tensor in deepcopy_shim.find_nonleaf_tensors(seq):
        assert resolve(seq, path) is tensor
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        deepcopy_shim.deepcopy(seq, "warn")
    (warning,) = [w.message for w in caught if isinstance(w.message, DetachedTensorsWarning)]
    assert list(warning.paths) == expected
    with deepcopy_shim.enabled("strict"), pytest.raises(NonLeafTensorError) as refused:
        copy.deepcopy(seq)
    assert list(refused.value.paths) == expected


class ReadsItsValues:
    """An object whose `__setstate__` reads its tensor's values (so the survey, which has
    stand-ins without data, cannot follow it, and the real copy is made) and warns on its own."""

    def __init__(self) -> None:
        self.t = with_history()

    def __setstate__(self, state: Dict[str, Any]) -> None:
        self.__dict__.update(state)
        if float(self.t.detach().sum()) > 0:  # a stand-in on the meta device has no values
            warnings.warn("ReadsItsValues: restored with a positive sum", UserWarning, stacklevel=2)


def test_find_nonleaf_tensors_passes_on_the_other_warnings_of_the_copy_it_makes() -> None:
    """Seeded: the real copy `find_nonleaf_tensors` falls back to swallowing every warning it
    caught, not only the shim's own."""
    obj = ReadsItsValues()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        found = deepcopy_shim.find_nonleaf_tensors(obj)
    assert [path for path, _ in found] == ["t"]
    theirs: List[Any] = [w for w in caught if w.category is UserWarning]
    assert [str(w.message) for w in theirs] == ["ReadsItsValues: restored with a positive sum"]
    assert not [w for w in caught if w.category is DetachedTensorsWarning]
