"""The tensor copier's behaviours that a mutation run of ``_tensor`` found unpinned (issue 20).

Each test is a behaviour a user sees through ``copy.deepcopy``, ``deepcopy_shim.deepcopy``,
``find_nonleaf_tensors``, ``enable()`` and the package's errors and warnings, compared with what
torch's own deepcopy does for a leaf where there is one.  The survivors that no input can tell
apart from the code as written are in ``tools/mutation-equivalents/_tensor.toml``.
"""

from __future__ import annotations

import copy
import gc
import sys
import warnings
from types import MethodType
from typing import Any, Callable, Dict, List, Tuple

import pytest
import torch
from support.models import ORIGINAL_TENSOR_DEEPCOPY, with_history

import deepcopy_shim
from deepcopy_shim import DetachedCopyError, DetachedTensorsWarning, NonLeafTensorError, _patch


def warned(call: Callable[[], Any]) -> List[DetachedTensorsWarning]:
    """The DetachedTensorsWarnings `call()` emits (every shim warning is an error by default)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        call()
    return [w.message for w in caught if isinstance(w.message, DetachedTensorsWarning)]


def warned_paths(obj: Any) -> List[Tuple[str, ...]]:
    """The paths of each DetachedTensorsWarning a copy of `obj` in mode warn emits."""
    return [w.paths for w in warned(lambda: deepcopy_shim.deepcopy(obj, "warn"))]


def refused_paths(obj: Any) -> Tuple[str, ...]:
    with pytest.raises(NonLeafTensorError) as refused:
        deepcopy_shim.deepcopy(obj, "strict")
    return refused.value.paths


def found_paths(obj: Any) -> List[str]:
    return [path for path, _ in deepcopy_shim.find_nonleaf_tensors(obj)]


def keep_alive_slot(memo: Dict[Any, Any]) -> type:
    return type(dict.get(memo, id(memo), []))


# --- the self-check of whatever Tensor.__deepcopy__ is when the shim installs ----------------


def _counting_function(calls: List[int]) -> Any:
    def their_deepcopy(self: torch.Tensor, memo: Dict[Any, Any]) -> Any:
        calls.append(1)
        try:
            return ORIGINAL_TENSOR_DEEPCOPY(self, memo)
        except RuntimeError as exc:
            message = str(exc)
        raise RuntimeError(message)

    return their_deepcopy


class _EqualToNothing:
    """Someone else's patch of Tensor.__deepcopy__ that is a callable object whose ``==`` is
    never true, not even of itself (as an object comparing elementwise may be)."""

    def __init__(self, calls: List[int]) -> None:
        self.calls = calls

    def __call__(self, tensor: torch.Tensor, memo: Dict[Any, Any]) -> Any:
        self.calls.append(1)
        try:
            return ORIGINAL_TENSOR_DEEPCOPY(tensor, memo)
        except RuntimeError as exc:
            message = str(exc)
        raise RuntimeError(message)

    def __get__(self, instance: Any, owner: Any = None) -> Any:
        return self if instance is None else MethodType(self, instance)

    @property
    def __code__(self) -> Any:  # the frame that raises the refusal runs this code
        return type(self).__call__.__code__

    def __eq__(self, other: object) -> bool:
        return False

    __hash__ = object.__hash__


@pytest.mark.parametrize("kind", ["function", "object equal to nothing"])
def test_someone_elses_tensor_deepcopy_is_checked_once_however_often_the_shim_installs(
        kind: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The self-check runs once per function (refusal_problem's promise), found by identity."""
    calls: List[int] = []
    theirs = _counting_function(calls) if kind == "function" else _EqualToNothing(calls)
    monkeypatch.setattr(torch.Tensor, "__deepcopy__", theirs)
    try:
        for _ in range(3):
            deepcopy_shim.enable("silent")
            assert deepcopy_shim.is_enabled()
            assert vars(torch.Tensor)["__deepcopy__"] is not theirs  # installed around theirs
            deepcopy_shim.disable()
            assert vars(torch.Tensor)["__deepcopy__"] is theirs
        assert len(calls) == 1  # the self-check's probe, on the first installation only
        with deepcopy_shim.enabled("silent"):
            made = copy.deepcopy(with_history())
        assert made.is_leaf and made.requires_grad
        assert len(calls) == 3  # the refused call, then the detached twin's copy, both theirs
    finally:
        deepcopy_shim.disable()


def test_someone_elses_tensor_deepcopy_failing_otherwise_leaves_copies_native(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A Tensor.__deepcopy__ that raises something else than a RuntimeError on a tensor with
    history: enable() says so and the shim stays out of the way, it does not raise."""

    def their_deepcopy(self: torch.Tensor, memo: Dict[Any, Any]) -> Any:
        if not self.is_leaf:
            raise TypeError("no copies of tensors with history today")
        return ORIGINAL_TENSOR_DEEPCOPY(self, memo)

    monkeypatch.setattr(torch.Tensor, "__deepcopy__", their_deepcopy)
    monkeypatch.setattr(_patch, "_inert", None)  # the verdict is the process's: forget it after
    try:
        with pytest.warns(deepcopy_shim.TorchCompatibilityWarning) as caught:
            deepcopy_shim.enable("silent")
        (message,) = [str(w.message) for w in caught]  # said once
        assert "failed in an unexpected way" in message
        assert "TypeError: no copies of tensors with history today" in message
        assert not deepcopy_shim.is_enabled() and deepcopy_shim.current_mode() is None
        assert vars(torch.Tensor)["__deepcopy__"] is their_deepcopy  # nothing patched
        with pytest.raises(TypeError, match="no copies"):
            copy.deepcopy(with_history())  # copies behave as their function makes them
    finally:
        deepcopy_shim.disable()


# --- where a tensor copied by a direct __deepcopy__ call is reported --------------------------


class Bagged:
    """Keeps its tensor where no Python access names it (a set) and copies it by calling its
    ``__deepcopy__`` directly, as some libraries' own ``__deepcopy__`` do."""

    def __init__(self, t: torch.Tensor) -> None:
        self.bag = {t}

    def __deepcopy__(self, memo: Dict[Any, Any]) -> Any:
        (t,) = self.bag
        return Bagged(t.__deepcopy__(memo))  # type: ignore[no-untyped-call]


BAGGED = "<copied by Bagged.__deepcopy__>"


@pytest.mark.parametrize(("wrap", "path"), [
    (lambda t: Bagged(t), BAGGED),
    (lambda t: {"holder": Bagged(t)}, f"['holder'] {BAGGED}"),
])
def test_a_tensor_copied_by_a_direct_call_is_reported_under_the_object_that_copied_it(
        wrap: Callable[[torch.Tensor], Any], path: str) -> None:
    obj = wrap(with_history())
    assert found_paths(obj) == [path]
    assert warned_paths(obj) == [(path,)]
    assert refused_paths(obj) == (path,)


class Unbuildable(torch.Tensor):
    """A subclass torch cannot deep-copy even as a leaf (no ``new_empty`` of its own)."""


def test_a_failed_detached_copy_by_a_direct_call_names_the_object_that_copied_it() -> None:
    obj = {"holder": Bagged(with_history(3).as_subclass(Unbuildable))}
    for mode in ("warn", "silent"):
        with pytest.raises(DetachedCopyError) as failed:
            deepcopy_shim.deepcopy(obj, mode)
        assert failed.value.path == f"['holder'] {BAGGED}"


# --- what a tensor with history at the root of a copy holds ---------------------------------


def _with_attribute() -> torch.Tensor:
    t = with_history()
    # a plain tensor's own attribute, which torch deep-copies with it
    t.note = with_history(3)  # type: ignore[attr-defined]
    return t


def _with_history_grad() -> torch.Tensor:
    x = torch.ones(2, requires_grad=True)
    y = x * 2
    y.retain_grad()
    (y ** 3).sum().backward(create_graph=True)  # type: ignore[no-untyped-call]
    assert y.grad is not None and not y.grad.is_leaf  # a retained grad with history of its own
    return y


@pytest.mark.parametrize(("make", "inner"), [(_with_attribute, "note"), (_with_history_grad, "grad")])
def test_strict_names_the_root_tensor_and_every_tensor_with_history_its_copy_holds(
        make: Callable[[], torch.Tensor], inner: str) -> None:
    t = make()
    assert found_paths(t) == ["", inner]
    assert refused_paths(t) == ("", inner)
    made = deepcopy_shim.deepcopy(t, "silent")
    assert made.is_leaf and getattr(made, inner).is_leaf


@pytest.mark.parametrize(("make", "inner"), [(_with_attribute, "note"), (_with_history_grad, "grad")])
def test_warn_names_the_root_tensor_and_every_tensor_its_copy_detached(
        make: Callable[[], torch.Tensor], inner: str) -> None:
    """A tensor with history at the root, whose copy detaches another (an attribute, a retained
    grad): one warning names both, as strict and find_nonleaf_tensors do."""
    assert warned_paths(make()) == [("", inner)]


class OwnMemo:
    """Copies its tensor with a memo of its own, and keeps (and hands its copy) the tensor with
    history that tensor holds as an attribute."""

    def __init__(self, t: Any) -> None:
        self.t = t
        self.alias = t.note

    def __deepcopy__(self, memo: Dict[Any, Any]) -> Any:
        new = OwnMemo.__new__(OwnMemo)
        new.t = copy.deepcopy(self.t, {})
        new.alias = new.t.note
        return new


def test_a_tensor_met_inside_another_tensors_copy_is_named_the_shortest_way_the_copy_allows() -> None:
    """The copy meets ``alias`` inside the copy of ``t`` (its attribute ``note``), under the
    holder: the path takes the holder's own one step to it, in every mode and in the survey."""
    obj = {"h": OwnMemo(_with_attribute())}
    paths = ["['h'].t", "['h'].alias"]
    assert found_paths(obj) == paths
    assert warned_paths(obj) == [tuple(paths)]
    assert refused_paths(obj) == tuple(paths)
    made = deepcopy_shim.deepcopy(obj, "silent")
    assert made["h"].alias is made["h"].t.note and made["h"].alias.is_leaf


# --- a memo hit, and the memo passed by keyword -----------------------------------------------


class Fussy(torch.Tensor):
    """A subclass whose comparisons accept tensors only; torch copies it (``new_empty``)."""

    def new_empty(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        return super().new_empty(*args, **kwargs).as_subclass(Fussy)

    def __eq__(self, other: Any) -> Any:
        if not isinstance(other, torch.Tensor):
            raise TypeError("Fussy compares with tensors only")
        return super().__eq__(other)

    def __ne__(self, other: Any) -> Any:
        if not isinstance(other, torch.Tensor):
            raise TypeError("Fussy compares with tensors only")
        return super().__ne__(other)

    __hash__ = torch.Tensor.__hash__


def test_a_tensor_copied_again_by_a_direct_call_is_the_memos_copy_never_compared() -> None:
    leaf = torch.ones(2).as_subclass(Fussy)
    memo: Dict[Any, Any] = {}
    native = copy.deepcopy(leaf, memo)
    # torch's own memo hit, for a leaf
    assert leaf.__deepcopy__(memo) is native  # type: ignore[no-untyped-call]
    t = with_history().as_subclass(Fussy)
    memo = {}
    with deepcopy_shim.enabled("silent"):
        made = copy.deepcopy(t, memo)
        assert type(made) is Fussy and made.is_leaf
        assert t.__deepcopy__(memo) is made  # type: ignore[no-untyped-call]
        assert t.__deepcopy__(memo=memo) is made  # type: ignore[no-untyped-call]


def test_the_memo_passed_by_keyword() -> None:
    leaf = torch.ones(2, requires_grad=True)
    native = leaf.__deepcopy__(memo={})  # type: ignore[no-untyped-call]
    assert native.is_leaf and native.requires_grad
    with deepcopy_shim.enabled("silent"):
        made = with_history().__deepcopy__(memo={})  # type: ignore[no-untyped-call]
    assert made.is_leaf and made.requires_grad and torch.equal(made.detach(), torch.full((2,), 2.0))
    with deepcopy_shim.enabled("strict"), pytest.raises(NonLeafTensorError) as refused:
        with_history().__deepcopy__(memo={})  # type: ignore[no-untyped-call]
    assert refused.value.paths == ("",)


def test_the_tensor_passed_by_keyword() -> None:
    """`Tensor.__deepcopy__(self=t, memo=m)` through the class works as natively."""
    leaf = torch.ones(2, requires_grad=True)
    native = torch.Tensor.__deepcopy__(self=leaf, memo={})  # type: ignore[no-untyped-call]
    assert native.is_leaf and native.requires_grad
    with deepcopy_shim.enabled("silent"):
        made = torch.Tensor.__deepcopy__(self=with_history(), memo={})  # type: ignore[no-untyped-call]
    assert made.is_leaf and made.requires_grad


class ByKeyword:
    """A ``__deepcopy__`` that copies its tensor with the memo passed by keyword."""

    def __init__(self, t: torch.Tensor) -> None:
        self.t = t

    def __deepcopy__(self, memo: Dict[Any, Any]) -> Any:
        return ByKeyword(self.t.__deepcopy__(memo=memo))  # type: ignore[no-untyped-call]


def test_the_memo_passed_by_keyword_inside_a_copy() -> None:
    obj = {"k": ByKeyword(with_history())}
    assert found_paths(obj) == ["['k'].t"]
    assert warned_paths(obj) == [("['k'].t",)]
    assert deepcopy_shim.deepcopy(obj, "silent")["k"].t.is_leaf


# --- a detached copy that fails --------------------------------------------------------------


class Fallback:
    """Copies its tensor, and keeps nothing of it when the copy fails: a ``__deepcopy__`` that
    catches the error, so the copy around it goes on."""

    def __init__(self, t: Any) -> None:
        self.t = t

    def __deepcopy__(self, memo: Dict[Any, Any]) -> Any:
        try:
            return Fallback(copy.deepcopy(self.t, memo))
        except DetachedCopyError:
            return Fallback(None)


def test_a_failed_detached_copy_caught_inside_the_copy_leaves_the_other_tensors_reported() -> None:
    obj = {"good": with_history(), "fallback": Fallback(with_history(3).as_subclass(Unbuildable)),
           "after": with_history()}
    made: List[Any] = []
    paths = [w.paths for w in warned(lambda: made.append(deepcopy_shim.deepcopy(obj, "warn")))]
    assert paths == [("['good']", "['after']")]  # one warning, without the tensor not detached
    assert made[0]["fallback"].t is None and made[0]["good"].is_leaf
    with deepcopy_shim.enabled("warn"):
        paths = [w.paths for w in warned(lambda: copy.deepcopy(obj))]
    assert paths == [("['good']", "['after']")]


def test_a_root_tensor_whose_detached_copy_fails_raises_the_shims_error_and_leaves_the_memo_plain() -> None:
    t = with_history(3).as_subclass(Unbuildable)
    with pytest.raises(RuntimeError) as native:
        copy.deepcopy(torch.ones(3).as_subclass(Unbuildable))
    memo: Dict[Any, Any] = {}
    with deepcopy_shim.enabled("warn"):
        with pytest.raises(DetachedCopyError) as failed:
            copy.deepcopy(t, memo)
        assert keep_alive_slot(memo) is list  # at once, not only when the scope ends
    assert failed.value.path == ""
    assert type(failed.value.__cause__) is type(native.value)
    assert str(failed.value.__cause__) == str(native.value)


# --- a subclass's slots ----------------------------------------------------------------------


class Slotted(torch.Tensor):
    """A subclass with slots (one set, one left unset) that torch can deep-copy as a leaf."""

    __slots__ = ("scale", "unset")
    scale: torch.Tensor
    unset: Any

    def new_empty(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        return super().new_empty(*args, **kwargs).as_subclass(Slotted)


def _slotted_copy(t: Slotted) -> Tuple[Any, Any]:
    """`t` and the tensor its slot holds, copied together: the copy of both, as a pair."""
    return copy.deepcopy((t, t.scale))


def test_slots_of_a_subclass_with_history_are_deep_copied_through_the_memo_as_a_leafs() -> None:
    leaf = torch.ones(2).as_subclass(Slotted)
    leaf.scale = torch.full((2,), 3.0)
    native, native_scale = _slotted_copy(leaf)
    assert native.scale is native_scale and native_scale is not leaf.scale
    assert not hasattr(native, "unset")
    t = with_history().as_subclass(Slotted)
    t.scale = torch.full((2,), 3.0)
    with deepcopy_shim.enabled("silent"):
        made, made_scale = _slotted_copy(t)
    assert type(made) is Slotted and made.is_leaf and made.requires_grad
    assert made.scale is made_scale and made_scale is not t.scale
    assert torch.equal(made_scale, t.scale)
    assert not hasattr(made, "unset") and not hasattr(t, "unset")


def test_a_retained_grad_is_met_before_the_tensors_dict_as_torch_copies_them() -> None:
    """torch's own copy takes `.grad` before `__dict__`: a retained grad with history and a
    tensor with history in the dict are named in that order by warn, strict and
    find_nonleaf_tensors alike."""
    weight = torch.ones(3, requires_grad=True)
    t = weight * 2
    t.retain_grad()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch's note on create_graph=True
        (t ** 2).sum().backward(create_graph=True)
    assert t.grad is not None and t.grad.grad_fn is not None
    t.cache = weight * 3
    root = {"t": t}
    order = ("['t']", "['t'].grad", "['t'].cache")
    with deepcopy_shim.enabled("warn"), pytest.warns(DetachedTensorsWarning) as caught:
        new = copy.deepcopy(root)
    assert [w.message.paths for w in caught] == [order]  # type: ignore[union-attr]
    assert new["t"].grad is not None and new["t"].grad.is_leaf and torch.equal(new["t"].grad, t.grad)
    with deepcopy_shim.enabled("strict"), pytest.raises(NonLeafTensorError) as refused:
        copy.deepcopy(root)
    assert refused.value.paths == order
    assert tuple(path for path, _ in deepcopy_shim.find_nonleaf_tensors(root)) == order


def test_a_tensor_an_autograd_graph_saved_keeps_its_attributes() -> None:
    """Its instance dict is found however torch traverses it (torch before 2.10 shows the GC
    nothing of a tensor that C++ shares, as a graph that saved it for backward does), and none
    is made where there was none (Python 3.11 and later read it without making one)."""
    weight = torch.ones(3, requires_grad=True)
    t = weight * 2
    loss = (t * t).sum()  # saves t for backward
    t.label, t.cache = "kept", weight * 3
    for mode in ("silent", "warn"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DetachedTensorsWarning)
            new = deepcopy_shim.deepcopy({"t": t}, mode)["t"]
        assert new.label == "kept" and new.cache.is_leaf and torch.equal(new.cache, t.cache)
    assert [p for p, _ in deepcopy_shim.find_nonleaf_tensors({"t": t})] == ["['t']", "['t'].cache"]
    bare = weight * 4
    saved = (bare * bare).sum()  # saved for backward, and no instance dict
    new = deepcopy_shim.deepcopy({"t": bare}, "silent")["t"]
    assert vars(new) == {} and new.requires_grad and torch.equal(new, bare)
    if sys.version_info >= (3, 11):
        del saved  # the graph lets go: the GC sees the tensor's references again
        assert not any(type(ref) is dict for ref in gc.get_referents(bare))  # none was made
    loss.backward()
