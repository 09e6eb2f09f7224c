"""The survey of a copy: which tensors with autograd history it would meet, without copying data.

What mode `strict` names when it refuses, and what `find_nonleaf_tensors` returns, is what a
copy in mode `silent` would detach.  A survey finds it by making that copy with every tensor
replaced by a stand-in on the meta device (same class where it can be, dtype, shape, strides,
`requires_grad`; no storage): every other object is copied exactly as the copy copies it
(custom `__deepcopy__`, reductions and memo subclasses run as they always do), so the survey
follows the copy's own protocol, but no tensor's data is copied and none is allocated.  The
survey's copy is discarded.

The stand-ins come from the survey's memo, which deepcopy asks first for every object (so
`nn.Parameter` gets one too; a tensor subclass with a `__deepcopy__` of its own is copied by
it, as in the copy, so that what it copies beside the data is surveyed), and,
for a copy a custom `__deepcopy__` starts with a fresh memo, from the tensor patch.  Scopes
entered during the survey keep their modes (a strict one still refuses) but copy nothing
either and say nothing.
"""

from __future__ import annotations

import copy
import copyreg
import sys
import weakref
from typing import Any, Callable, ContextManager, Dict, List, Optional, Tuple

import torch

from . import _modes, _protocol
from ._access import Entry, existing_instance_dict
from ._errors import NonLeafTensorError
from ._modes import Mode, ModeSetting, Source
from ._record import Tracker, steps, walk

__all__ = ["Survey", "dry_memo", "run"]

__tracebackhide__ = True

_Tensor = torch.Tensor
_Parameter = torch.nn.Parameter
# torch 2.1 and later clear a tensor's non-serializable caches from the dict they copy; torch
# 2.0's Tensor.__deepcopy__ copies the whole dict, and never calls a subclass's own method.
_CLEARS_CACHES = hasattr(_Tensor, "_clear_non_serializable_cached_data")
# The setting a survey's copy runs in: its semantics are silent's.
_SETTING = ModeSetting(Mode.SILENT, Source.SCOPE, "deepcopy_shim.find_nonleaf_tensors(obj)")
# torch's words for its refusal, for a copy a scope without the shim makes inside a survey.
_REFUSAL = ("Only Tensors created explicitly by the user (graph leaves) support the deepcopy "
            "protocol at the moment (met by deepcopy_shim's survey of a copy)")


class Survey:
    """One survey: the tensors with history met in its own scope, with their frames."""

    __slots__ = ("tracker", "scope", "captured")

    def __init__(self, root: Any) -> None:
        self.tracker = Tracker(root)
        self.scope: Optional[_modes.Scope] = None
        self.captured: Dict[int, Tuple[Any, Any, Any]] = {}

    def copy_tensor(self, tensor: _Tensor, memo: Any, caller: Any, scope: _modes.Scope) -> Any:
        """The stand-in copy of `tensor` (called by the frame `caller`), memoised in `memo`,
        after the parts of it the copy would deep-copy (grad, slots, `__dict__`)."""
        found = _protocol.own_get(memo, id(tensor), _protocol.NIL)
        if found is not _protocol.NIL:
            return found
        leaf = tensor.is_leaf
        if not leaf:
            if scope is self.scope:
                self._meet(tensor, caller)
            elif scope.setting is None:  # a scope without the shim: torch's own refusal
                raise RuntimeError(_REFUSAL)
            elif scope.setting.mode is Mode.STRICT:
                raise NonLeafTensorError(
                    "deepcopy_shim: refused a tensor with autograd history (met by the survey "
                    "of a copy)", paths=("",), mode=Mode.STRICT, tensors=(tensor,))
        twin = _stand_in(tensor)
        cls = type(tensor)
        if getattr(cls, "__deepcopy__", None) is _Tensor.__deepcopy__:
            # What torch's Tensor.__deepcopy__ copies beside the data (and the shim's copy of a
            # tensor with history, which goes through it): .grad (retained, for a non-leaf),
            # slots of a subclass, the instance dict without torch's non-serializable caches.
            grad = tensor.grad if leaf or tensor.retains_grad else None
            if grad is not None:
                grad_twin = self.copy_tensor(grad, memo, sys._getframe(0), scope)
                try:
                    twin.grad = grad_twin
                except Exception:  # a stand-in of another shape or class: only the walk counts
                    pass
            if cls is not _Tensor:
                for slot in copyreg._slotnames(cls):  # type: ignore[attr-defined]
                    if hasattr(tensor, slot):
                        value = copy.deepcopy(getattr(tensor, slot), memo)
                        try:
                            setattr(twin, slot, value)
                        except Exception:
                            pass
            state = existing_instance_dict(tensor)
            if state:
                twin.__dict__ = dict(state)
                if _CLEARS_CACHES:
                    twin._clear_non_serializable_cached_data()
                _protocol.keep_alive(twin.__dict__, memo)
                twin.__dict__ = copy.deepcopy(twin.__dict__, memo)
        _protocol.own_set(memo, id(tensor), twin)
        return twin

    def copy_value(self, value: Any, memo: Any) -> Any:
        """`copy.deepcopy(value, memo)` for a value of a module's `_parameters`."""
        if isinstance(value, _Tensor) and _stands_in(type(value)):
            scope = _modes.current_scope()
            if scope is not None:
                return self.copy_tensor(value, memo, sys._getframe(1), scope)
        return copy.deepcopy(value, memo)

    def _meet(self, tensor: _Tensor, caller: Any) -> None:
        assert self.scope is not None
        walked, hit, _, _ = walk(caller, self.scope.boundary, self.captured)
        taken = steps(walked)
        for frame, (key, x) in zip(walked, taken):
            self.captured[key] = (frame.f_code, x, self)
        self.tracker.add(tensor, taken, (id(hit[0]), hit[1][1]) if hit is not None else None)


def _stand_in(tensor: _Tensor) -> Any:
    """A tensor on the meta device like `tensor`: class, dtype, shape, strides, requires_grad."""
    with torch._C.DisableTorchFunction():  # no user mode or subclass sees the survey's tensors
        cls = type(tensor)
        dtype = tensor.dtype
        try:
            twin = torch.empty_strided(tuple(tensor.size()), tuple(tensor.stride()),
                                       dtype=dtype, device="meta")
        except Exception:  # sparse, quantized, nested: no strides, or no meta kernel
            twin = torch.empty(0, dtype=dtype, device="meta")
        requires_grad = bool(tensor.requires_grad) and (twin.is_floating_point() or twin.is_complex())
        if isinstance(tensor, _Parameter):
            try:
                return cls(twin, requires_grad)
            except Exception:  # a subclass whose __new__ takes other arguments
                return _Parameter(twin, requires_grad)
        if cls is not _Tensor:
            twin = twin.as_subclass(cls)
        if requires_grad:
            twin.requires_grad_(True)
    return twin


def _stands_in(cls: type) -> bool:
    """True if a tensor of class `cls` is answered with a stand-in: its `__deepcopy__` is
    torch's (`Tensor`'s, or `nn.Parameter`'s, which copies only the data and
    `requires_grad`).  A subclass's own `__deepcopy__` may copy more (a metadata dict holding
    tensors): the survey calls it, as the copy does, so what it copies is surveyed too."""
    own = getattr(cls, "__deepcopy__", None)
    return own is _Tensor.__deepcopy__ or own is _PARAMETER_DEEPCOPY


_PARAMETER_DEEPCOPY = vars(_Parameter).get("__deepcopy__")


class _AnswersWithStandIns:
    """The survey's memo: deepcopy asks it first for every object it copies (`memo.get(id(x))`);
    for a tensor the answer, unless the memo has one of its own, is the tensor's stand-in."""

    def get(self, key: Any, default: Any = None) -> Any:
        found = super().get(key, _protocol.NIL)  # type: ignore[misc]
        if found is not _protocol.NIL:
            return found
        frame = sys._getframe(1)
        if frame.f_code is _protocol.DEEPCOPY_CODE:
            obj = frame.f_locals.get(_protocol.X_LOCAL, _protocol.NIL)
            if id(obj) == key and isinstance(obj, _Tensor) and _stands_in(type(obj)):
                scope = _modes.current_scope()
                if scope is not None and scope.survey is not None:
                    return scope.survey.copy_tensor(obj, self, frame, scope)
        return default


class _DryDict(_AnswersWithStandIns, dict):  # type: ignore[type-arg]
    pass


_memo_classes: weakref.WeakKeyDictionary[type, type] = weakref.WeakKeyDictionary()


def dry_memo(like: Any = None, entries: Optional[Dict[Any, Any]] = None) -> Any:
    """A memo for a survey, of `like`'s class where that is a dict subclass (so that its own
    `get`, such as pyro's, answers as it does in the copy), holding `entries`."""
    cls = type(like)
    if isinstance(like, dict) and cls is not dict and cls is not _DryDict:
        made = _memo_classes.get(cls)
        if made is None:
            made = _memo_classes[cls] = type(f"Survey{cls.__name__}", (_AnswersWithStandIns, cls), {})
        try:
            memo = made.__new__(made)  # type: ignore[call-overload]
            dict.__init__(memo)
        except Exception:  # a memo class the survey cannot make: the plain kind
            memo = _DryDict()
    else:
        memo = _DryDict()
    if entries:
        dict.update(memo, entries)
    return memo


def run(root: Any, memo: Any, hold: Callable[[], ContextManager[Any]]
        ) -> Tuple[List[Entry], Optional[str]]:
    """Survey the copy of `root` with `memo` (from `dry_memo`) while `hold()` keeps the patch
    installed; return the tensors with history met, located, and what stopped the copy
    (`"TypeError: ..."`), if anything did (the entries then are those met until then)."""
    survey = Survey(root)
    error: Optional[str] = None
    try:
        with hold():
            survey.scope = _modes.push_scope(survey, _SETTING, sys._getframe(0), survey=survey)
            try:
                copy.deepcopy(root, memo)
            except Exception as exc:
                error = f"{type(exc).__name__}: {exc}"  # the words: the error would hold this frame
            finally:
                _modes.pop_scope(survey)
        return survey.tracker.entries(), error
    finally:
        # The scope holds this frame, which holds the survey: break that cycle (and let go of
        # the survey's frames), so that what the survey made is freed when it returns.
        survey.scope = None
        survey.captured.clear()
        survey.tracker.release()
