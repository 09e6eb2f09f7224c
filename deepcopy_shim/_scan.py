"""Finding the non-leaf tensors reachable from an object, with readable paths."""

from __future__ import annotations

import functools
import sys
import types
import weakref
from collections import OrderedDict
from typing import TYPE_CHECKING, Any, Iterator, List, Optional, Set, Tuple

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


# How a child hangs from its parent, to spell its path: `.name`, `[key]`, `[i]`, `{i}`, or a
# pre-formatted step (partial's args/keywords).
_ATTR, _ITEM, _INDEX, _MEMBER, _RAW = range(5)
# deepcopy returns these unchanged and never memoises them (the module copy relies on it too).
ATOMIC_TYPES = frozenset((type(None), bool, int, float, complex, str, bytes))
_EMPTY_SKIPPABLE = frozenset((dict, OrderedDict, list, tuple, set, frozenset))
_TENSOR_DICTS = ("_parameters", "_buffers", "_modules")

# A path is built only for the tensors found: while walking, each object carries a link
# (parent link, step kind, step) instead of a string, since formatting a path for every one of
# the tens of thousands of objects in a large model costs more than the whole walk.
_Link = Optional[Tuple[Any, int, Any]]


def _path(link: _Link) -> str:
    steps: List[str] = []
    while link is not None:
        link, kind, step = link
        if kind == _ATTR:
            steps.append(f".{step}")
        elif kind == _ITEM:
            text = repr(step)
            if len(text) > 40:  # a tensor or a large object as a key: name its type instead
                text = f"<{type(step).__name__} at {id(step):#x}>"
            steps.append(f"[{text}]")
        elif kind == _INDEX:
            steps.append(f"[{step}]")
        elif kind == _MEMBER:
            steps.append(f"{{{step}}}")
        else:
            steps.append(step)
    path = "".join(reversed(steps))
    return path[1:] if path.startswith(".") else path


def _walk(root: Any, torch: Any) -> Iterator[Tuple[str, Any]]:
    Tensor = torch.Tensor
    Module = torch.nn.Module
    tensor_deepcopy = Tensor.__deepcopy__  # stable identity, patched or not
    seen: Set[int] = set()
    # An explicit stack instead of recursion: object graphs can be deeper than the recursion
    # limit (long linked structures); children are pushed reversed to keep deepcopy's order.
    stack: List[Tuple[Any, _Link]] = [(root, None)]
    while stack:
        obj, link = stack.pop()
        kind = type(obj)
        if kind in ATOMIC_TYPES or isinstance(obj, _OPAQUE) or id(obj) in seen:
            continue
        seen.add(id(obj))
        children: List[Tuple[Any, _Link]] = []
        if isinstance(obj, Tensor):
            if not obj.is_leaf:
                yield _path(link), obj
            # Only Tensor.__deepcopy__ copies .grad (Parameter's does not); a non-leaf's .grad
            # is only read when retained, which is also what keeps torch from warning.
            if kind.__deepcopy__ is tensor_deepcopy and (obj.is_leaf or obj.retains_grad):
                grad = obj.grad
                if grad is not None:
                    children.append((grad, (link, _ATTR, "grad")))
            if kind is not Tensor:
                children.extend((v, (link, _ATTR, k)) for k, v in vars(obj).items())
        elif isinstance(obj, Module):
            for key, value in obj.__dict__.items():
                vkind = type(value)
                if vkind in ATOMIC_TYPES or (vkind in _EMPTY_SKIPPABLE and not value):
                    continue  # most of a module's state: flags and empty hook dicts
                if key in _TENSOR_DICTS and isinstance(value, dict):
                    seen.add(id(value))
                    children.extend(
                        (item, (link, _ATTR, name)) for name, item in value.items() if item is not None
                    )
                else:
                    children.append((value, (link, _ATTR, key)))
        elif isinstance(obj, dict):
            children.extend((v, (link, _ITEM, k)) for k, v in obj.items())
        elif isinstance(obj, tuple) and hasattr(obj, "_fields"):
            children.extend((v, (link, _ATTR, f)) for f, v in zip(obj._fields, obj))
        elif isinstance(obj, (list, tuple)):
            children.extend((v, (link, _INDEX, i)) for i, v in enumerate(obj))
        elif isinstance(obj, (set, frozenset)):
            children.extend((v, (link, _MEMBER, i)) for i, v in enumerate(obj))
        elif isinstance(obj, types.MethodType):
            children.append((obj.__self__, (link, _ATTR, "__self__")))
        elif isinstance(obj, functools.partial):
            children.extend((v, (link, _RAW, f".args[{i}]")) for i, v in enumerate(obj.args))
            children.extend(
                (v, (link, _RAW, f".keywords[{k!r}]")) for k, v in obj.keywords.items()
            )
        else:
            children.extend((v, (link, _ATTR, name)) for name, v in _object_fields(obj))
        stack.extend(reversed(children))


def _object_fields(obj: Any) -> Iterator[Tuple[str, Any]]:
    # Dataclasses need nothing special: their fields live in __dict__ or in __slots__.
    state = getattr(obj, "__dict__", None)
    if isinstance(state, dict):
        for key, value in state.items():
            yield str(key), value
    for klass in type(obj).__mro__:
        slots = klass.__dict__.get("__slots__", ())
        for slot in (slots,) if isinstance(slots, str) else slots:
            if slot in ("__dict__", "__weakref__"):
                continue
            if slot.startswith("__") and not slot.endswith("__"):  # private: name-mangled
                slot = f"_{klass.__name__.lstrip('_')}{slot}"
            if hasattr(obj, slot):
                yield slot, getattr(obj, slot)
