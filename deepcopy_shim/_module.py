"""Copying a module: rebuilt from its own state, faithful to what native deepcopy makes."""

from __future__ import annotations

import copy
import copyreg
from collections import OrderedDict
from types import MethodType
from typing import Any, Dict, Optional

import torch

from . import _modes
from ._report import report_for

__all__ = ["ModuleDeepcopy", "copy_module"]

_deepcopy = copy.deepcopy
# deepcopy returns these unchanged and never memoises them: skipping the call is exact.
_ATOMIC = frozenset((type(None), bool, int, float, complex, str, bytes))
_DICTS = (dict, OrderedDict)
_TENSOR_DICTS = ("_parameters", "_buffers", "_modules")


class ModuleDeepcopy:
    """The descriptor installed as ``torch.nn.Module.__deepcopy__`` while the shim is installed.

    On an instance it returns the bound copier; on the class it raises ``AttributeError``, so
    ``hasattr(cls, "__deepcopy__")`` stays False for every module class.
    ``torch.nn.utils.parametrize`` only gives its dynamic classes a ``__deepcopy__`` of their own
    when that check is False; a module parametrized while the shim is installed must still copy
    after the shim is removed.  A ``__deepcopy__`` defined by a class that follows ``nn.Module``
    in the MRO (a mixin listed after it) would be shadowed by this one, so it is honoured here.
    """

    __slots__ = ()

    def __get__(self, instance: Any, owner: Any = None) -> Any:
        if instance is None:
            raise AttributeError("__deepcopy__")
        inherited = _deepcopy_after_module(type(instance))
        if inherited is not None:
            return inherited.__get__(instance, type(instance))
        return MethodType(copy_module, instance)

    def __repr__(self) -> str:
        return "<deepcopy_shim nn.Module.__deepcopy__>"


def _deepcopy_after_module(cls: type) -> Optional[Any]:
    mro = cls.__mro__
    for klass in mro[mro.index(torch.nn.Module) + 1:]:
        found = klass.__dict__.get("__deepcopy__")
        if found is not None:
            return found
    return None


def copy_module(module: torch.nn.Module, memo: Dict[Any, Any]) -> Any:
    """Deep-copy ``module`` (called as its ``__deepcopy__``); returns the copy, memoised.

    The object is reduced exactly as ``copy.deepcopy`` reduces it (``copyreg.dispatch_table``,
    then ``__reduce_ex__(4)``, so custom ``__getstate__``/``__reduce_ex__``/``__slots__`` are
    honoured).  A plain reduction (``copyreg.__newobj__``, a state dict, nothing else) is rebuilt
    by the fast path below; anything else, and every copy made outside the shim's modes, goes
    through ``copy._reconstruct``, the very code native deepcopy runs.  In mode ``strict`` the
    whole copied object is checked before anything is copied.
    """
    mode = _modes.current_mode()
    if mode is _modes.Mode.STRICT:
        report_for(memo, module).check_strict()
    cls = type(module)
    reductor = copyreg.dispatch_table.get(cls)
    rv = reductor(module) if reductor is not None else module.__reduce_ex__(4)
    if isinstance(rv, str):
        return module
    if mode is None or not _is_plain_reduction(rv, cls):
        return copy._reconstruct(module, memo, *rv)  # type: ignore[attr-defined]
    new = rv[0](*rv[1])
    memo[id(module)] = new
    state = _copy_state(rv[2], memo)
    setstate = getattr(new, "__setstate__", None)
    if setstate is not None:
        setstate(state)
    else:
        new.__dict__.update(state)
    return new


def _is_plain_reduction(rv: Any, cls: type) -> bool:
    return (
        len(rv) >= 3
        and rv[0] is copyreg.__newobj__
        and len(rv[1]) == 1
        and rv[1][0] is cls
        and type(rv[2]) is dict
        and all(extra is None for extra in rv[3:])
    )


def _copy_state(state: Dict[str, Any], memo: Dict[Any, Any]) -> Dict[str, Any]:
    """``copy.deepcopy(state, memo)`` for a module's state dict, without its generic overhead.

    Equal to the generic copy item by item: the same dict types, the same memo entries (so a
    ``RemovableHandle`` or anything else referring to a hook dict still finds its copy), the
    same deepcopy of every value that is not an atom or an empty dict.  Most of a module's state
    is ~15 hook dicts that are almost always empty; the generic path reduces each of them.
    """
    new_state: Dict[str, Any] = {}
    for key, value in state.items():
        kind = type(value)
        if kind in _ATOMIC:
            new_state[key] = value
        elif kind in _DICTS and _is_bare_dict(value):
            if key in _TENSOR_DICTS:
                new_state[key] = _copy_dict(value, memo)
            elif not value:
                existing = memo.get(id(value))
                if existing is None:
                    existing = memo[id(value)] = kind()
                new_state[key] = existing
            else:
                new_state[key] = _deepcopy(value, memo)
        else:
            new_state[key] = _deepcopy(value, memo)
    return new_state


def _is_bare_dict(mapping: Dict[str, Any]) -> bool:
    # deepcopy reduces an OrderedDict (dict has its own copier): a copyreg registration or
    # instance attributes (its reduction's state) would make its copy more than its items.
    return type(mapping) is dict or (
        OrderedDict not in copyreg.dispatch_table and not mapping.__dict__
    )


def _copy_dict(mapping: Dict[str, Any], memo: Dict[Any, Any]) -> Dict[str, Any]:
    # The same order as copy's _deepcopy_dict: memoise the new dict, then copy the items.
    existing = memo.get(id(mapping))
    if existing is not None:
        return existing  # type: ignore[no-any-return]
    new: Dict[str, Any] = type(mapping)()
    memo[id(mapping)] = new
    for name, item in mapping.items():
        new[name] = None if item is None else _deepcopy(item, memo)
    return new
