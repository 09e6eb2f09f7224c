"""A copy is its own: strict raises where torch raises, every report belongs to exactly one copy,
and nothing of the shim's is left behind, whatever happens around a copy (issue 15).

Each test is a behaviour a user sees through ``copy.deepcopy``, ``deepcopy_shim.deepcopy``,
``find_nonleaf_tensors``, scopes and threads.
"""

from __future__ import annotations

import asyncio
import collections
import copy
import functools
import gc
import threading
import types
import warnings
from typing import Any, Dict, List

import pytest
import torch
import torch.nn as nn
from support.graphdiff import GraphDiff
from support.models import CachedActivationsNet, resolve, with_history

import deepcopy_shim
from deepcopy_shim import DetachedTensorsWarning, NonLeafTensorError

pytestmark = pytest.mark.filterwarnings("default::deepcopy_shim.DeepcopyShimWarning")


def warned(call: Any) -> List[DetachedTensorsWarning]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        call()
    return [w.message for w in caught if isinstance(w.message, DetachedTensorsWarning)]


def keep_alive_slot(memo: Dict[Any, Any]) -> type:
    return type(dict.get(memo, id(memo), []))


# --- 1. an explicit call is a copy of its own; a copy without a mode is exactly native -------


class AsksWhileCopied:
    """A library asking "would this copy detach anything?" inside its own __deepcopy__."""

    def __init__(self) -> None:
        self.t = with_history()
        self.found: Any = None

    def __deepcopy__(self, memo: Dict[int, Any]) -> Any:
        self.found = deepcopy_shim.find_nonleaf_tensors(self.t)
        return copy.deepcopy(self.t, memo)


def test_find_nonleaf_tensors_inside_a_native_copy_changes_nothing_of_it() -> None:
    obj = AsksWhileCopied()
    with pytest.raises(RuntimeError, match="graph leaves") as native:
        copy.deepcopy([obj])
    assert type(native.value) is RuntimeError  # torch's own refusal, not the shim's
    assert [(p, t is obj.t) for p, t in obj.found] == [("", True)]


class StrictInside:
    def __init__(self) -> None:
        self.t = with_history()
        self.refused: Any = None

    def __deepcopy__(self, memo: Dict[int, Any]) -> Any:
        try:
            deepcopy_shim.deepcopy(self.t, "strict")
        except NonLeafTensorError as refusal:
            self.refused = refusal
        return "copied"


def test_an_explicit_strict_copy_inside_a_native_copy_refuses_on_its_own() -> None:
    obj = StrictInside()
    assert copy.deepcopy([obj]) == ["copied"]  # the outer copy is native and completes
    assert obj.refused is not None and obj.refused.paths == ("",)
    assert obj.refused.tensors[0] is obj.t


def test_explicit_calls_inside_a_copy_in_another_mode_are_their_own() -> None:
    obj = {"outer": with_history(), "inner": AsksWhileCopied()}
    with deepcopy_shim.enabled("strict"):
        with pytest.raises(NonLeafTensorError) as refused:
            copy.deepcopy(obj)
    assert refused.value.paths == ("['outer']", "['inner'].t")
    (w,) = warned(lambda: deepcopy_shim.deepcopy(obj, "warn"))
    assert w.paths == ("['outer']", "['inner'].t")
    assert [p for p, _ in obj["inner"].found] == [""]  # its own copy, its own paths


# --- 2. strict is exactly as permissive as native --------------------------------------------


class FallsBack:
    """Catches torch's refusal inside a copy and copies a detached clone instead."""

    def __init__(self) -> None:
        self.t = with_history()

    def __deepcopy__(self, memo: Dict[int, Any]) -> FallsBack:
        new = FallsBack.__new__(FallsBack)
        try:
            new.t = copy.deepcopy(self.t, memo)
        except RuntimeError:
            new.t = self.t.detach().clone()
        return new


def test_strict_completes_a_copy_native_completes_by_catching_the_refusal() -> None:
    obj = {"model": nn.Linear(2, 2), "cache": FallsBack()}
    native = copy.deepcopy(obj)
    with deepcopy_shim.enabled("strict"), warnings.catch_warnings():
        warnings.simplefilter("error")
        strict = copy.deepcopy(obj)
    GraphDiff(obj, native, strict).check()
    assert strict["cache"].t.is_leaf and not strict["cache"].t.requires_grad  # the fallback's


def test_strict_raises_inside_the_refused_tensors_deepcopy_with_torchs_error_as_cause() -> None:
    seen: List[BaseException] = []

    class Sees:
        def __init__(self) -> None:
            self.t = with_history()

        def __deepcopy__(self, memo: Dict[int, Any]) -> Any:
            try:
                return copy.deepcopy(self.t, memo)
            except RuntimeError as exc:
                seen.append(exc)
                raise

    with pytest.raises(RuntimeError):
        copy.deepcopy(Sees())
    with deepcopy_shim.enabled("strict"), pytest.raises(NonLeafTensorError) as refused:
        copy.deepcopy(Sees())
    native, strict = seen
    assert isinstance(strict, RuntimeError) and strict is refused.value
    assert type(strict.__cause__) is type(native) and str(strict.__cause__) == str(native)
    assert "graph leaves" in str(strict)  # code looking for torch's words still finds them


# --- 3. no scope or enable() inside a copy loses a refusal or a report -----------------------


class OpensAScope:
    def __init__(self, mode: str) -> None:
        self.mode = mode
        self.t = with_history()

    def __deepcopy__(self, memo: Dict[int, Any]) -> Any:
        with deepcopy_shim.enabled(self.mode):
            return copy.deepcopy(self.__dict__, memo)


@pytest.mark.parametrize("order", ["before", "after"])
def test_a_warn_scope_inside_a_strict_copy_does_not_lose_the_refusal(order: str) -> None:
    outer = with_history()
    obj = [outer, OpensAScope("warn")] if order == "before" else [OpensAScope("warn"), outer]
    with deepcopy_shim.enabled("strict"), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(NonLeafTensorError) as refused:
            copy.deepcopy(obj)
    assert refused.value.tensors == (outer,)  # the inner scope's tensor is the inner copy's
    inner_warnings = [w for w in caught if w.category is DetachedTensorsWarning]
    assert len(inner_warnings) == (0 if order == "before" else 1)


def test_a_strict_scope_inside_a_warn_copy_refuses() -> None:
    obj = {"outer": with_history(), "inner": OpensAScope("strict")}
    with deepcopy_shim.enabled("warn"), warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing is announced for a copy that then fails
        with pytest.raises(NonLeafTensorError) as refused:
            copy.deepcopy(obj)
    assert refused.value.paths == ("['t']",)  # from the inner copy's own root: the inner dict


class EnablesAgain:
    def __init__(self, mode: str) -> None:
        self.mode = mode

    def __deepcopy__(self, memo: Dict[int, Any]) -> EnablesAgain:
        deepcopy_shim.enable(self.mode)  # a second enable() while the copy runs
        return EnablesAgain(self.mode)


def test_a_second_enable_during_a_strict_copy_refuses_at_the_first_tensor() -> None:
    deepcopy_shim.enable("strict")
    first = with_history()
    with pytest.raises(NonLeafTensorError) as refused:
        copy.deepcopy([first, EnablesAgain("strict"), with_history()])
    assert refused.value.tensors[0] is first


def test_a_second_enable_during_a_warn_copy_keeps_one_report() -> None:
    deepcopy_shim.enable("warn")
    obj = [with_history(), EnablesAgain("warn"), with_history()]
    (w,) = warned(lambda: copy.deepcopy(obj))
    assert w.paths == ("[0]", "[2]")


def test_another_thread_enabling_and_disabling_cannot_touch_a_copy_in_progress() -> None:
    started, done = threading.Event(), threading.Event()

    class Waits:
        def __deepcopy__(self, memo: Dict[int, Any]) -> Waits:
            started.set()
            assert done.wait(10)
            return Waits()

    def other() -> None:
        assert started.wait(10)
        for mode in ("strict", "silent", "warn", "off"):
            deepcopy_shim.enable(mode)
        done.set()

    thread = threading.Thread(target=other)
    thread.start()
    with deepcopy_shim.enabled("warn"):
        messages = warned(lambda: copy.deepcopy([with_history(), Waits(), with_history()]))
    thread.join()
    assert [m.paths for m in messages] == [("[0]", "[2]")]


# --- 4. a failed copy leaves nothing behind --------------------------------------------------


class Raises:
    def __deepcopy__(self, memo: Dict[int, Any]) -> None:
        raise ValueError("cannot copy this")


@pytest.mark.parametrize("mode", ["warn", "strict", "silent"])
def test_a_failed_copy_leaves_its_memo_plain_and_the_next_copy_reports_in_full(mode: str) -> None:
    memo: Dict[Any, Any] = {}
    copy.deepcopy([[]], memo)  # native starts the memo's keep-alive list
    kept = dict.get(memo, id(memo))
    failing = [with_history(), Raises()]
    # The scope ends with the error in flight: the failed copy's memo is found in its traceback.
    with pytest.raises((ValueError, NonLeafTensorError)), deepcopy_shim.enabled(mode):
        copy.deepcopy(failing, memo)
    assert dict.get(memo, id(memo)) is kept
    # Caught inside the scope, the error is handled before the scope ends: the memo gets its
    # list back at its next keep-alive, from any copy (here a native one), the very same list.
    # (Every object whose id the memo holds is kept alive to the end: a list freed after its
    # failed copy leaves its id in the memo, and a later list given that id is a memo hit.)
    second = [with_history(), Raises()]
    with deepcopy_shim.enabled(mode), pytest.raises((ValueError, NonLeafTensorError)):
        copy.deepcopy(second, memo)
    copy.deepcopy([[]], memo)
    assert dict.get(memo, id(memo)) is kept
    again = [with_history()]
    with deepcopy_shim.enabled("strict"), pytest.raises(NonLeafTensorError) as refused:
        copy.deepcopy(again, memo)
    assert refused.value.tensors == (again[0],)
    later = [with_history()]
    with deepcopy_shim.enabled("warn"):
        (w,) = warned(lambda: copy.deepcopy(later, memo))
    assert w.tensors == (later[0],) and keep_alive_slot(memo) is list


def test_a_module_copy_that_fails_leaves_nothing_open() -> None:
    model = CachedActivationsNet()
    model(torch.randn(3, 4))
    model.unpicklable = Raises()
    memo: Dict[Any, Any] = {}
    deepcopy_shim.enable("warn")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing is announced for a copy that fails
        with pytest.raises(ValueError):
            copy.deepcopy(model, memo)
    assert keep_alive_slot(memo) is list
    del model.unpicklable
    (w,) = warned(lambda: copy.deepcopy(model))
    assert w.paths == CachedActivationsNet.PATHS


def test_a_detached_copy_that_fails_and_is_caught_is_not_reported() -> None:
    class Bare(torch.Tensor):  # torch cannot deep-copy it even as a leaf
        pass

    class CatchesIt:
        def __init__(self) -> None:
            self.t = with_history().as_subclass(Bare)

        def __deepcopy__(self, memo: Dict[int, Any]) -> str:
            try:
                copy.deepcopy(self.t, memo)
            except deepcopy_shim.DetachedCopyError:
                return "fallback"
            return "copied"

    other = with_history()
    (w,) = warned(lambda: deepcopy_shim.deepcopy([CatchesIt(), other], "warn"))
    assert w.tensors == (other,)


# --- 5. reporting only reads -----------------------------------------------------------------


_OUTSIDE = (type, types.ModuleType, types.FunctionType, types.BuiltinFunctionType, str, int, float)


def _graph_of(root: Any) -> List[Any]:
    """Every object of the source graph (not classes, functions or modules, which deepcopy
    never copies and whose globals are the test's own)."""
    seen: Dict[int, Any] = {}
    stack = [root]
    while stack:
        obj = stack.pop()
        if id(obj) in seen or isinstance(obj, _OUTSIDE):
            continue
        seen[id(obj)] = obj
        stack.extend(gc.get_referents(obj))
    return list(seen.values())


def _referents(objects: List[Any]) -> List[List[int]]:
    # A tensor's autograd node gets its Python object (kept by torch) once anything names its
    # grad_fn, as printing the tensor does; the reports name it, so that one is not counted.
    return [sorted(id(r) for r in gc.get_referents(o) if not hasattr(r, "next_functions"))
            for o in objects]


def test_reporting_adds_no_instance_dict_or_attribute_to_the_source() -> None:
    class Recorder:
        def __init__(self) -> None:
            self.outputs: Dict[str, torch.Tensor] = {}

        def hook(self, name: str, module: nn.Module, args: Any, output: torch.Tensor) -> None:
            self.outputs[name] = output

    model = nn.Sequential(nn.Linear(2, 3), nn.ReLU())
    recorder = Recorder()
    model[0].register_forward_hook(functools.partial(recorder.hook, "block0"))
    model(torch.ones(1, 2))
    obj = {"model": model, "od": collections.OrderedDict(t=with_history()),
           "partial": functools.partial(print, with_history())}
    deepcopy_shim.deepcopy(obj, "silent")  # whatever copying itself touches, it has now
    objects = _graph_of(obj)
    before = _referents(objects)
    assert len(warned(lambda: deepcopy_shim.deepcopy(obj, "warn"))) == 1
    with pytest.raises(NonLeafTensorError) as refused:
        deepcopy_shim.deepcopy(obj, "strict")
    assert len(refused.value.paths) == 3 and len(deepcopy_shim.find_nonleaf_tensors(obj)) == 3
    assert _referents(objects) == before


# --- 6. paths follow Python access through containers a __getstate__ rebuilds ---------------


class Inner:
    def __init__(self) -> None:
        self.t = with_history()
        self.u = with_history()


class Batch:
    """A record type whose state turns each child into a dict of that child's own objects."""

    def __init__(self) -> None:
        self.inner = Inner()

    def __getstate__(self) -> Dict[str, Any]:
        return {"inner": dict(vars(self.inner))}

    def __setstate__(self, state: Dict[str, Any]) -> None:
        self.inner = Inner.__new__(Inner)
        self.inner.__dict__.update(state["inner"])


def test_paths_reach_through_containers_a_getstate_rebuilds_around_the_same_objects() -> None:
    batch = Batch()
    found = deepcopy_shim.find_nonleaf_tensors(batch)
    assert [p for p, _ in found] == ["inner.t", "inner.u"]
    for path, tensor in found:
        assert resolve(batch, path) is tensor


# --- 7. a refusal is surveyed once, as its copy ends, without copying data; reading runs nothing


class CountsCopies:
    copies = 0

    def __deepcopy__(self, memo: Dict[int, Any]) -> CountsCopies:
        CountsCopies.copies += 1
        return CountsCopies()


def test_a_refusal_is_surveyed_as_its_copy_ends_and_reading_it_copies_nothing(
        monkeypatch: pytest.MonkeyPatch) -> None:
    model = nn.Sequential(nn.Linear(64, 64), nn.Linear(64, 64))
    model[0].cached = model[0](torch.ones(1, 64))
    model[1].counter = CountsCopies()
    CountsCopies.copies = 0
    clones: List[Any] = []
    original_clone = torch.Tensor.clone
    monkeypatch.setattr(torch.Tensor, "clone",
                        lambda self, *a, **k: clones.append(self) or original_clone(self, *a, **k))
    with pytest.raises(RuntimeError, match="graph leaves"):
        copy.deepcopy(model)  # native: the parameters before the tensor are copied, then it fails
    native_clones, clones[:] = len(clones), []
    with deepcopy_shim.enabled("strict"), pytest.raises(NonLeafTensorError) as refused:
        copy.deepcopy(model)
    # the copy stopped at the tensor, as torch's does; its survey went on, copying no data
    assert CountsCopies.copies == 1 and len(clones) == native_clones == 2
    assert refused.value.paths == ("[0].cached",)
    assert str(refused.value).count("[0].cached") >= 1 and CountsCopies.copies == 1


def test_the_list_says_when_the_copy_cannot_be_followed_without_its_data() -> None:
    class NeedsValues:
        def __init__(self) -> None:
            self.w = torch.ones(2)

        def __deepcopy__(self, memo: Dict[int, Any]) -> NeedsValues:
            new = NeedsValues.__new__(NeedsValues)
            new.w = copy.deepcopy(self.w, memo)
            new.total = float(new.w.sum())  # reads the values: a stand-in has none
            return new

    first = with_history()
    obj = [first, NeedsValues(), with_history()]
    with deepcopy_shim.enabled("strict"), pytest.raises(NonLeafTensorError) as refused:
        copy.deepcopy(obj)
    assert refused.value.tensors == (first,)
    assert "The list may be incomplete" in str(refused.value)
    # find_nonleaf_tensors then makes the real copy instead, and is exact
    assert [p for p, _ in deepcopy_shim.find_nonleaf_tensors(obj)] == ["[0]", "[2]"]


# --- threads and tasks -------------------------------------------------------------------------


def test_two_threads_copying_in_warn_get_one_report_each() -> None:
    barrier = threading.Barrier(2)
    objects: Dict[int, List[Any]] = {}

    class Meets:
        def __deepcopy__(self, memo: Dict[int, Any]) -> Meets:
            barrier.wait(10)  # both copies are now in progress at once
            return Meets()

    def work(n: int) -> None:
        objects[n] = obj = [with_history(), Meets(), with_history()]
        with deepcopy_shim.enabled("warn"):
            copy.deepcopy(obj)

    threads = [threading.Thread(target=work, args=(n,)) for n in range(2)]
    # The warnings module is the process's: record in one place, then tell the copies apart
    # by the tensors each warning names.
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    messages = [w.message for w in caught if isinstance(w.message, DetachedTensorsWarning)]
    assert len(messages) == 2
    for obj in objects.values():
        (mine,) = [m for m in messages if m.tensors[0] is obj[0]]
        assert mine.tensors == (obj[0], obj[2]) and mine.paths == ("[0]", "[2]")


def test_two_asyncio_tasks_copying_in_strict_each_get_their_own_refusal() -> None:
    async def work(delay: float) -> Any:
        obj = {"t": with_history()}
        with deepcopy_shim.enabled("strict"):
            await asyncio.sleep(delay)
            try:
                copy.deepcopy(obj)
            except NonLeafTensorError as refusal:
                return refusal.tensors[0] is obj["t"]
        return None

    async def both() -> List[Any]:
        return list(await asyncio.gather(work(0.02), work(0.01)))

    assert asyncio.run(both()) == [True, True]


@pytest.mark.parametrize("grad_mode", [torch.no_grad, torch.inference_mode, torch.enable_grad])
def test_copies_under_any_grad_mode_behave_as_in_grad_mode(grad_mode: Any) -> None:
    model = CachedActivationsNet()
    model(torch.randn(3, 4))
    with grad_mode():
        with deepcopy_shim.enabled("strict"), pytest.raises(NonLeafTensorError) as refused:
            copy.deepcopy(model)
        assert refused.value.paths == CachedActivationsNet.PATHS
        (w,) = warned(lambda: deepcopy_shim.deepcopy(model, "warn"))
        assert w.paths == CachedActivationsNet.PATHS


# --- what a copy made is freed when it ends, as native deepcopy frees it ---------------------


class _Bare(torch.Tensor):  # torch cannot deep-copy it even as a leaf
    pass


def _cached_model() -> nn.Module:
    model = nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 8))
    model[0].cached = model[0](torch.ones(1, 8))
    return model


def _refused_and_read(mode: str, obj: Any) -> None:
    with pytest.raises(NonLeafTensorError) as refused:
        deepcopy_shim.deepcopy(obj, mode)
    assert refused.value.paths  # read: the survey runs
    del refused


def _fails(error: type, obj: Any) -> None:
    with pytest.raises(error):
        deepcopy_shim.deepcopy(obj, "warn")


FREED: Dict[str, Any] = {
    "warn": lambda: deepcopy_shim.deepcopy(_cached_model(), "warn"),
    "silent": lambda: deepcopy_shim.deepcopy([_cached_model()], "silent"),
    "strict, message read": lambda: _refused_and_read("strict", {"m": _cached_model()}),
    "a failed warn copy": lambda: _fails(ValueError, [_cached_model(), Raises()]),
    "a detached copy that fails": lambda: _fails(deepcopy_shim.DetachedCopyError,
                                                 [with_history().as_subclass(_Bare)]),
    "find_nonleaf_tensors": lambda: deepcopy_shim.find_nonleaf_tensors(_cached_model()),
}


@pytest.mark.parametrize("name", sorted(FREED))
def test_what_a_copy_made_is_freed_when_it_ends_without_the_garbage_collector(name: str) -> None:
    """No reference cycle through the shim's frames, scopes or errors: a partial copy on a GPU
    would otherwise hold device memory until the garbage collector happens to run."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        FREED[name]()  # warm: first-use caches are not garbage
        gc.collect()
        gc.disable()
        try:
            FREED[name]()
        finally:
            gc.enable()
    assert gc.collect() == 0


# --- what mutation testing of the record found unpinned --------------------------------------


def test_a_failed_detached_copy_caught_after_another_tensor_leaves_that_one_reported() -> None:
    """The failed tensor is taken out of the record among others met before it (multi-element
    tensors: anything but identity would compare their values)."""

    class Bare(torch.Tensor):
        pass

    class CatchesIt:
        def __init__(self) -> None:
            self.t = with_history(3).as_subclass(Bare)

        def __deepcopy__(self, memo: Dict[int, Any]) -> str:
            try:
                copy.deepcopy(self.t, memo)
            except deepcopy_shim.DetachedCopyError:
                return "fallback"
            return "copied"

    first, last = with_history(3), with_history(3)
    (w,) = warned(lambda: deepcopy_shim.deepcopy([first, CatchesIt(), last], "warn"))
    assert w.tensors == (first, last) and w.paths == ("[0]", "[2]")


def test_a_warn_copy_frees_its_memo_when_it_ends() -> None:
    """No frame of a finished copy is kept by the shim: the copy's memo (every object it made)
    is freed with the copy, as natively."""
    import weakref

    model = CachedActivationsNet()
    model(torch.randn(3, 4))
    with deepcopy_shim.enabled("warn"):
        warned(lambda: None)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            made = copy.deepcopy({"m": model})
    child = weakref.ref(made["m"].head)
    del made
    assert child() is None


class HidesItsKeepAliveList(dict):  # type: ignore[type-arg]
    """A memo whose `__getitem__` answers deepcopy's keep-alive lookup with a copy of the list."""

    def __getitem__(self, key: Any) -> Any:
        value = super().__getitem__(key)
        return list(value) if key == id(self) else value


def test_a_memo_that_hides_its_keep_alive_list_gets_one_warning_like_any_memo() -> None:
    obj = [with_history(), with_history()]
    with deepcopy_shim.enabled("warn"):
        messages = warned(lambda: copy.deepcopy(obj, HidesItsKeepAliveList()))
    assert [m.tensors for m in messages] == [(obj[0], obj[1])]  # the copy's end is its call's


class CopiesItsParentAfresh:
    """A child that deep-copies the module holding it, with a fresh memo, inside the copy."""

    def __init__(self, parent: nn.Module) -> None:
        self.parent = parent

    def __deepcopy__(self, memo: Dict[int, Any]) -> str:
        with deepcopy_shim.enabled("off"):
            copy.deepcopy(self.parent.fc)  # a native copy of part of the parent
        return "copied"


def test_a_nested_copy_of_the_root_module_does_not_end_the_root_copys_record() -> None:
    model = CachedActivationsNet()
    model(torch.randn(3, 4))
    model.sidecar = CopiesItsParentAfresh(model)
    model.after = with_history()  # met after the nested copy
    (w,) = warned(lambda: deepcopy_shim.deepcopy(model, "warn"))
    assert w.paths == (*CachedActivationsNet.PATHS, "after")


class RootAgainInside:
    """Deep-copies the root module again, with a fresh memo, from inside its copy."""

    def __init__(self) -> None:
        self.root: Any = None
        self.copying = False

    def __deepcopy__(self, memo: Dict[int, Any]) -> str:
        if not self.copying:  # once: the inner copy meets this object again
            self.copying = True
            try:
                with deepcopy_shim.enabled("silent"):
                    copy.deepcopy(self.root)  # the same module object, another (silent) copy
            finally:
                self.copying = False
        return "copied"


def test_the_root_module_copied_again_inside_does_not_finish_the_outer_record_early() -> None:
    model = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2))
    model[0].out = model[0](torch.ones(1, 2))
    again = RootAgainInside()
    again.root = model
    model[0].again = again  # the inner copy of the root runs while model[0] is being copied
    model[1].out = model[1](torch.ones(1, 2))
    (w,) = warned(lambda: deepcopy_shim.deepcopy(model, "warn"))
    assert w.paths == ("[0].out", "[1].out")


def test_a_scope_left_inside_its_own_copy_still_reports_that_copy() -> None:
    scope = deepcopy_shim.enabled("warn")

    class LeavesTheScope:
        def __deepcopy__(self, memo: Dict[int, Any]) -> str:
            scope.stop()  # left while the copy it made runs; the copy goes on
            return "left"

    obj = [with_history(), LeavesTheScope(), with_history()]
    deepcopy_shim.enable("silent")  # what applies once the scope is left
    scope.start()
    messages = warned(lambda: copy.deepcopy(obj))
    # One report, in the mode the copy began in: [2], met after the scope was left, too.
    assert [m.paths for m in messages] == [("[0]", "[2]")]
    assert deepcopy_shim.current_mode().mode == "silent"  # and what applies now is the global one
