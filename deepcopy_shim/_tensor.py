"""Copying one tensor: torch's own `Tensor.__deepcopy__` first, the detached copy when it refuses."""

from __future__ import annotations

import copy
import copyreg
import sys
from types import MethodType
from typing import Any, Callable, Dict, Optional, Tuple

import torch
import wrapt

from . import _modes, _protocol, _record, _report
from ._warnings import DetachedCopyError

__all__ = ["StableFunctionWrapper", "copy_detached", "make_tensor_deepcopy_wrapper", "refusal_problem"]

# What torch's refusal says, in every release from 2.0 on (older ones say less after it).
_REFUSAL = "graph leaves"

# Keys torch's own deepcopy strips from a tensor's __dict__ (`_clear_non_serializable_cached_data`):
# PyCapsules that cannot be copied and are re-created on demand.  We drop them from the copy
# instead of clearing them on the source, which must never change.
_NON_SERIALIZABLE_KEYS = frozenset(
    ("_sym_sizes_capsule", "_sym_sizes_capsule_len", "_sym_strides_capsule", "_sym_strides_capsule_len")
)


class StableFunctionWrapper(wrapt.FunctionWrapper):  # type: ignore[type-arg]
    """A `wrapt.FunctionWrapper` whose class attribute access returns the wrapper itself.

    wrapt binds a fresh `BoundFunctionWrapper` on every `Tensor.__deepcopy__` access; torch
    compares `func is Tensor.__deepcopy__` (FakeTensor's `__torch_function__`), and
    `handle_torch_function` hands that attribute to every `__torch_function__`, so it must
    keep one identity.  As a wrapt proxy it also hashes and compares equal to the original, so
    torch's cached sets of Tensor methods (`torch.overrides`) still recognise it.

    Instance access binds with a plain `MethodType`: the wrapper then sees `instance=None`
    and the tensor as `args[0]`, exactly as on torch's redispatch path.  Measured on copies of
    16-element tensors this costs 1.07x native, against 1.12x for wrapt's own binding.
    """

    def __get__(self, instance: Any, owner: Any = None) -> Any:
        if instance is None:
            return self
        return MethodType(self, instance)


def refusal_problem(original: Callable[..., Any]) -> Optional[str]:
    """None if `original` refuses a non-leaf tensor the way the shim expects, else why not.

    The shim handles exactly one error of torch's; if this torch copies non-leaf tensors itself,
    or refuses them in words the shim does not recognise, the patch must stay out of the way.
    """
    probe = torch.ones(1, requires_grad=True) * 2
    try:
        original(probe, {})
    except RuntimeError as exc:
        if _REFUSAL in str(exc):
            return None
        return (f"deepcopy_shim: torch {torch.__version__} refuses to deep-copy a non-leaf tensor "
                f"with a message deepcopy_shim does not recognise ({exc}); the shim stays out of "
                "the way (copies behave natively). Please report this with the output of "
                "`python -m deepcopy_shim --check`.")
    except Exception as exc:
        return (f"deepcopy_shim: torch {torch.__version__} failed in an unexpected way when "
                f"deep-copying a non-leaf tensor ({type(exc).__name__}: {exc}); the shim stays "
                "out of the way (copies behave natively).")
    return (f"deepcopy_shim: torch {torch.__version__} deep-copies non-leaf tensors itself; the "
            "shim is not needed and stays out of the way (copies behave natively).")


def make_tensor_deepcopy_wrapper(original: Callable[..., Any]) -> Callable[..., Any]:
    """Return the wrapt wrapper function for `Tensor.__deepcopy__` around `original`."""

    def tensor_deepcopy(wrapped: Callable[..., Any], instance: Any, args: Tuple[Any, ...],
                        kwargs: Dict[str, Any]) -> Any:
        # Delegate first, and only handle torch's "graph leaves" refusal.  Inspecting the tensor
        # before delegating (is_leaf, has_torch_function) recurses forever on the
        # __torch_function__ redispatch path; delegating first lets torch do everything it can
        # (leaves, memo hits, subclasses, sparse, quantized) exactly as it always does.
        try:
            return wrapped(*args, **kwargs)
        except RuntimeError as exc:
            setting = _modes.current_setting()
            if setting is None or _REFUSAL not in str(exc):
                raise
            tensor, memo = _bind(instance, args, kwargs)
            if tensor.is_leaf:  # the refusal came from somewhere inside, not from this tensor
                raise
            # torch checks is_leaf before its memo: a tensor already copied in this deepcopy
            # (reached again through a direct __deepcopy__ call) is a memo hit, not a copy.
            existing = memo.get(id(tensor), _protocol.NIL)
            if existing is not _protocol.NIL:
                return existing
            return copy_detached(original, tensor, memo, setting, sys._getframe(1))

    return tensor_deepcopy


def _bind(instance: Any, args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> Tuple[Any, Dict[Any, Any]]:
    # StableFunctionWrapper always calls with instance=None and the tensor first; a wrapt
    # rebinding (someone wrapping our wrapper) may still pass the instance separately.
    if instance is None:
        instance, args = args[0], args[1:]
    memo = args[0] if args else kwargs["memo"]
    return instance, memo


def copy_detached(original: Callable[..., Any], tensor: torch.Tensor, memo: Dict[Any, Any],
                  setting: _modes.ModeSetting, caller: Any) -> torch.Tensor:
    """Copy the non-leaf `tensor` as torch copies its detached leaf, then restore the rest.

    Going through `original` on a detached alias (rather than `clone()`) keeps torch's
    storage memo in charge, so views and their bases copied in one deepcopy still share storage,
    and keeps strides, offset, sparse and quantized layouts exactly as torch makes them; conj and
    neg bits are kept as bits (torch resolves them on leaves).  Then: `requires_grad`, a
    retained `.grad`, and a subclass's `__dict__` and slots.  `caller` is the frame that
    called `Tensor.__deepcopy__`.

    The tensor enters the copy's record (see `_record`) as it is met, so that the record
    keeps the order of the copy, and leaves it again if its copy fails: then
    `DetachedCopyError` names the tensor's path, with torch's error as its cause (and
    not chained under the "graph leaves" refusal).
    """
    record = _record.record_for(memo, setting, tensor)
    met = record.meet(tensor, caller) if record is not None else None
    cls = type(tensor)
    try:
        with torch.no_grad():
            alias = tensor.detach()
            if type(alias) is not cls:
                # Under torch-function-disabled redispatch detach() returns a plain Tensor.
                alias = alias.as_subclass(cls)
            # torch resolves conj/neg bits physically (a new storage, aliasing lost); copy the
            # raw data through the storage memo instead and put the lazy bit back on the copy.
            conj, neg = alias.is_conj(), alias.is_neg()
            if conj:
                alias = alias.conj()
            if neg:
                alias = torch._neg_view(alias)
            _protocol.keep_alive(alias, memo)
            result: torch.Tensor = original(alias, memo)
            if neg:
                result = torch._neg_view(result)
            if conj:
                result = result.conj()
    except Exception as exc:
        if record is not None and met is not None:
            record.forget(met)
        path = _record.path_here(memo, tensor, setting)
        raise DetachedCopyError(_report.detached_copy_failure(path, tensor, exc), path=path) from exc
    memo[id(tensor)] = result
    if tensor.requires_grad:
        result.requires_grad_(True)
    # .grad of a non-leaf is only readable without torch's warning when it is retained.
    if tensor.retains_grad:
        grad = tensor.grad
        if grad is not None:
            result.grad = copy.deepcopy(grad, memo)
    if cls is not torch.Tensor:
        for slot in copyreg._slotnames(cls):  # type: ignore[attr-defined]
            if hasattr(tensor, slot):
                setattr(result, slot, copy.deepcopy(getattr(tensor, slot), memo))
        state = tensor.__dict__
        if not _NON_SERIALIZABLE_KEYS.isdisjoint(state):
            state = {k: v for k, v in state.items() if k not in _NON_SERIALIZABLE_KEYS}
        result.__dict__ = copy.deepcopy(state, memo)
    if record is not None and met is not None:
        record.copied(met)
    return result
