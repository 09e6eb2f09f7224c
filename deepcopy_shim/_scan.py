"""Finding the non-leaf tensors reachable from an object, with readable paths."""

from __future__ import annotations

import functools
import sys
import types
import weakref
from typing import TYPE_CHECKING, Any, Iterator, List, Tuple

if TYPE_CHECKING:
    import torch

__all__ = ["find_nonleaf_tensors", "describe_tensor"]

# Objects deepcopy treats as atomic or never copies: nothing to look inside.
_OPAQUE = (
    type(None), bool, int, float, complex, str, bytes, bytearray, range, type,
    types.FunctionType, types.BuiltinFunctionType, types.ModuleType, types.CodeType,
    weakref.ref, property, type(Ellipsis), type(NotImplemented),
)


def find_nonleaf_tensors(obj: Any) -> List[Tuple[str, torch.Tensor]]:
    """Return every non-leaf tensor reachable from ``obj`` as ``(path, tensor)`` pairs.

    The walk follows what ``copy.deepcopy`` copies: modules (parameters, buffers, submodules,
    hooks and plain attributes), dicts, lists, tuples, sets, dataclasses, bound methods,
    ``functools.partial`` objects and plain objects' ``__dict__`` and ``__slots__``; a tensor's
    retained ``.grad`` and a tensor subclass's ``__dict__`` too.  Each object is visited once
    (cycles and shared objects are safe); each tensor is reported once, under the first path
    that reaches it, in the order ``copy.deepcopy`` would meet it.

    Paths read like Python access from ``obj``: ``head.last_out``, ``cache['mid']``,
    ``cache['list'][0]``; submodules use their ``state_dict`` names (``layers.0.out``); members
    of a set are numbered ``{0}``, ``{1}`` in iteration order; ``''`` is ``obj`` itself.

    Returns an empty list when torch has not been imported (no tensor can exist then).  Reading
    never modifies ``obj`` and never triggers torch's warning about ``.grad`` of non-leaf tensors.
    """
    torch = sys.modules.get("torch")
    if torch is None or not hasattr(torch, "nn"):
        return []
    return list(_walk(obj, torch))


def describe_tensor(tensor: torch.Tensor) -> str:
    """``grad_fn=AddmmBackward0, shape=(4, 8), dtype=torch.float32`` (plus the device if not CPU)."""
    grad_fn = tensor.grad_fn
    text = (
        f"grad_fn={type(grad_fn).__name__ if grad_fn is not None else None}, "
        f"shape={tuple(tensor.shape)}, dtype={tensor.dtype}"
    )
    if tensor.device.type != "cpu":
        text += f", device={tensor.device}"
    return text


def _attr(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name


def _key(prefix: str, key: Any) -> str:
    text = repr(key)
    if len(text) > 40:  # a tensor or a large object as a key: name its type instead
        text = f"<{type(key).__name__} at {id(key):#x}>"
    return f"{prefix}[{text}]"


def _walk(root: Any, torch: Any) -> Iterator[Tuple[str, Any]]:
    Tensor = torch.Tensor
    Module = torch.nn.Module
    tensor_deepcopy = Tensor.__deepcopy__  # stable identity, patched or not
    seen = set()
    # An explicit stack instead of recursion: object graphs can be deeper than the recursion
    # limit (long linked structures), and children are pushed reversed to keep deepcopy's order.
    stack: List[Tuple[str, Any]] = [("", root)]
    while stack:
        path, obj = stack.pop()
        if isinstance(obj, _OPAQUE) or id(obj) in seen:
            continue
        seen.add(id(obj))
        children: List[Tuple[str, Any]] = []
        if isinstance(obj, Tensor):
            if not obj.is_leaf:
                yield path, obj
            # Only Tensor.__deepcopy__ copies .grad (Parameter's does not); a non-leaf's .grad
            # is only read when retained, which is also what keeps torch from warning.
            if type(obj).__deepcopy__ is tensor_deepcopy and (obj.is_leaf or obj.retains_grad):
                grad = obj.grad
                if grad is not None:
                    children.append((_attr(path, "grad"), grad))
            if type(obj) is not Tensor:
                children.extend((_attr(path, k), v) for k, v in vars(obj).items())
        elif isinstance(obj, Module):
            for key, value in vars(obj).items():
                if key in ("_parameters", "_buffers", "_modules") and isinstance(value, dict):
                    seen.add(id(value))
                    children.extend(
                        (_attr(path, name), item) for name, item in value.items()
                    )
                else:
                    children.append((_attr(path, key), value))
        elif isinstance(obj, dict):
            children.extend((_key(path, k), v) for k, v in obj.items())
        elif isinstance(obj, tuple) and hasattr(obj, "_fields"):
            children.extend((_attr(path, f), v) for f, v in zip(obj._fields, obj))
        elif isinstance(obj, (list, tuple)):
            children.extend((f"{path}[{i}]", v) for i, v in enumerate(obj))
        elif isinstance(obj, (set, frozenset)):
            children.extend((f"{path}{{{i}}}", v) for i, v in enumerate(obj))
        elif isinstance(obj, types.MethodType):
            children.append((_attr(path, "__self__"), obj.__self__))
        elif isinstance(obj, functools.partial):
            children.extend((f"{path}.args[{i}]", v) for i, v in enumerate(obj.args))
            children.extend((_key(f"{path}.keywords", k), v) for k, v in obj.keywords.items())
        else:
            children.extend(_object_fields(path, obj))
        stack.extend(reversed(children))


def _object_fields(path: str, obj: Any) -> Iterator[Tuple[str, Any]]:
    # Dataclasses need nothing special: their fields live in __dict__ or in __slots__.
    state = getattr(obj, "__dict__", None)
    if isinstance(state, dict):
        for key, value in state.items():
            yield _attr(path, str(key)), value
    for klass in type(obj).__mro__:
        slots = klass.__dict__.get("__slots__", ())
        for slot in (slots,) if isinstance(slots, str) else slots:
            if slot in ("__dict__", "__weakref__"):
                continue
            if slot.startswith("__") and not slot.endswith("__"):  # private: name-mangled
                slot = f"_{klass.__name__.lstrip('_')}{slot}"
            if hasattr(obj, slot):
                yield _attr(path, slot), getattr(obj, slot)
