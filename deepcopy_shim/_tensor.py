"""Copying one tensor: torch's own ``Tensor.__deepcopy__`` first, the detached copy when it refuses."""

from __future__ import annotations

import copy
import copyreg
from typing import Any, Callable, Dict, Tuple

import torch
import wrapt

from . import _modes
from ._report import report_for

__all__ = ["StableFunctionWrapper", "make_tensor_deepcopy_wrapper", "keep_alive"]

# Keys torch's own deepcopy strips from a tensor's __dict__ (``_clear_non_serializable_cached_data``):
# PyCapsules that cannot be copied and are re-created on demand.  We drop them from the copy
# instead of clearing them on the source, which must never change.
_NON_SERIALIZABLE_KEYS = frozenset(
    ("_sym_sizes_capsule", "_sym_sizes_capsule_len", "_sym_strides_capsule", "_sym_strides_capsule_len")
)


class StableFunctionWrapper(wrapt.FunctionWrapper):  # type: ignore[misc]
    """A ``wrapt.FunctionWrapper`` that is itself what class attribute access returns.

    wrapt binds a fresh wrapper on every ``Tensor.__deepcopy__`` access; torch compares
    ``func is Tensor.__deepcopy__`` (FakeTensor's ``__torch_function__``) and uses it as a dict
    key (``torch.overrides``), and ``handle_torch_function`` passes it around, so the patched
    attribute must keep one identity on class access.  Instance access still binds as usual.
    """

    def __get__(self, instance: Any, owner: Any = None) -> Any:
        if instance is None:
            return self
        return super().__get__(instance, owner)


def keep_alive(obj: Any, memo: Dict[Any, Any]) -> None:
    """Keep ``obj`` alive as long as ``memo``, exactly as ``copy.deepcopy`` does for its sources.

    The memo is keyed by ``id()``; a temporary memoised and then freed would let a later object
    reuse its id and receive the wrong copy (seen as "can't assign Variable as its own grad").
    """
    memo.setdefault(id(memo), []).append(obj)


def make_tensor_deepcopy_wrapper(original: Callable[..., Any]) -> Callable[..., Any]:
    """Return the wrapt wrapper function for ``Tensor.__deepcopy__`` around ``original``."""

    def tensor_deepcopy(wrapped: Callable[..., Any], instance: Any, args: Tuple[Any, ...],
                        kwargs: Dict[str, Any]) -> Any:
        # Delegate first, and only handle torch's "graph leaves" refusal.  Inspecting the tensor
        # before delegating (is_leaf, has_torch_function) recurses forever on the
        # __torch_function__ redispatch path; delegating first lets torch do everything it can
        # (leaves, memo hits, subclasses, sparse, quantized) exactly as it always does.
        try:
            return wrapped(*args, **kwargs)
        except RuntimeError as exc:
            mode = _modes.current_mode()
            if mode is None or "graph leaves" not in str(exc):
                raise
            tensor, memo = _bind(instance, args, kwargs)
            if tensor.is_leaf:  # the refusal came from somewhere inside, not from this tensor
                raise
            existing = memo.get(id(tensor))
            if existing is not None:
                return existing
            if mode is _modes.Mode.STRICT:
                raise report_for(memo, tensor).refuse(tensor) from None
            if mode is _modes.Mode.WARN:
                report_for(memo, tensor).warn_detached(tensor)
            return copy_detached(original, tensor, memo)

    return tensor_deepcopy


def _bind(instance: Any, args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> Tuple[Any, Dict[Any, Any]]:
    # Bound access (t.__deepcopy__(memo)) gives the instance; class access
    # (Tensor.__deepcopy__(t, memo), used by torch's __torch_function__ redispatch) gives None.
    if instance is None:
        instance, args = args[0], args[1:]
    memo = args[0] if args else kwargs["memo"]
    return instance, memo


def copy_detached(original: Callable[..., Any], tensor: torch.Tensor, memo: Dict[Any, Any]) -> torch.Tensor:
    """Copy the non-leaf ``tensor`` as torch copies its detached leaf, then restore the rest.

    Going through ``original`` on a detached alias (rather than ``clone()``) keeps torch's
    storage memo in charge, so views and their bases copied in one deepcopy still share storage,
    and keeps strides, offset, conj/neg bits, sparse and quantized layouts exactly as torch makes
    them.  Then: ``requires_grad``, a retained ``.grad``, and a subclass's ``__dict__`` and slots.
    """
    cls = type(tensor)
    alias = tensor.detach()
    if type(alias) is not cls:
        # Under torch-function-disabled redispatch detach() returns a plain Tensor.
        alias = alias.as_subclass(cls)
    keep_alive(alias, memo)
    result = original(alias, memo)
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
    return result
