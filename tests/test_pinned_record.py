"""What a copy's record does that mutation testing of `deepcopy_shim._record` found unpinned
(issue 20): which frames a copy's walk counts, who ends a record and when, which tensor a failed
copy takes out, and that nothing of a record outlives its copy.

Each test is a behaviour seen through `copy.deepcopy`, `deepcopy_shim.deepcopy`, scopes and
the warnings; where the promise is about the shim's own bookkeeping (a count left behind), the
test reads that bookkeeping.
"""

from __future__ import annotations

import copy
import functools
import importlib.util
import sys
import types
import warnings
from typing import Any, Dict, List

import pytest
import torch
import torch.nn as nn
import wrapt
from support.models import CachedActivationsNet, cached_activations_net, with_history

import deepcopy_shim
from deepcopy_shim import DetachedCopyError, DetachedTensorsWarning, _record

pytestmark = pytest.mark.filterwarnings("default::deepcopy_shim.DeepcopyShimWarning")

PATHS = CachedActivationsNet.PATHS


def warned(call: Any) -> List[DetachedTensorsWarning]:
    """The `DetachedTensorsWarning`s `call()` emits, none filtered."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        call()
    return [w.message for w in caught if isinstance(w.message, DetachedTensorsWarning)]


class _Bare(torch.Tensor):  # torch cannot deep-copy it even as a leaf
    pass


# --- frames that look like copy.deepcopy's but are not ----------------------------------------


@pytest.fixture(scope="module")
def copy_twin() -> types.ModuleType:
    """A second instance of the standard library's copy module (a vendored or reloaded
    copy.py): its deepcopy's code object compares equal to `copy.deepcopy`'s but is not it."""
    spec = importlib.util.spec_from_file_location("_deepcopy_shim_test_copy_twin", copy.__file__)
    assert spec is not None and spec.loader is not None
    twin = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(twin)
    assert twin.deepcopy.__code__ == copy.deepcopy.__code__
    assert twin.deepcopy.__code__ is not copy.deepcopy.__code__
    return twin


def test_a_tensor_copied_by_another_copy_modules_deepcopy_is_reported_as_the_root(
        copy_twin: types.ModuleType) -> None:
    """Only `copy.deepcopy`'s own frames are copy frames: a tensor copied by another copy
    module's deepcopy is copied (not a KeyError) and reported as met by no copy frame."""
    deepcopy_shim.enable("warn")
    tensor = with_history()
    copied: List[Any] = []
    (w,) = warned(lambda: copied.append(copy_twin.deepcopy(tensor)))
    assert copied[0].is_leaf and torch.equal(copied[0], tensor)
    assert w.tensors == (tensor,) and w.paths == ("",)
    assert str(w).startswith("deepcopy_shim: deep copy of a Tensor detached 1 tensor")


def test_a_module_copied_by_another_copy_modules_deepcopy_is_reported_tensor_by_tensor(
        copy_twin: types.ModuleType) -> None:
    """Another copy module's deepcopy does not ask copy's own dispatch table: the shim does not
    see its copy start, and each tensor with history it meets is a copy of its own (a direct
    `__deepcopy__` call): one warning each, naming the tensor itself."""
    deepcopy_shim.enable("warn")
    net = cached_activations_net()
    messages = warned(lambda: copy_twin.deepcopy(net))
    assert [m.paths for m in messages] == [("",)] * 3
    assert [m.tensors for m in messages] == [(net.head.last_out,), (net.cache["mid"],),
                                             (net.cache["list"][0],)]
    assert all(str(m).startswith("deepcopy_shim: deep copy of a Tensor detached 1") for m in messages)


class CopiedThroughPartial:
    """Its `__deepcopy__` is `functools.partial(copy.deepcopy, payload)`: deepcopy's frame for
    the payload is called by deepcopy's frame for this object, with no frame between."""

    def __init__(self, payload: Any) -> None:
        self.payload = payload
        self.__deepcopy__ = functools.partial(copy.deepcopy, payload)


def test_a_deepcopy_called_by_deepcopy_directly_still_ends_and_reports_its_copy() -> None:
    deepcopy_shim.enable("warn")
    payload = [with_history()]
    (w,) = warned(lambda: copy.deepcopy(CopiedThroughPartial(payload)))
    assert w.tensors == (payload[0],) and w.paths == ("payload[0]",)
    assert _record.current() is None


class ScopedInside:
    """A `__deepcopy__` that copies its tensor itself, directly, inside a scope of its own."""

    def __init__(self) -> None:
        self.t = with_history()

    def __deepcopy__(self, memo: Dict[int, Any]) -> Any:
        with deepcopy_shim.enabled("warn"):
            return ("copied", self.t.__deepcopy__(memo))  # type: ignore[no-untyped-call]


def test_a_direct_tensor_copy_at_a_scopes_boundary_is_a_copy_of_its_own() -> None:
    """The scope's boundary is the frame that entered it, here the very frame that calls the
    tensor's `__deepcopy__`: the copy around it is not looked at, the tensor is its own root."""
    holder = ScopedInside()
    (w,) = warned(lambda: copy.deepcopy([holder]))  # the shim is off outside the scope
    assert w.tensors == (holder.t,) and w.paths == ("",)
    assert str(w).startswith("deepcopy_shim: deep copy of a Tensor detached 1 tensor")


# --- a failed tensor copy takes out exactly its own entry -------------------------------------


class CopiesBothCatchesOne:
    """Copies two equal one-element tensors itself (direct calls: both met under the same
    frames); the second cannot be copied even detached, and the failure is caught."""

    def __init__(self) -> None:
        self.a = with_history(1)
        self.b = with_history(1).as_subclass(_Bare)

    def __deepcopy__(self, memo: Dict[int, Any]) -> List[Any]:
        a = self.a.__deepcopy__(memo)  # type: ignore[no-untyped-call]
        try:
            self.b.__deepcopy__(memo)  # type: ignore[no-untyped-call]
        except DetachedCopyError:
            pass
        return [a]


def test_a_failed_tensor_copy_takes_out_its_own_entry_not_an_equal_one() -> None:
    """Entries are told apart by identity: `a` and `b` are equal in value, met under the same
    frames, and only `b` failed."""
    deepcopy_shim.enable("warn")
    obj = CopiesBothCatchesOne()
    (w,) = warned(lambda: copy.deepcopy(obj))
    assert w.tensors == (obj.a,) and w.paths == ("a",)


class FirstFailsThenCopies:
    """Its first tensor cannot be copied even detached (caught); then it copies another one."""

    def __init__(self) -> None:
        self.bad = with_history().as_subclass(_Bare)
        self.good = with_history()

    def __deepcopy__(self, memo: Dict[int, Any]) -> Any:
        try:
            copy.deepcopy(self.bad, memo)
        except DetachedCopyError:
            pass
        return ("copied", copy.deepcopy(self.good, memo))


def test_a_tensor_met_under_frames_a_failed_tensor_first_met_is_still_reported() -> None:
    """The copy completes and reports the tensors it detached, also when the frames a tensor was
    met under were first met by a tensor whose copy failed."""
    deepcopy_shim.enable("warn")
    first, obj = with_history(), FirstFailsThenCopies()
    (w,) = warned(lambda: copy.deepcopy([first, obj]))
    assert w.tensors == (first, obj.good)
    assert w.paths[0] == "[0]"


def test_a_tensor_met_under_frames_a_failed_tensor_first_met_has_its_path() -> None:
    """The failed tensor is not reported, but the way the copy went to it stays known: the
    next tensor met under the same frames is named by its path."""
    deepcopy_shim.enable("warn")
    obj = FirstFailsThenCopies()
    (w,) = warned(lambda: copy.deepcopy([with_history(), obj]))
    assert w.paths == ("[0]", "[1].good")


# --- the paths --------------------------------------------------------------------------------


class RaisesOnCompare:
    """Copies its tensors one by one itself; `==` raises for anything but its own kind (as a
    pandas object's does for a list)."""

    def __init__(self) -> None:
        self.a = with_history()
        self.b = with_history()

    def __eq__(self, other: object) -> bool:
        raise TypeError("RaisesOnCompare is not comparable")

    __hash__ = object.__hash__

    def __deepcopy__(self, memo: Dict[int, Any]) -> Any:
        return ("copied", copy.deepcopy(self.a, memo), copy.deepcopy(self.b, memo))


def test_making_the_paths_never_compares_the_copied_objects() -> None:
    deepcopy_shim.enable("warn")
    obj = RaisesOnCompare()
    (w,) = warned(lambda: copy.deepcopy([obj]))
    assert w.paths == ("[0].a", "[0].b")


def test_a_tensor_inside_a_tensor_has_the_shortest_path_from_where_its_copy_was_met() -> None:
    """`inner` is met while its holder `outer` is copied (as `outer.cached`), under
    the list that holds both: its path is the list's own step, not one through `outer`."""
    deepcopy_shim.enable("warn")
    outer, inner = with_history(), with_history()
    outer.cached = inner  # type: ignore[attr-defined]
    (w,) = warned(lambda: copy.deepcopy({"m": [outer, inner]}))
    assert w.tensors == (outer, inner)
    assert w.paths == ("['m'][0]", "['m'][1]")


def test_a_path_is_the_shortest_way_from_the_objects_the_copy_went_through() -> None:
    """Each tensor's path starts from the furthest object up its copy's way that was located
    when the way was first taken: `t1` and `t3` are reached through `x` but also directly from
    the root, and are named by the direct way, also when met under a frame already used."""
    deepcopy_shim.enable("warn")
    t1, t2, t3 = with_history(), with_history(), with_history()
    x = {"t1": t1, "t2": t2, "c": [t3]}
    root = {"x": x, "alias1": t1, "alias3": t3}  # "x" first: the copy meets every tensor there
    (w,) = warned(lambda: copy.deepcopy(root))
    assert w.tensors == (t1, t2, t3)
    assert w.paths == ("['alias1']", "['x']['t2']", "['alias3']")


# --- who ends a record, and when ---------------------------------------------------------------


class KeepsItsOwnTemporaries:
    """A `__deepcopy__` that keeps a temporary alive in the memo by hand, as `copy._keep_alive`
    does (`memo[id(memo)].append(...)`), between copying its two tensors."""

    def __init__(self) -> None:
        self.a = with_history()
        self.b = with_history()

    def __deepcopy__(self, memo: Dict[int, Any]) -> Any:
        a = copy.deepcopy(self.a, memo)
        scratch = [a]
        memo.setdefault(id(memo), []).append(scratch)
        return ("copied", a, copy.deepcopy(self.b, memo))


def test_only_deepcopys_keep_alive_append_of_the_root_ends_its_copy() -> None:
    deepcopy_shim.enable("warn")
    obj = KeepsItsOwnTemporaries()
    (w,) = warned(lambda: copy.deepcopy(obj))
    assert w.paths == ("a", "b")


class HidesItsKeepAliveList(dict):  # type: ignore[type-arg]
    """A memo whose `__getitem__` answers deepcopy's keep-alive lookup with a copy of the list."""

    def __getitem__(self, key: Any) -> Any:
        value = super().__getitem__(key)
        return list(value) if key == id(self) else value


def _hide_keep_alive(wrapped: Any, instance: Any, args: Any, kwargs: Any) -> Any:
    value = wrapped(*args, **kwargs)
    return list(value) if args[0] == id(instance) else value


class WrapsDictsGetitem(dict):  # type: ignore[type-arg]
    """The same, with `__getitem__` a wrapt wrapper of dict's own: it compares equal to
    `dict.__getitem__` (wrapt proxies do) but is not it."""

    __getitem__ = wrapt.FunctionWrapper(dict.__getitem__, _hide_keep_alive)


@pytest.mark.parametrize("memo_class", [HidesItsKeepAliveList, WrapsDictsGetitem])
def test_a_memo_whose_getitem_is_not_dicts_own_gets_one_warning_like_any_memo(memo_class: Any) -> None:
    """The copy's end is its first call's end, whatever the memo does with its keep-alive list:
    one warning, every tensor, and nothing left running."""
    assert memo_class.__getitem__ is not dict.__getitem__
    obj = [with_history(), with_history()]
    with deepcopy_shim.enabled("warn"):
        messages = warned(lambda: copy.deepcopy(obj, memo_class()))
        assert _record.current() is None
    assert [m.tensors for m in messages] == [(obj[0], obj[1])]


def test_nothing_of_a_copy_outlives_it_finished_or_failed() -> None:
    """Every copy, of a module or of anything else, finished or failed, leaves no copy running
    in its thread."""
    deepcopy_shim.enable("warn")
    net = cached_activations_net()
    assert len(warned(lambda: copy.deepcopy(net))) == 1
    assert _record.current() is None
    assert len(warned(lambda: copy.deepcopy({"t": with_history()}))) == 1
    assert _record.current() is None
    with deepcopy_shim.enabled("warn"):
        assert len(warned(lambda: copy.deepcopy(net))) == 1
        assert len(warned(lambda: copy.deepcopy([net, with_history()]))) == 1
    assert _record.current() is None
    net.unpicklable = _Raises()  # type: ignore[assignment]
    with pytest.raises(ValueError):
        copy.deepcopy(net)
    assert _record.current() is None


class _Raises:
    def __deepcopy__(self, memo: Dict[int, Any]) -> None:
        raise ValueError("cannot copy this")


class CopiesTheRootAgain:
    """Deep-copies the root module again, with a fresh memo, in a scope of its own (warn or
    silent), from inside the root's copy."""

    def __init__(self, mode: str) -> None:
        self.mode = mode
        self.root: Any = None
        self.copying = False

    def __deepcopy__(self, memo: Dict[int, Any]) -> str:
        if not self.copying:  # once: the inner copy meets this object again
            self.copying = True
            try:
                with deepcopy_shim.enabled(self.mode):
                    copy.deepcopy(self.root)
            finally:
                self.copying = False
        return "copied"


@pytest.mark.parametrize("mode", ["silent", "warn"])
def test_an_inner_copy_of_the_root_module_neither_ends_nor_reports_the_outer_copy(mode: str) -> None:
    """Only the module copier that owns a record ends it: the same module copied again inside
    its copy (by another copier frame) leaves the outer record open to the end."""
    model = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2))
    model[0].out = model[0](torch.ones(1, 2))
    again = CopiesTheRootAgain(mode)
    again.root = model
    model[0].again = again  # type: ignore[assignment]
    model[1].out = model[1](torch.ones(1, 2))
    messages = warned(lambda: deepcopy_shim.deepcopy(model, "warn"))
    inner = [("[0].out", "[1].out")] if mode == "warn" else []
    assert [m.paths for m in messages] == [*inner, ("[0].out", "[1].out")]


class ComparesByTag(nn.Linear):
    """A module with an `==` of its own, defined for its own kind only."""

    tag = "a"

    def __eq__(self, other: object) -> bool:
        return bool(self.tag == other.tag)  # type: ignore[attr-defined]

    __hash__ = nn.Linear.__hash__


class CopiesAModuleExplicitly:
    """Inside the outer copy, makes a copy of its own of a module (deepcopy_shim.deepcopy)."""

    def __init__(self, module: nn.Module) -> None:
        self.module = module

    def __deepcopy__(self, memo: Dict[int, Any]) -> Any:
        return deepcopy_shim.deepcopy(self.module, "warn")


def test_a_module_copier_finds_its_record_by_identity_among_the_threads_open_ones() -> None:
    """The open record of the outer copy (a list) is not compared with the module: a module
    whose `==` fails on a list still copies, and each copy reports its own tensors."""
    module = ComparesByTag(2, 2)
    module.out = module(torch.ones(1, 2))
    first = with_history()
    deepcopy_shim.enable("warn")
    messages = warned(lambda: copy.deepcopy([first, CopiesAModuleExplicitly(module)]))
    assert [m.paths for m in messages] == [("out",), ("[0]",)]


class EnablesWarn:
    """Its copy changes the global setting: a scope (the global one) ends inside a running copy."""

    def __deepcopy__(self, memo: Dict[int, Any]) -> EnablesWarn:
        deepcopy_shim.enable("warn")
        return EnablesWarn()


def test_a_setting_changed_inside_a_tensors_copy_never_compares_the_root() -> None:
    """The records the change ends are told running or failed by the root's identity: a
    tensor root (whose `==` is elementwise, and ambiguous as a truth) copies on and reports."""
    t = torch.ones(3, requires_grad=True)
    t.cache = with_history(2)
    t.hook = EnablesWarn()
    deepcopy_shim.enable("warn")
    with pytest.warns(DetachedTensorsWarning) as caught:
        new = copy.deepcopy(t)
    (warning,) = caught
    assert warning.message.paths == ("cache",)  # type: ignore[union-attr]
    assert new.cache.is_leaf and new.cache.requires_grad and torch.equal(new.cache, t.cache)


class ExceptIdiom:
    """The "deep-copy all but" idiom: its `__deepcopy__` hides itself and one attribute, copies
    itself again with the same memo (so the root's keep-alive append is made twice, first from
    a frame that is not the root's), then copies what it left out."""

    def __init__(self) -> None:
        self.early = with_history()
        self.extra = with_history(3)

    def __deepcopy__(self, memo: Dict[int, Any]) -> ExceptIdiom:
        extra = self.extra
        self.__deepcopy__, self.extra = None, None  # type: ignore[method-assign,assignment]
        try:
            new = copy.deepcopy(self, memo)
        finally:
            del self.__dict__["__deepcopy__"]
            self.extra = extra
        del new.__dict__["__deepcopy__"]
        new.extra = copy.deepcopy(extra, memo)
        return new


def test_a_root_that_copies_itself_again_is_one_copy_reported_once() -> None:
    """Only the root's own frame ends its copy.  Frames are allocated in a different order on
    each round (the frames made and freed before it), so the inner frame's id falls both below
    and above the root's: no order of ids can stand for their identity."""
    deepcopy_shim.enable("warn")
    for round_ in range(40):
        made_and_freed = [sys._getframe() for _ in range(round_ % 7)]
        del made_and_freed
        with pytest.warns(DetachedTensorsWarning) as caught:
            new = copy.deepcopy(ExceptIdiom())
        assert [w.message.paths for w in caught] == [("early", "extra")], round_  # type: ignore[union-attr]
        assert new.extra.is_leaf and new.early.is_leaf and "__deepcopy__" not in vars(new)
