"""The survey of a copy: which tensors with autograd history it would meet, without copying data.

What mode `strict` names when it refuses, and what `find_nonleaf_tensors` returns, is what a
copy in mode `silent` would detach.  A survey finds it by making that copy with every tensor
replaced by a stand-in on the meta device (same class where it can be, dtype, shape, strides,
`requires_grad`; no storage): every other object is copied exactly as the copy copies it
(custom `__deepcopy__`, reductions and memo subclasses run as they always do), so the survey
follows the copy's own protocol, but no tensor's data is copied and none is allocated.  The
survey's copy is discarded.

The stand-ins come from the copier copy's dispatch table gives a tensor while the survey runs
(see `_dispatch`: so `nn.Parameter` gets one too, also in a copy a custom `__deepcopy__` starts
with a fresh memo; a tensor subclass with a `__deepcopy__` of its own is copied by it, as in the
copy, so that what it copies beside the data is surveyed), and from the tensor patch for a
tensor's `__deepcopy__` called directly.  Scopes entered during the survey keep their modes (a
strict one still refuses, one without the shim refuses as torch does) but copy nothing either
and say nothing.
"""

from __future__ import annotations

import copy
import copyreg
import sys
from typing import Any, Callable, ContextManager, Dict, List, Optional, Tuple

import torch
from torch.utils._python_dispatch import _disable_current_modes

from . import _modes, _protocol
from ._access import Entry, existing_instance_dict
from ._errors import NonLeafTensorError
from ._modes import Mode, ModeSetting, Source
from ._record import Copy, current_copy, entries, opened

__all__ = ["Survey", "dry_memo", "run"]

__tracebackhide__ = True

_Tensor = torch.Tensor
_quiet = torch._C.DisableTorchFunction
_Parameter = torch.nn.Parameter
# torch's Tensor.__deepcopy__ clears a tensor's non-serializable caches before it copies the
# instance dict since torch 2.6 (earlier ones had the method for pickling only): asked of the
# running torch's own code, not of its version.
_CLEARS_CACHES = "_clear_non_serializable_cached_data" in _Tensor.__deepcopy__.__code__.co_names
# The setting a survey's copy runs in: its semantics are silent's.
_SETTING = ModeSetting(Mode.SILENT, Source.SCOPE, "deepcopy_shim.find_nonleaf_tensors(obj)")
# torch's words for its refusal, for a copy a scope without the shim makes inside a survey.
_REFUSAL = ("Only Tensors created explicitly by the user (graph leaves) support the deepcopy "
            "protocol at the moment (met by deepcopy_shim's survey of a copy)")


class Survey:
    """One survey: its own copy (see `run`), whose record holds the tensors with history met."""

    __slots__ = ("copy",)

    def __init__(self) -> None:
        self.copy: Optional[Copy] = None

    def copier_for(self, cls: type) -> Optional[Callable[[Any, Any], Any]]:
        """The copier for an object of class `cls` in a copy made during this survey: the
        stand-in's, for a tensor whose `__deepcopy__` is torch's or `nn.Parameter`'s; None:
        deepcopy's own way (modules are reduced and rebuilt as natively)."""
        if issubclass(cls, _Tensor) and _stands_in(cls):
            return self._copy_dispatched
        return None

    def _copy_dispatched(self, tensor: _Tensor, memo: Any) -> Any:
        copy_ = current_copy()
        assert copy_ is not None  # the dispatch table gave this copier inside a copy
        return self.copy_tensor(tensor, memo, sys._getframe(1), copy_)

    def copy_tensor(self, tensor: _Tensor, memo: Any, caller: Any, copy_: Copy) -> Any:
        """The stand-in copy of `tensor` (called by the frame `caller`, in `copy_`: the
        survey's own copy, or one made in a scope entered during it), memoised in `memo`,
        after the parts of it the copy would deep-copy (grad, slots, `__dict__`)."""
        found = _protocol.own_get(memo, id(tensor), _protocol.NIL)
        if found is not _protocol.NIL:
            return found
        with _quiet():  # the shim's own reads, seen by no torch function mode of the user's
            leaf = tensor.is_leaf
        if not leaf:
            if copy_ is self.copy:
                copy_.meet(tensor, caller, _SETTING)
            elif copy_.setting is None:  # a scope without the shim: torch's own refusal
                raise RuntimeError(_REFUSAL)
            elif copy_.setting.mode is Mode.STRICT:
                raise NonLeafTensorError(
                    "deepcopy_shim: refused a tensor with autograd history (met by the survey "
                    "of a copy)", paths=("",), mode=Mode.STRICT, tensors=(tensor,))
        twin = _stand_in(tensor)
        cls = type(tensor)
        if getattr(cls, "__deepcopy__", None) is _Tensor.__deepcopy__:
            # What torch's Tensor.__deepcopy__ copies beside the data (and the shim's copy of a
            # tensor with history, which goes through it): .grad (retained, for a non-leaf),
            # slots of a subclass, the instance dict without torch's non-serializable caches.
            with _quiet():
                grad = tensor.grad if leaf or tensor.retains_grad else None
            if grad is not None:
                grad_twin = self.copy_tensor(grad, memo, sys._getframe(0), copy_)
                try:
                    with _quiet():
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
                    with _quiet():
                        twin._clear_non_serializable_cached_data()
                _protocol.keep_alive(twin.__dict__, memo)
                twin.__dict__ = copy.deepcopy(twin.__dict__, memo)
        _protocol.own_set(memo, id(tensor), twin)
        return twin


def _stand_in(tensor: _Tensor) -> Any:
    """A tensor on the meta device like `tensor`: class, dtype, shape, strides, requires_grad."""
    # No torch function or dispatch mode of the user's, and no subclass, sees the survey's tensors.
    with _quiet(), _disable_current_modes():
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


def dry_memo(kind: type = dict, entries: Optional[Dict[Any, Any]] = None) -> Any:
    """A memo for a survey, of the class `kind` of the copy's memo where that is a dict
    subclass (so that its own methods, such as pyro's `get`, answer as they do in the copy),
    holding `entries`."""
    memo: Any = {}
    if issubclass(kind, dict) and kind is not dict:
        try:
            memo = kind.__new__(kind)
            dict.__init__(memo)
        except Exception:  # a memo class the survey cannot make: the plain kind
            memo = {}
    if entries:
        dict.update(memo, entries)
    return memo


def run(root: Any, memo: Any, hold: Callable[[], ContextManager[Any]]
        ) -> Tuple[List[Entry], Optional[str]]:
    """Survey the copy of `root` with `memo` (from `dry_memo`) while `hold()` keeps the patch
    installed; return the tensors with history met, located, and what stopped the copy
    (`"TypeError: ..."`), if anything did (the entries then are those met until then)."""
    survey = Survey()
    error: Optional[str] = None
    with hold():
        _modes.push_scope(survey, _SETTING, survey=survey)
        try:
            survey.copy = own = Copy(root, memo, _SETTING, sys._getframe(0), survey)
            with opened(own):
                try:
                    copy.deepcopy(root, memo)
                except Exception as exc:
                    error = f"{type(exc).__name__}: {exc}"  # the words: the error would hold this frame
        finally:
            _modes.pop_scope(survey)
            survey.copy = None  # (the survey and its copy refer to each other until here)
    return entries(root, own.met), error
