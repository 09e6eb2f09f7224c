"""Copying a module: rebuilt from its own state, faithful to what native deepcopy makes."""

from __future__ import annotations

import copy
import copyreg
import gc
import operator
from collections import OrderedDict
from typing import Any, Callable, Dict, FrozenSet, Optional

import torch

from ._protocol import ATOMIC_TYPES as _ATOMIC  # skipping deepcopy for these is exact
from ._protocol import COPY_FRAMES, dispatch_is_copys_own, keep_alive
from ._protocol import DEEPCOPY as _deepcopy
from ._protocol import DEEPCOPY_ATOMIC as _DEEPCOPY_ATOMIC
from ._protocol import DISPATCH as _DEEPCOPY_DISPATCH
from ._protocol import NIL as _NIL

__all__ = ["copy_module"]

# pytest leaves this module's frames out of the tracebacks it shows: a copy that fails inside
# a module reads as native deepcopy's frames and the user's own.
__tracebackhide__ = True

_referents = gc.get_referents
Parameter = torch.nn.Parameter
_MODULE_GETATTR = torch.nn.Module.__getattr__
_OBJECT_GETATTRIBUTE = object.__getattribute__
_MODULE_STORES = ("_parameters", "_buffers", "_modules")
_NEWOBJ = copyreg.__newobj__  # type: ignore[attr-defined]
# The copy module, typed as Any: `copy._reconstruct` is read when it is called, as deepcopy reads
# it, with no type checker's comment on the line a traceback shows.
_copy: Any = copy


def copy_module(module: Any, memo: Dict[Any, Any]) -> Any:
    """Deep-copy `module`, an `nn.Module` (called by `copy.deepcopy` as the copier its table
    gives for the module's class, in a copy made in a mode; see `_dispatch`); returns the copy,
    which deepcopy memoises.

    Asks the module what deepcopy asks, in its order: its `__deepcopy__` (called if it has one),
    then its reduction (`copyreg.dispatch_table`, then `__reduce_ex__(4)`).  A plain reduction
    (`copyreg.__newobj__` of the class, a state dict, nothing else) is rebuilt here: a new
    instance, memoised, its state copied item by item exactly as deepcopy copies that dict
    (`_copy_state`), then given to the instance as `copy._reconstruct` gives it (its
    `__setstate__`, whatever wraps it: torch.compile's generation tagging sees every copy).
    Anything else goes through `copy._reconstruct`, the very code native deepcopy runs.
    """
    cls: Any = type(module)
    copier = _own_deepcopy(module, cls)
    if copier is not None:
        return copier(memo)
    reductor = copyreg.dispatch_table.get(cls)
    rv: Any = reductor(module) if reductor else module.__reduce_ex__(4)
    if reductor or not _is_plain_reduction(rv, cls):
        return module if isinstance(rv, str) else _copy._reconstruct(module, memo, *rv)
    new: Any = cls.__new__(cls)  # what rv[0](*rv[1]), copyreg.__newobj__(cls), does
    memo[id(module)] = new
    # What deepcopy(state, memo) makes of the state dict, memoised as its dict copier memoises it.
    state = _copy_state(rv[2], memo)
    if hasattr(new, "__setstate__"):  # as copy._reconstruct gives a state to the new object
        new.__setstate__(state)
    else:
        new.__dict__.update(state)
    return new


def _own_deepcopy(module: Any, cls: Any) -> Any:
    """What `getattr(module, "__deepcopy__", None)` is, as deepcopy asks it.  Asked only where
    the answer could be something: nn.Module's own `__getattr__` answers only from the
    module's parameters, buffers and submodules, so a class that has no `__deepcopy__` and
    keeps nn.Module's attribute lookup has none unless the instance names one."""
    if (type(cls) is type and cls.__getattribute__ is _OBJECT_GETATTRIBUTE  # type: ignore[comparison-overlap]
            and cls.__getattr__ is _MODULE_GETATTR  # type: ignore[attr-defined]
            and getattr(cls, "__deepcopy__", None) is None):
        state = module.__dict__
        if "__deepcopy__" not in state:
            for store in _MODULE_STORES:
                members = state.get(store)
                if members and "__deepcopy__" in members:
                    break
            else:
                return None
    return getattr(module, "__deepcopy__", None)


def _is_plain_reduction(rv: Any, cls: Any) -> bool:
    """True if `rv`, the reduction of an instance of `cls`, is one the fast path rebuilds:
    object's own `(copyreg.__newobj__, (cls,), state dict, None, None)`, while deepcopy's own
    copiers for atoms, tuples and dicts are in place."""
    return (
        type(rv) is tuple
        and len(rv) == 5
        and rv[0] is _NEWOBJ
        and rv[3] is None
        and rv[4] is None
        and type(rv[2]) is dict
        and len(rv[1]) == 1
        and rv[1][0] is cls
        # The shortcuts keep atoms and tuples of atoms, and copy dicts, as deepcopy's own
        # copiers do.
        and dispatch_is_copys_own()
    )


def _copy_state(state: Dict[str, Any], memo: Dict[Any, Any]) -> Dict[str, Any]:
    """`copy.deepcopy(state, memo)` for a module's state dict, without its generic overhead.

    Equal to the generic copy item by item, in the same order: the same containers, the same
    memo entries for the module's objects (so a `RemovableHandle` or anything else referring
    to a hook dict still finds its copy; deepcopy's own temporaries, such as the list it
    reduces an empty set to, are never made), the same deepcopy of every value no shortcut
    below covers.  Most of a
    module's state is its hook OrderedDicts (10 in torch 2.0, 11 in 2.13), almost always
    empty, and an empty set; the generic path reduces and reconstructs each of them.
    """
    memo_get = memo.get
    found = memo_get(id(state), _NIL)  # deepcopy asks the memo first, for the dict too
    if found is not _NIL:
        return found  # type: ignore[no-any-return]
    # Atoms, and tuples of atoms, are what deepcopy returns unchanged: start from them.  The
    # new dict is memoised before its items are copied, as deepcopy's dict copier does.
    new_state = memo[id(state)] = dict(state)
    # deepcopy asks the memo with `memo.get`; for a plain dict `in` is the same question.
    plain_memo = type(memo) is dict
    # A copyreg registration would replace the reduction of every OrderedDict or set, a
    # deepcopy dispatch entry their copy.
    plain_odicts = _plain(OrderedDict)
    plain_sets = _plain(set)
    # nn.Module's own hook dicts, when all of them are empty and without instance state:
    # checked together when the first OrderedDict is met, and again after any value whose copy
    # may run other code (which could change them).  None: not checked since.
    empty_hooks: Optional[FrozenSet[str]] = None
    ordered_dict = OrderedDict  # a local: read about 12 times per module
    plain_str, kind_of = str, type  # locals: read once or twice per key
    # id(key) -> its copy, for the keys deepcopy copies (a str subclass: it is no atom); None
    # while there are none, as in almost every module.
    keys_made: Optional[Dict[int, Any]] = None
    for key, value in state.items():
        if kind_of(key) is not plain_str and kind_of(key) not in _ATOMIC:
            # deepcopy copies each key, then its value.  The copy still equals the key (a
            # dict keeps the key it has for an equal one), so new_state is made again below.
            if keys_made is None:
                keys_made = {}
            keys_made[id(key)] = _deepcopy(key, memo)
            empty_hooks = None
        kind = kind_of(value)
        if kind is ordered_dict:
            if empty_hooks is None:
                empty_hooks = _empty_hook_dicts(state) if plain_odicts else _NO_NAMES
            # deepcopy reduces an empty OrderedDict to OrderedDict() plus its instance
            # attributes.  Those are found among its GC referents (an empty one has no others
            # than an instance dict and a weakref list); `value.__dict__` would create an
            # instance dict on the source.  Non-empty ones take the other path.
            if key not in empty_hooks and (value or not plain_odicts or _referents(value)):
                new_state[key] = _copy_value(key, value, memo, plain_odicts)
                empty_hooks = None
                continue
            # The hook dict met first (the case of almost every one): made and memoised here,
            # as the tail below does, without its detour.
            ident = id(value)
            if plain_memo and ident not in memo:
                new_state[key] = memo[ident] = ordered_dict()
                continue
            make: Callable[[], Any] = ordered_dict
        elif kind in _ATOMIC:
            continue
        elif kind is dict:
            # deepcopy's own dict copier: memoise the new dict, then copy each item.
            if value:
                if key == "_parameters":
                    new_state[key] = _copy_parameters(value, memo)
                else:
                    new_state[key] = _copy_items(value, memo, _deepcopy)
                empty_hooks = None
                continue
            make = dict
        elif kind is set and plain_sets and not value:
            make = set  # deepcopy reduces a set to set(list(items)): set([])
        elif kind is tuple and plain_memo and id(value) not in memo and _all_atoms(value):
            # deepcopy asks the memo first (a memo given answers may name a tuple), then its
            # tuple copier returns a tuple of atoms itself: no code runs.
            continue
        else:
            new_state[key] = _copy_value(key, value, memo, plain_odicts)
            empty_hooks = None
            continue
        # The containers made here, memoised as deepcopy memoises them.  Written out rather
        # than called: it runs about 12 times per module, where a call costs ~5% of the whole copy.
        ident = id(value)
        if plain_memo:
            if ident in memo:
                copied = memo[ident]
            else:
                copied = memo[ident] = make()
        else:
            copied = memo_get(ident, _NIL)
            if copied is _NIL:
                copied = memo[ident] = make()
        new_state[key] = copied
    if keys_made is not None:
        rekeyed = {keys_made.get(id(key), key): value for key, value in new_state.items()}
        new_state.clear()
        new_state.update(rekeyed)
    # Kept alive as long as the memo, as deepcopy keeps every object it copied: no id memoised
    # above (the hook dicts made without deepcopy, above all) is taken by a new object.
    keep_alive(state, memo)
    return new_state


# The names nn.Module.__init__ gives its hook dicts (torch 2.0 keeps _parameters, _buffers and
# _modules in OrderedDicts too: those are not hook dicts).
_HOOK_NAMES: FrozenSet[str] = frozenset(
    name for name, value in vars(torch.nn.Module()).items()
    if type(value) is OrderedDict and name not in ("_parameters", "_buffers", "_modules")
)
_hook_dicts = operator.itemgetter(*sorted(_HOOK_NAMES))
_NO_NAMES: FrozenSet[str] = frozenset()


def _empty_hook_dicts(state: Dict[str, Any]) -> FrozenSet[str]:
    """`_HOOK_NAMES` if `state` has every one of them and none holds anything (no item, no
    instance state: no GC referents at all); else no names."""
    try:
        values = _hook_dicts(state)
    except KeyError:
        return _NO_NAMES
    # Only GC referents are asked: an OrderedDict's are its keys, its values and its instance
    # dict, so an empty one without instance state has none.  Its truth would say no more, and
    # a value of another type under a hook dict's name (a tensor of two elements has no truth
    # value) must be asked nothing native deepcopy does not ask.
    return _NO_NAMES if _referents(*values) else _HOOK_NAMES


def _copy_value(key: str, value: Any, memo: Dict[Any, Any], plain_odicts: bool) -> Any:
    """`copy.deepcopy(value, memo)` for a value of a module's state that `_copy_state` does
    not copy itself."""
    kind = type(value)
    if kind is OrderedDict:
        if value and plain_odicts:
            copied = _copy_atomic_items(value, memo)
            if copied is not None:
                return copied
    elif kind is set:
        if _plain(set) and _all_atoms(value):
            # deepcopy reduces a set to set(list(items)): the same atoms, in a new table filled
            # in the source's order (a copy of the source's table may iterate differently).
            return _memoised(value, memo, lambda: set(list(value)))
    return _deepcopy(value, memo)


def _plain(kind: type) -> bool:
    """True if deepcopy copies instances of `kind` through their own reduction."""
    return kind not in copyreg.dispatch_table and kind not in _DEEPCOPY_DISPATCH


def _memoised(value: Any, memo: Dict[Any, Any], make: Callable[[], Any]) -> Any:
    """The copy of `value` in `memo`, else `make()`, memoised as deepcopy memoises it."""
    ident = id(value)
    copied = memo.get(ident, _NIL)
    if copied is _NIL:
        copied = memo[ident] = make()
    return copied


def _copy_atomic_items(value: OrderedDict[Any, Any], memo: Dict[Any, Any]) -> Any:
    """deepcopy of a non-empty OrderedDict whose keys and values deepcopy returns unchanged
    (a hook dict: handle ids and plain functions), or None where that is not the case.

    deepcopy reduces it to `OrderedDict()`, its instance state and its items, and rebuilds it
    in that order, memoised before its items; with no instance state and items that copy to
    themselves, that is `OrderedDict(value)`, memoised.
    """
    dispatch = _DEEPCOPY_DISPATCH
    for key, item in value.items():
        if type(key) not in _ATOMIC:
            return None
        kind = type(item)
        if kind not in _ATOMIC and dispatch.get(kind) is not _DEEPCOPY_ATOMIC:
            return None
    # Its GC referents are its keys and values (none of them a dict: atoms, functions, ...)
    # and its instance dict, if it has one; `value.__dict__` would create one on the source.
    for referent in _referents(value):
        if isinstance(referent, dict):
            return None
    return _memoised(value, memo, lambda: OrderedDict(value))


def _all_atoms(items: Any) -> bool:
    for item in items:
        if type(item) not in _ATOMIC:
            return False
    return True


def _copy_items(mapping: Dict[Any, Any], memo: Dict[Any, Any],
                copy_value: Callable[[Any, Dict[Any, Any]], Any]) -> Dict[Any, Any]:
    # The same order as copy's _deepcopy_dict / _reconstruct for an OrderedDict: memoise the
    # new dict, then copy key and value of each item.
    existing: Dict[Any, Any] = memo.get(id(mapping), _NIL)
    if existing is not _NIL:
        return existing
    new: Dict[Any, Any] = type(mapping)()
    memo[id(mapping)] = new
    for key, item in mapping.items():
        if type(key) not in _ATOMIC:
            key = _deepcopy(key, memo)
        new[key] = None if item is None else copy_value(item, memo)
    return new


def _copy_parameters(mapping: Dict[Any, Any], memo: Dict[Any, Any]) -> Dict[Any, Any]:
    """`_copy_items` for a module's `_parameters`, calling each `nn.Parameter`'s copier itself.

    For an `nn.Parameter` of exactly that type deepcopy looks `__deepcopy__` up on it, calls
    what it finds, and memoises the copy and keeps the parameter alive: that is done here, in
    that order, without deepcopy's dispatch.  Other values go through deepcopy.
    """
    if Parameter in _DEEPCOPY_DISPATCH:
        return _copy_items(mapping, memo, _deepcopy)
    existing: Dict[Any, Any] = memo.get(id(mapping), _NIL)
    if existing is not _NIL:
        return existing
    new: Dict[Any, Any] = {}
    memo[id(mapping)] = new
    # deepcopy asks the memo with `memo.get`; for a plain dict `in` is the same question.
    memo_get = None if type(memo) is dict else memo.get
    for key, item in mapping.items():
        if type(key) not in _ATOMIC:
            key = _deepcopy(key, memo)
        if item is None:
            new[key] = None
            continue
        ident = id(item)
        if memo_get is None:
            found = memo[ident] if ident in memo else _NIL
        else:
            found = memo_get(ident, _NIL)
        if found is not _NIL:
            new[key] = found
            continue
        # deepcopy's own lookup, so an instance attribute or a descriptor binds as it does
        # there; `item.__dict__` would make an instance dict on the source parameter.  It
        # runs no code of anyone's on an exact Parameter, so a miss may look again.
        copier = getattr(item, "__deepcopy__", None) if type(item) is Parameter else None
        if copier is None:
            new[key] = _deepcopy(item, memo)
        else:
            copied = copier(memo)
            if copied is not item:
                memo[ident] = copied
                keep_alive(item, memo)
            new[key] = copied
    return new


# A dict copied here instead of by deepcopy is still a step of the copy's path (see _record).
COPY_FRAMES[id(_copy_items.__code__)] = "mapping"
COPY_FRAMES[id(_copy_parameters.__code__)] = "mapping"
