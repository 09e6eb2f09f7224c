"""A copy's record lives exactly as long as its copy; a report holds no graph.

Native means torch without the shim; for tensors with history the *detaching oracle* is native
deepcopy with each such tensor ``t`` copied as torch copies ``t.detach()`` through the same memo,
then given ``t.requires_grad``.
"""

from __future__ import annotations

import asyncio
import contextvars
import copy
import gc
import sys
import threading
import types
import warnings
import weakref
from typing import Any, Callable, ClassVar, Dict, List, Optional, Set, Tuple

import pytest
import torch
import torch.nn as nn
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.models import CachedActivationsNet, cached_activations_net, with_history
from support.processes import in_a_thread

import deepcopy_shim
from deepcopy_shim import DetachedTensorsWarning, NonLeafTensorError, _module, _record


def warned(call: Callable[[], Any]) -> List[DetachedTensorsWarning]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        call()
    return [w.message for w in caught if isinstance(w.message, DetachedTensorsWarning)]


def found(obj: Any) -> List[str]:
    return [path for path, _ in deepcopy_shim.find_nonleaf_tensors(obj)]


def refusal(obj: Any, memo: Optional[Dict[Any, Any]] = None) -> NonLeafTensorError:
    with deepcopy_shim.enabled("strict"), pytest.raises(NonLeafTensorError) as info:
        copy.deepcopy(obj, memo)
    return info.value


def incomplete(error: BaseException) -> bool:
    return "may be incomplete" in " ".join(str(error).split())


# --- 1. a retry after a failed copy ---------------------------------------------------------


class FailsFirst:
    """Its copy fails the first time (a flaky resource), and works after."""

    def __init__(self) -> None:
        self.failures = 1

    def __deepcopy__(self, memo: Dict[int, Any]) -> FailsFirst:
        if self.failures:
            self.failures -= 1
            raise ValueError("not now")
        return FailsFirst()


def _copy_here(obj: Any, memo: Optional[Dict[Any, Any]]) -> Any:
    return copy.deepcopy(obj, memo)  # one call site for every attempt: the same frames each time


@pytest.mark.parametrize("door", ["enable", "scope"])
def test_a_retry_after_a_failed_copy_with_a_kept_memo_warns_like_a_fresh_copy(door: str) -> None:
    obj = [with_history(), FailsFirst()]
    kept: Dict[Any, Any] = {}

    def fails() -> None:
        with pytest.raises(ValueError):
            _copy_here(obj, kept)

    def attempts() -> List[List[DetachedTensorsWarning]]:
        return [warned(fails), warned(lambda: _copy_here(obj, None))]

    if door == "enable":
        deepcopy_shim.enable("warn")
        first, second = attempts()
    else:
        with deepcopy_shim.enabled("warn"):
            first, second = attempts()
    assert first == []  # nothing is said of a copy that failed
    assert [w.paths for w in second] == [("[0]",)]


def _shim_objects(memo: Dict[Any, Any]) -> List[Any]:
    """Objects of deepcopy_shim's own classes among a memo's values and its keep-alive list."""
    values = list(dict.values(memo))
    values += [v for v in values if type(v) is list for v in v]
    return [v for v in values if type(v).__module__.startswith("deepcopy_shim")]


@pytest.mark.parametrize("mode", ["warn", "silent", "strict"])
def test_nothing_of_the_shim_stays_in_a_memo_the_caller_owns(mode: str) -> None:
    failing = [with_history(), FailsFirst()]
    memo: Dict[Any, Any] = {}
    with deepcopy_shim.enabled(mode), pytest.raises((ValueError, NonLeafTensorError)):
        copy.deepcopy(failing, memo)
    assert type(memo.get(id(memo), [])) is list and not _shim_objects(memo)
    kept: Dict[Any, Any] = {}
    with deepcopy_shim.enabled("warn" if mode == "strict" else mode), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        copy.deepcopy({"a": [with_history(), nn.Linear(2, 2)]}, kept)
    assert type(kept[id(kept)]) is list and not _shim_objects(kept)


# --- 2. a scope's mode ends with the scope ------------------------------------------------------


def _native_refusal(obj: Any) -> bool:
    try:
        copy.deepcopy(obj)
    except RuntimeError as exc:
        return type(exc) is RuntimeError and "graph leaves" in str(exc)
    return False


def test_a_task_made_in_a_scope_that_copies_after_the_scope_ended_copies_natively() -> None:
    model = cached_activations_net()

    async def later() -> Tuple[Any, bool, bool]:
        return deepcopy_shim.current_mode(), deepcopy_shim.is_enabled(), _native_refusal(model)

    async def main() -> Tuple[Any, bool, bool]:
        with deepcopy_shim.enabled("silent"):
            task = asyncio.get_running_loop().create_task(later())  # it runs after the scope
        return await task

    assert asyncio.run(main()) == (None, False, True)


def test_a_dead_scope_never_overrides_the_global_mode_in_a_task_it_made() -> None:
    model = cached_activations_net()
    deepcopy_shim.enable("strict")

    async def later() -> Tuple[str, Any]:
        try:
            copy.deepcopy(model)
        except NonLeafTensorError:
            outcome = "refused by strict"
        else:
            outcome = "copied"
        return outcome, deepcopy_shim.current_mode().mode  # type: ignore[union-attr]

    @deepcopy_shim.enabled("silent")
    async def decorated() -> asyncio.Task[Tuple[str, Any]]:
        return asyncio.get_running_loop().create_task(later())

    async def main() -> Tuple[str, Any]:
        task = await decorated()  # the decorator's scope ended as the call returned
        return await task

    assert asyncio.run(main()) == ("refused by strict", deepcopy_shim.Mode.STRICT)


def test_a_context_copied_in_a_scope_and_run_after_it_in_a_thread_is_outside_it() -> None:
    with deepcopy_shim.enabled("silent"):
        context = contextvars.copy_context()
        assert context.run(deepcopy_shim.is_enabled)
    seen: List[Any] = []
    thread = threading.Thread(target=lambda: seen.append(context.run(
        lambda: (deepcopy_shim.current_mode(), _native_refusal(cached_activations_net())))))
    thread.start()
    thread.join()
    assert seen == [(None, True)]


# --- 3. a report holds no graph ------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["warn", "strict"])
def test_recorded_reports_keep_no_source_tensor_alive(mode: str) -> None:
    sources: List[weakref.ref[torch.Tensor]] = []
    reports: List[Any] = []
    with warnings.catch_warnings(record=True) as caught, deepcopy_shim.enabled(mode):
        warnings.simplefilter("always")
        for _ in range(20):
            net = cached_activations_net()
            sources += [weakref.ref(net.head.last_out), weakref.ref(net.cache["mid"])]
            try:
                copy.deepcopy(net)
            except NonLeafTensorError as exc:
                assert exc.paths == CachedActivationsNet.PATHS  # read: the answer is final
                # Kept as a log keeps a report: without the tracebacks, whose frames hold the
                # copy's objects for any error, native's too.
                exc.__traceback__ = exc.__cause__.__traceback__ = None  # type: ignore[union-attr]
                reports.append(exc)
            del net
        reports += [w.message for w in caught if isinstance(w.message, DetachedTensorsWarning)]
    gc.collect()
    assert len(reports) == 20
    assert [ref() for ref in sources] == [None] * 40  # what silent keeps: nothing
    for report in reports:
        assert report.paths == CachedActivationsNet.PATHS and report.tensors == (None, None, None)
        assert "grad_fn=AddmmBackward0" in str(report)  # what it says stays


class Holds:
    def __init__(self, tensor: torch.Tensor) -> None:
        self.t = tensor


class CountsCopyFrames:
    """Copied last: counts the frames of copy functions (`copy`'s and the shim's module
    copier's) that are alive at that moment but not on the stack: frames of calls that have
    returned, kept alive by something."""

    seen: ClassVar[List[int]] = []

    def __deepcopy__(self, memo: Dict[int, Any]) -> CountsCopyFrames:
        gc.collect()
        files = {copy.__file__, _module.__file__}
        running: Set[int] = set()
        frame: Optional[types.FrameType] = sys._getframe()
        while frame is not None:
            running.add(id(frame))
            frame = frame.f_back
        returned = [o for o in gc.get_objects()  # type(): no object's __class__ code runs
                    if type(o) is types.FrameType and o.f_code.co_filename in files
                    and id(o) not in running]
        CountsCopyFrames.seen.append(len(returned))
        return CountsCopyFrames()


class Caches(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(2, 2)
        self.last = with_history()


@pytest.mark.parametrize("kind", ["objects", "modules"])
@pytest.mark.parametrize("mode", ["silent", "warn"])
def test_a_copy_keeps_no_frame_of_the_objects_it_has_finished_copying(mode: str, kind: str) -> None:
    # warn names each tensor from the copy frames above it, read as the tensor is met; it may
    # hold the frames of the last tensor's way down until the next tensor is met, but the frames
    # of every object already copied (and everything their locals hold) must not live on until
    # the copy ends: 200 objects left about 1,000 frames behind that way.
    returned = []
    for size in (50, 200):
        made = (nn.ModuleList(Caches() for _ in range(size)) if kind == "modules"
                else [Holds(with_history()) for _ in range(size)])
        CountsCopyFrames.seen = []
        with warnings.catch_warnings(), deepcopy_shim.enabled(mode):
            warnings.simplefilter("ignore")
            copy.deepcopy([made, CountsCopyFrames()])
        returned += CountsCopyFrames.seen
    # At most one way down to a tensor, whatever the number of objects. For a Holds, 7 frames:
    # deepcopy and _deepcopy_list of the list, deepcopy and _reconstruct of a Holds, deepcopy and
    # _deepcopy_dict of its state, deepcopy of the tensor. For a module, 9 (the module copier's
    # among them); 2 more where torch keeps `_modules` in an OrderedDict (torch 2.0), which
    # deepcopy reaches through its own frame and _reconstruct's.
    way_down = 7 if kind == "objects" else 9 + 2 * (type(nn.Module()._modules) is not dict)
    assert returned[0] == returned[1] <= (way_down if mode == "warn" else 0), returned


def test_a_finalizer_that_copies_while_warn_reads_the_way_down_changes_nothing() -> None:
    # The garbage collector can run whenever warn's walk up the copy frames allocates, and a
    # finalizer it runs (here: a callback of the collector's, to pick the moment) may copy a
    # tensor with history: that copy joins the one running, in the middle of its walk.
    snapshot = with_history()
    obj = [[[Holds(with_history())] for _ in range(6)], with_history(), [with_history()]]
    walking = {_record.Copy.node_of.__code__, _record.Copy._read.__code__}
    fired: List[int] = []

    def collecting(phase: str, info: Dict[str, Any]) -> None:
        frame: Optional[types.FrameType] = sys._getframe(1)
        while phase == "start" and frame is not None:
            if frame.f_code in walking:
                fired.append(frame.f_lineno)
                copy.deepcopy(snapshot)  # what a finalizer run by this collection may do
                return
            frame = frame.f_back

    (expected,) = warned(lambda: deepcopy_shim.deepcopy(obj, "warn"))
    threshold = gc.get_threshold()
    gc.callbacks.append(collecting)
    gc.set_threshold(1)
    try:
        (got,) = warned(lambda: deepcopy_shim.deepcopy(obj, "warn"))
    finally:
        gc.set_threshold(*threshold)
        gc.callbacks.remove(collecting)
    assert fired  # it ran inside the walk
    # The finalizer's copies ran inside this one, so its warning names them too, as tensors
    # copied during another tensor's copy; the rest are named as without them.
    inside = " <copied by Tensor.__deepcopy__>"
    assert [p for p in got.paths if not p.endswith(inside)] == list(expected.paths)
    assert all(t is snapshot for p, t in zip(got.paths, got.tensors) if p.endswith(inside))


def test_a_reports_tensors_are_the_source_tensors_while_they_live() -> None:
    net = cached_activations_net()
    (w,) = warned(lambda: deepcopy_shim.deepcopy(net, "warn"))
    assert w.tensors == (net.head.last_out, net.cache["mid"], net.cache["list"][0])
    assert refusal(net).tensors == w.tensors


# --- 4. strict, warn and find name the same tensors, each once ----------------------------------


class Doubles:
    """Its state holds its weight and a tensor with history made afresh from it at every
    reduction: the copy meets a tensor the survey never meets, and the survey its own."""

    def __init__(self) -> None:
        self.w = torch.ones(2, requires_grad=True)

    def __getstate__(self) -> Dict[str, Any]:
        return {"w": self.w, "scaled": self.w * 2}


@pytest.mark.parametrize("memo", [None, "kept"])
def test_a_tensor_a_reduction_makes_is_named_once_by_every_mode(memo: Optional[str]) -> None:
    root = {"d": Doubles(), "t": with_history()}
    expected = ["['d'] <rebuilt from what Doubles.__getstate__ returns>", "['t']"]
    assert [p for w in warned(lambda: deepcopy_shim.deepcopy(root, "warn")) for p in w.paths] == expected
    assert found(root) == expected
    error = refusal(root, {} if memo else None)
    assert list(error.paths) == expected and not incomplete(error)
    assert str(error).startswith("deepcopy_shim: refused to copy a dict holding 2 tensors")


# --- 5. storages shared as torch shares a leaf's ----------------------------------------------------


def _hidden() -> torch.Tensor:
    return torch.randn(8, 64, 96, requires_grad=True) * 1  # 192 KiB with history


@pytest.mark.parametrize("order", ["base first", "view first", "views only"])
def test_tensors_of_one_storage_copied_together_still_share_one(order: str) -> None:
    hidden = _hidden()
    first, second = hidden[1:3], hidden[2:5, 4:]
    together = {"base": hidden, "view": first} if order == "base first" else (
        {"view": first, "base": hidden} if order == "view first" else {"a": first, "b": second})
    with deepcopy_shim.enabled("silent"):
        made = copy.deepcopy(together)
    storages = {t.untyped_storage().data_ptr() for t in made.values()}
    assert len(storages) == 1
    for key, tensor in made.items():
        assert torch.equal(tensor, together[key].detach()) and tensor.stride() == together[key].stride()
    # One copy of the whole storage, as torch makes for leaf views of one base.
    assert next(iter(made.values())).untyped_storage().nbytes() == hidden.untyped_storage().nbytes()
    (a, made_a), (b, made_b) = made.items()  # and sit where the source tensors sit
    assert made_a.data_ptr() - made_b.data_ptr() == together[a].data_ptr() - together[b].data_ptr()


class CopiesInAScope:
    """Copies its `held` inside a scope of its own, with the memo it is given or a fresh one,
    through `copy.deepcopy` or the tensor's own `__deepcopy__`."""

    def __init__(self, held: torch.Tensor, memo: str, door: str) -> None:
        self.held, self.memo, self.door = held, memo, door

    def __deepcopy__(self, memo: Dict[int, Any]) -> CopiesInAScope:
        own = memo if self.memo == "same memo" else {}
        with deepcopy_shim.enabled("silent"):
            held = (copy.deepcopy(self.held, own) if self.door == "deepcopy"
                    else self.held.__deepcopy__(own))
        return CopiesInAScope(held, self.memo, self.door)


@pytest.mark.parametrize("door", ["deepcopy", "Tensor.__deepcopy__"])
@pytest.mark.parametrize("memo", ["same memo", "fresh memo"])
@pytest.mark.parametrize("order", ["inner first", "outer first", "base inside"])
def test_a_copy_made_in_a_scope_inside_another_shares_storages_as_leaves_would(
        order: str, memo: str, door: str) -> None:
    # A custom __deepcopy__ that enters a scope of its own starts a copy of its own; with the
    # memo it was given, torch's storage memo (the memo's) makes leaves of one storage share one
    # across the two, so tensors with history must too.  With a fresh memo nothing is shared.
    def build(hidden: torch.Tensor) -> List[Any]:
        view = hidden[1:3]
        if order == "base inside":
            return [view, CopiesInAScope(hidden, memo, door)]
        inner = CopiesInAScope(view, memo, door)
        return [inner, hidden[2:5]] if order == "inner first" else [hidden[2:5], inner]

    def storages(made: List[Any]) -> int:
        tensors = [x.held if isinstance(x, CopiesInAScope) else x for x in made]
        return len({t.untyped_storage().data_ptr() for t in tensors})

    leaves = build(torch.randn(6, 8))
    native = storages(copy.deepcopy(leaves))
    with_history = build(_hidden())
    with warnings.catch_warnings(), deepcopy_shim.enabled("warn"):
        warnings.simplefilter("ignore")
        made = copy.deepcopy(with_history)
    assert native == (1 if memo == "same memo" else 2)
    assert storages(made) == native


# --- 6. retries, kept memos, modes and roots, as a property -------------------------------------


ROOTS: Dict[str, Callable[[Any, Any], Any]] = {
    "tuple": lambda a, b: (a, b),
    "list": lambda a, b: [a, b],
    "dict": lambda a, b: {"a": a, "b": b},
    "module": lambda a, b: _Holder(a, b),
    "object": lambda a, b: _Plain(a, b),
}


class _Holder(nn.Module):
    def __init__(self, a: Any, b: Any) -> None:
        super().__init__()
        self.a, self.b = a, b


class _Plain:
    def __init__(self, a: Any, b: Any) -> None:
        self.a, self.b = a, b


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(kind=st.sampled_from(sorted(ROOTS)), failures=st.integers(0, 2),
       keep=st.booleans(), mode=st.sampled_from(["warn", "silent", "strict"]))
def test_every_retry_reports_what_a_fresh_copy_reports(kind: str, failures: int, keep: bool,
                                                      mode: str) -> None:
    """A copy that fails `failures` times (its memo kept by the caller, or not), then is made
    again from the same call site with a fresh memo: the attempt that completes reports what a
    first, fresh copy reports, in every mode."""
    flaky = FailsFirst()
    flaky.failures = 0
    root = ROOTS[kind]([flaky, with_history()], with_history())  # a failure before any refusal
    expected = found(root)
    assert len(expected) == 2
    flaky.failures = failures
    kept: List[Dict[Any, Any]] = []
    for _attempt in range(failures + 1):
        memo: Optional[Dict[Any, Any]] = {} if keep and flaky.failures else None
        if memo is not None:
            kept.append(memo)  # the caller keeps the failed copy's memo
        messages: List[Any] = []
        with deepcopy_shim.enabled(mode), warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                _copy_here(root, memo)
            except ValueError:
                outcome = "failed"
            except NonLeafTensorError as exc:
                outcome = "refused"
                messages.append(exc)
            else:
                outcome = "copied"
        messages += [w.message for w in caught if isinstance(w.message, DetachedTensorsWarning)]
        if outcome == "failed":
            assert messages == []  # nothing is said of a copy that failed
            continue
        if mode == "warn":
            assert outcome == "copied" and [list(m.paths) for m in messages] == [expected]
        elif mode == "silent":
            assert outcome == "copied" and messages == []
        else:
            assert outcome == "refused" and list(messages[0].paths) == expected
            assert not incomplete(messages[0])
        break
    else:
        pytest.fail("no attempt completed")
    for memo in kept:
        assert not _shim_objects(memo)


# --- 7. a strict refusal is made whole by the copy that raised it; reading it runs nothing ------


_SHARED_LOCK = threading.Lock()


class TakesTheLock:
    """Copies its tensor under a lock the program also logs under (a plain, non-reentrant
    `threading.Lock`), and counts its calls."""

    calls = 0

    def __init__(self, t: torch.Tensor) -> None:
        self.t = t

    def __deepcopy__(self, memo: Dict[int, Any]) -> TakesTheLock:
        type(self).calls += 1
        with _SHARED_LOCK:
            return TakesTheLock(copy.deepcopy(self.t, memo))


def test_a_refusal_read_under_a_lock_its_copy_methods_take_says_everything_at_once() -> None:
    root = [with_history(), TakesTheLock(with_history())]
    error = refusal(root)

    def log_under_the_lock() -> Tuple[str, Tuple[str, ...]]:
        with _SHARED_LOCK:  # as a logger shared with the copy methods would
            return str(error), error.paths

    message, paths = in_a_thread(log_under_the_lock)
    assert paths == ("[0]", "[1].t")
    assert not incomplete(message) and "graph leaves" in message


def test_reading_a_refusal_calls_no_copy_method() -> None:
    root = {"a": with_history(), "b": TakesTheLock(with_history())}
    TakesTheLock.calls = 0
    error = refusal(root)
    made = TakesTheLock.calls  # the copy's calls, and its survey's, all before the error arrived
    assert made == 1  # the copy stopped at ['a']; its survey followed the rest once
    str(error), error.paths, error.tensors, repr(error), error.args
    pickled = __import__("pickle").loads(__import__("pickle").dumps(error))
    assert pickled.paths == error.paths and TakesTheLock.calls == made


def _forget_tracebacks(error: BaseException) -> None:
    seen: List[BaseException] = []
    pending: List[Optional[BaseException]] = [error]
    while pending:
        each = pending.pop()
        if each is None or any(each is s for s in seen):
            continue
        seen.append(each)
        each.__traceback__ = None
        pending += [each.__cause__, each.__context__]


class _Memo(dict):  # type: ignore[type-arg]
    pass


@pytest.mark.parametrize("memo", [None, "kept"])
def test_a_refusal_holds_neither_the_copied_object_nor_the_memo(memo: Optional[str]) -> None:
    class Root:
        def __init__(self) -> None:
            self.cache = with_history()

    root = Root()
    kept: Optional[Dict[Any, Any]] = None
    if memo:
        kept = _Memo()  # a dict subclass: a plain dict cannot be referenced weakly
        copy.deepcopy([torch.ones(1)], kept)  # a memo an earlier copy used
    refs = [weakref.ref(root)] + ([weakref.ref(kept)] if kept is not None else [])
    error = refusal(root, kept)
    # Kept as a log keeps it: without the tracebacks, whose frames hold the copy's objects for
    # any error, native's too.  Unread: nothing waits for a read.
    _forget_tracebacks(error)
    del root, kept
    gc.collect()
    assert [ref() for ref in refs] == [None] * len(refs)
    assert error.paths == ("cache",) and not incomplete(error)


class Sealed(dict):  # type: ignore[type-arg]
    """A mapping whose items cannot be listed (its own `items` raises), copied by its own
    `__deepcopy__`: nothing can spell a path through it."""

    def items(self) -> Any:  # type: ignore[override]
        raise TypeError("Sealed does not list its items")

    def __deepcopy__(self, memo: Dict[int, Any]) -> Sealed:
        new = Sealed()
        for key in list(self.keys()):
            dict.__setitem__(new, key, copy.deepcopy(dict.__getitem__(self, key), memo))
        return new


def test_a_refusal_whose_path_cannot_be_spelled_is_still_the_refusal_that_reaches_the_caller() -> None:
    sealed = Sealed()
    dict.__setitem__(sealed, "t", with_history())
    root = {"c": sealed, "other": with_history()}
    error = refusal(root)  # a NonLeafTensorError, not the TypeError of `items`
    assert error.tensors == (dict.__getitem__(sealed, "t"), root["other"])
    assert error.paths[1] == "['other']" and "not located: TypeError" in error.paths[0]
    assert "graph leaves" in str(error) and not incomplete(error)
    # warn and find_nonleaf_tensors name the same, and never raise either
    (w,) = warned(lambda: deepcopy_shim.deepcopy(root, "warn"))
    assert w.paths == error.paths and tuple(found(root)) == error.paths


def test_a_refusal_read_before_its_copy_ends_never_raises_where_a_path_cannot_be_spelled() -> None:
    sealed = Sealed()
    dict.__setitem__(sealed, "t", with_history())
    read: List[str] = []

    class Reads:
        def __init__(self) -> None:
            self.sealed = sealed

        def __deepcopy__(self, memo: Dict[int, Any]) -> Any:
            try:
                return copy.deepcopy(self.sealed, memo)
            except NonLeafTensorError as exc:
                read.append(str(exc))
                read.extend(exc.paths)
                return None

    with deepcopy_shim.enabled("strict"):
        copy.deepcopy(Reads())
    assert "not located: TypeError" in read[1] and incomplete(read[0])


def test_a_refusal_made_again_with_context_is_a_refusal_like_any_runtime_error() -> None:
    class Rewraps:
        def __init__(self) -> None:
            self.t = with_history()

        def __deepcopy__(self, memo: Dict[int, Any]) -> Any:
            try:
                return copy.deepcopy(self.t, memo)
            except RuntimeError as exc:
                raise type(exc)(f"while copying a part: {exc}") from exc

    with deepcopy_shim.enabled("strict"), pytest.raises(NonLeafTensorError) as info:
        copy.deepcopy(Rewraps())
    assert str(info.value).startswith("while copying a part: deepcopy_shim: refused")
    assert isinstance(info.value.__cause__, NonLeafTensorError)


@pytest.mark.parametrize("args", [(), ("first", "second"), (42,)])
def test_a_refusals_args_are_what_code_gives_it(args: Tuple[Any, ...]) -> None:
    native = RuntimeError("x")
    native.args = args
    error = refusal([with_history()])
    error.args = args
    assert (error.args, str(error)) == (native.args, str(native))


def test_an_interruption_raised_while_a_refusal_is_handled_goes_on_without_a_survey() -> None:
    TakesTheLock.calls = 0
    root = [with_history(), TakesTheLock(torch.ones(1))]
    caught: List[NonLeafTensorError] = []

    class Interrupts:
        def __deepcopy__(self, memo: Dict[int, Any]) -> Any:
            try:
                return copy.deepcopy(root, memo)
            except NonLeafTensorError as exc:
                caught.append(exc)
                raise KeyboardInterrupt from exc  # as a handler's interrupt arrives

    with deepcopy_shim.enabled("strict"), pytest.raises(KeyboardInterrupt):
        copy.deepcopy(Interrupts())
    assert TakesTheLock.calls == 0  # the copy never reached it, and no survey ran
    assert caught[0].tensors == (root[0],) and incomplete(caught[0])


def test_an_interrupted_survey_leaves_no_cycle_holding_the_copied_object() -> None:
    class InterruptsItsCopy:
        def __deepcopy__(self, memo: Dict[int, Any]) -> Any:
            raise KeyboardInterrupt

    class Root:
        def __init__(self) -> None:
            self.items = [with_history(), InterruptsItsCopy()]

    root = Root()
    ref = weakref.ref(root)
    gc.disable()
    try:
        with deepcopy_shim.enabled("strict"):
            try:
                copy.deepcopy(root)  # refused at items[0]; the survey meets the interruption
            except KeyboardInterrupt as exc:
                _forget_tracebacks(exc)
        del root
        assert ref() is None  # freed without the garbage collector, as natively
    finally:
        gc.enable()


def test_a_refusal_given_context_on_its_way_up_keeps_its_message_and_names_everything() -> None:
    class AddsContext:
        def __init__(self) -> None:
            self.part = {"a": with_history()}

        def __deepcopy__(self, memo: Dict[int, Any]) -> Any:
            try:
                return copy.deepcopy(self.part, memo)
            except NonLeafTensorError as exc:
                exc.args = (f"while copying a part: {exc}",)  # the usual idiom
                raise

    root = {"c": AddsContext(), "d": with_history()}
    error = refusal(root)
    assert str(error).startswith("while copying a part: deepcopy_shim: refused to copy a dict "
                                 "holding 2 tensors")  # the words it quoted, made final
    assert not incomplete(error)
    assert error.paths == tuple(found(root)) == ("['c'].part['a']", "['d']")


def _counting_mode(kind: str) -> Any:
    """A user's mode of `kind` ("dispatch" or "torch function") recording every call it sees."""
    from torch.overrides import TorchFunctionMode
    from torch.utils._python_dispatch import TorchDispatchMode

    calls: List[Any] = []

    def record(self: Any, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        calls.append(func)
        return func(*args, **(kwargs or {}))

    if kind == "dispatch":
        mode: Any = type("Counts", (TorchDispatchMode,), {"__torch_dispatch__": record})()
    else:
        mode = type("Counts", (TorchFunctionMode,), {"__torch_function__": record})()
    mode.calls = calls
    return mode


@pytest.mark.parametrize("kind", ["dispatch", "torch function"])
def test_the_survey_and_the_words_are_seen_by_no_mode_of_the_users(kind: str) -> None:
    root = [with_history(), with_history(), torch.ones(2)]
    with _counting_mode(kind) as mode:
        with pytest.raises(RuntimeError):
            copy.deepcopy(root)  # native: the refusal, and what this mode sees of it
        native = list(mode.calls)
        mode.calls.clear()
        error = refusal(root)
    assert mode.calls == native and error.paths == ("[0]", "[1]")


# --- 8. what a hand-written mutation run let through ----------------------------------------------


def test_a_dead_off_scope_at_the_head_of_a_tasks_chain_leaves_the_global_mode_whole() -> None:
    deepcopy_shim.enable("warn")
    root = [with_history(), {"t": with_history()}]

    async def later() -> None:
        copy.deepcopy(root)

    async def main() -> None:
        with deepcopy_shim.enabled("off"):
            task = asyncio.get_running_loop().create_task(later())  # it runs after the scope
        await task

    caught = warned(lambda: asyncio.run(main()))
    assert [list(w.paths) for w in caught] == [["[0]", "[1]['t']"]]  # one copy, one warning


def test_a_task_that_entered_a_scope_is_freed_without_the_collector_once_it_is_done() -> None:
    scope = deepcopy_shim.enabled("silent")

    async def enters() -> None:
        scope.start()  # and never leaves it: its context, which it holds, holds the scope

    async def main() -> weakref.ReferenceType[Any]:
        task = asyncio.get_running_loop().create_task(enters())
        await task
        return weakref.ref(task)

    gc.disable()
    try:
        ref = asyncio.run(main())
        assert ref() is None  # the scope holds its entrant weakly: no cycle through it
    finally:
        gc.enable()
        deepcopy_shim._patch.release(here=True)  # the user that scope.start() counted here


def test_a_copy_that_reenters_the_walk_at_any_line_changes_nothing() -> None:
    """What a finalizer may do at any point of warn's walk up the copy frames (on Python 3.12
    and later the collector runs its finalizers at the next instruction, anywhere): copy a
    tensor with history, in the middle of the walk. A line trace function does it here, at every
    line of the walk, deterministically."""
    obj = [[[Holds(with_history())] for _ in range(6)], with_history(), [with_history()],
           [[with_history()]], with_history()]
    (expected,) = warned(lambda: deepcopy_shim.deepcopy(obj, "warn"))
    code = _record.Copy.node_of.__code__
    fired: List[int] = []
    inside: List[torch.Tensor] = []  # a new tensor each time: each is met, and walked to
    busy: List[bool] = []

    def at_each_line(frame: types.FrameType, event: str, arg: Any) -> Any:
        if event == "line" and not busy:
            busy.append(True)
            try:
                fired.append(frame.f_lineno)
                inside.append(with_history())
                copy.deepcopy(inside[-1])  # what a finalizer run here may do
            finally:
                busy.pop()
        return at_each_line

    def tracer(frame: types.FrameType, event: str, arg: Any) -> Any:
        return at_each_line if frame.f_code is code else None

    previous = sys.gettrace()  # coverage's, where it measures
    sys.settrace(tracer)
    try:
        (got,) = warned(lambda: deepcopy_shim.deepcopy(obj, "warn"))
    finally:
        sys.settrace(previous)
    assert len(set(fired)) > 3  # it ran inside the walk, at several of its lines
    during = " <copied by Tensor.__deepcopy__>"
    assert [p for p in got.paths if not p.endswith(during)] == list(expected.paths)
    inner = [t for p, t in zip(got.paths, got.tensors) if p.endswith(during)]
    assert len(inner) == len(inside) and all(a is b for a, b in zip(inner, inside))


class RefusesItselfInside:
    """Its copy starts a strict copy of the very same object (once), as a `__deepcopy__` that
    asks for a checked copy of itself would."""

    inside = False

    def __init__(self) -> None:
        self.t = with_history()
        self.u = with_history()

    def __deepcopy__(self, memo: Dict[int, Any]) -> Any:
        if RefusesItselfInside.inside:
            new = RefusesItselfInside.__new__(RefusesItselfInside)
            new.__dict__.update(copy.deepcopy(self.__dict__, memo))
            return new
        RefusesItselfInside.inside = True
        try:
            return deepcopy_shim.deepcopy(self, "strict")
        finally:
            RefusesItselfInside.inside = False


@pytest.mark.parametrize("outer", ["native", "silent"])
def test_a_strict_copy_of_an_object_started_inside_another_copy_of_it_says_so(outer: str) -> None:
    source = RefusesItselfInside()
    with pytest.raises(NonLeafTensorError) as info:
        if outer == "native":
            copy.deepcopy(source)
        else:
            deepcopy_shim.deepcopy(source, "silent")
    assert info.value.paths == ("t",)
    assert "the copy ran inside another copy" in " ".join(str(info.value).split())


def test_a_refusal_that_reaches_the_caller_as_the_context_of_another_error_names_everything() -> None:
    class Wraps:
        def __init__(self) -> None:
            self.t = with_history()

        def __deepcopy__(self, memo: Dict[int, Any]) -> Any:
            try:
                return copy.deepcopy(self.t, memo)
            except RuntimeError:
                raise ValueError("Wraps could not be copied")  # noqa: B904 (the refusal is its __context__)

    root = [Wraps(), with_history()]
    with deepcopy_shim.enabled("strict"), pytest.raises(ValueError) as info:
        copy.deepcopy(root)
    refused = info.value.__context__
    assert isinstance(refused, NonLeafTensorError)
    assert refused.paths == ("[0].t", "[1]") and not incomplete(refused)
