"""One copy, one report: each tensor named once, whatever code inside the copy does, in any task.

- A `__deepcopy__` that copies an attribute without passing the memo (a common idiom) makes one
  copy meet the same tensor twice: it is named once, at the first place the copy met it, by
  warn, strict and `find_nonleaf_tensors` alike.
- Which copy is running never depends on what a scope's exit leaves behind: a copy in a task
  made inside a scope that has since ended stays one copy while code inside it enters and
  leaves scopes of its own (`deepcopy_shim.deepcopy()` inside a `__deepcopy__`).
- Naming is linear in the tensors named, whatever the keys of the dicts that hold them (the
  forward-hook idiom `activations[module] = output`, tensors as keys).
"""

from __future__ import annotations

import asyncio
import copy
import threading
import warnings
from typing import Any, Callable, Dict, List, Tuple

import pytest
import torch
import torch.nn as nn
from support.models import with_history

import deepcopy_shim
from deepcopy_shim import DetachedTensorsWarning, NonLeafTensorError, _dispatch


def warned(call: Callable[[], Any]) -> List[DetachedTensorsWarning]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        call()
    return [w.message for w in caught if isinstance(w.message, DetachedTensorsWarning)]


def refused(call: Callable[[], Any]) -> NonLeafTensorError:
    with pytest.raises(NonLeafTensorError) as info:
        call()
    return info.value


# --- a tensor met twice -------------------------------------------------------------------------


class CopiesTwice:
    """Copies its tensor without the memo (its own copy of it), then with it."""

    def __init__(self) -> None:
        self.t = with_history()

    def __deepcopy__(self, memo: Dict[Any, Any]) -> CopiesTwice:
        new = CopiesTwice.__new__(CopiesTwice)
        memo[id(self)] = new
        new.t = copy.deepcopy(self.t)
        new.same = copy.deepcopy(self.t, memo)
        return new


def test_a_tensor_a_copy_meets_twice_is_named_once_by_every_mode() -> None:
    root = {"first": CopiesTwice(), "other": with_history()}
    (warning,) = warned(lambda: deepcopy_shim.deepcopy(root, "warn"))
    expected = ["['first'].t", "['other']"]
    assert list(warning.paths) == expected
    assert str(warning).startswith("deepcopy_shim: deep copy of a dict detached 2 tensors")
    assert [path for path, _ in deepcopy_shim.find_nonleaf_tensors(root)] == expected
    error = refused(lambda: deepcopy_shim.deepcopy(root, "strict"))
    assert list(error.paths) == expected
    assert warning.tensors == error.tensors == (root["first"].t, root["other"])


# --- a scope left inside a copy, in a task whose scope has ended ---------------------------------


class EntersAScope:
    """Makes a copy of its own, in a scope of its own, while it is copied."""

    def __deepcopy__(self, memo: Dict[Any, Any]) -> Any:
        return deepcopy_shim.deepcopy([1, 2], "silent")


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.cached = with_history()


def _in_a_task_made_in_an_ended_scope(copier: Callable[[], Any], scope_mode: str) -> Any:
    async def main() -> Any:
        with deepcopy_shim.enabled(scope_mode):
            later = asyncio.get_running_loop().create_task(_run(copier))  # it runs after the scope
        return await later

    async def _run(call: Callable[[], Any]) -> Any:
        return call()

    return asyncio.run(main())


@pytest.mark.parametrize("scope_mode", ["silent", "off"])
def test_a_copy_in_a_task_made_in_an_ended_scope_stays_one_copy_across_a_scope_inside_it(
        scope_mode: str) -> None:
    deepcopy_shim.enable("warn")
    root = [EntersAScope(), with_history(), Block(), {"t": with_history()}]
    modules: List[Any] = []
    original = _dispatch.copy_module

    def counting(module: Any, memo: Any) -> Any:
        modules.append(module)
        return original(module, memo)

    _dispatch.copy_module = counting  # type: ignore[assignment]
    try:
        caught = warned(lambda: _in_a_task_made_in_an_ended_scope(lambda: copy.deepcopy(root), scope_mode))
    finally:
        _dispatch.copy_module = original  # type: ignore[assignment]
    assert [list(w.paths) for w in caught] == [["[1]", "[2].cached", "[3]['t']"]]
    assert modules == [root[2]]  # the shim's module copier went on after the scope inside


def test_a_strict_copy_in_a_task_made_in_an_ended_scope_names_everything_after_a_scope_inside() -> None:
    deepcopy_shim.enable("strict")
    root = [EntersAScope(), with_history(), {"t": with_history()}]
    error = refused(lambda: _in_a_task_made_in_an_ended_scope(lambda: copy.deepcopy(root), "silent"))
    assert list(error.paths) == ["[1]", "[2]['t']"]
    assert str(error).startswith("deepcopy_shim: refused to copy a list holding 2 tensors")


# --- naming is linear, whatever the keys ---------------------------------------------------------


class CountingDict(dict):  # type: ignore[type-arg]
    """A dict that counts the items read through `items()`: the work of a scan of it."""

    read = 0

    def items(self) -> Any:
        CountingDict.read += len(self)
        return super().items()


def _hooks_idiom(n: int, keys: str) -> Tuple[Any, int]:
    layers = [nn.Identity() for _ in range(n)]
    activations = CountingDict()
    for i, layer in enumerate(layers):
        key = layer if keys == "modules" else torch.ones(1) * 0 + i if keys == "tensors" else (i, layer)
        activations[key] = with_history()
    return {"layers": layers, "activations": activations}, n


@pytest.mark.parametrize("keys", ["modules", "tensors", "tuples with a module"])
@pytest.mark.parametrize("door", ["warn", "strict", "find"])
def test_naming_reads_a_dict_with_unspellable_keys_a_bounded_number_of_times(keys: str, door: str) -> None:
    def named(root: Any) -> List[str]:
        if door == "warn":
            (warning,) = warned(lambda: deepcopy_shim.deepcopy(root, "warn"))
            return list(warning.paths)
        if door == "strict":
            return list(refused(lambda: deepcopy_shim.deepcopy(root, "strict")).paths)
        return [p for p, _ in deepcopy_shim.find_nonleaf_tensors(root)]

    reads = []
    for n in (100, 200):
        root, count = _hooks_idiom(n, keys)
        CountingDict.read = 0
        paths = named(root)
        assert len(paths) == count
        assert all(p.startswith("['activations'] <under a key of this CountingDict") for p in paths)
        reads.append(CountingDict.read)
    # The copy reads the dict once (its reduction), a survey once more, and naming a bounded
    # number of times (a search, a table): not once per tensor, so twice the tensors, twice
    # the reads.
    assert reads[0] <= 8 * 100 and reads[1] == 2 * reads[0], reads


# --- a copy is made in the mode it began in -------------------------------------------------------


class LeavesTheScope:
    """Leaves, while it is copied, the scope the copy began in (its `stop()` called in a
    `__deepcopy__`), or has another thread disable the shim."""

    def __init__(self, leave: Callable[[], None]) -> None:
        self.leave = leave

    def __deepcopy__(self, memo: Dict[Any, Any]) -> str:
        self.leave()
        return "left"


@pytest.mark.parametrize("how", ["the scope's stop()", "disable() in another thread"])
def test_a_copy_goes_on_in_the_mode_it_began_in_whatever_is_switched_off_meanwhile(how: str) -> None:
    if how == "the scope's stop()":
        scope = deepcopy_shim.enabled("warn")
        scope.start()
        leave = scope.stop
    else:
        deepcopy_shim.enable("warn")

        def leave() -> None:
            thread = threading.Thread(target=deepcopy_shim.disable)
            thread.start()
            thread.join(20)

    root = [with_history(), LeavesTheScope(leave), {"t": with_history()}]
    (warning,) = warned(lambda: copy.deepcopy(root))
    assert list(warning.paths) == ["[0]", "[2]['t']"]
    assert deepcopy_shim.current_mode() is None  # and off once the copy has ended
    assert not deepcopy_shim._patch.state() == "installed"
