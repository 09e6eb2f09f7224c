"""Copying a module: rebuilt from its own state, faithful to what native deepcopy makes."""

from __future__ import annotations

import copyreg
import gc
import operator
from collections import OrderedDict
from types import MethodType
from typing import Any, Callable, Dict, FrozenSet, Optional, Tuple

import torch

from . import _modes, _record
from ._protocol import ATOMIC_TYPES as _ATOMIC  # skipping deepcopy for these is exact
from ._protocol import COPY_FRAMES, OWNER_FRAMES, ROOT_FRAMES, dispatch_is_copys_own, keep_alive, reconstruct
from ._protocol import DEEPCOPY as _deepcopy
from ._protocol import DEEPCOPY_ATOMIC as _DEEPCOPY_ATOMIC
from ._protocol import DISPATCH as _DEEPCOPY_DISPATCH
from ._protocol import NIL as _NIL

__all__ = ["ModuleDeepcopy", "copy_module"]

# pytest leaves this module's frames out of the tracebacks it shows: a copy that fails inside
# a module reads as native deepcopy's frames and the user's own.
__tracebackhide__ = True

_referents = gc.get_referents
_owned = _record.OWNED
Parameter = torch.nn.Parameter
# nn.Module has no __getstate__ of its own in torch 2.0, and object has one only since Python
# 3.11: either may be missing.
_MODULE_GETSTATE = getattr(torch.nn.Module, "__getstate__", None)
_MODULE_SETSTATE = torch.nn.Module.__setstate__
_MODULE_GETATTR = torch.nn.Module.__getattr__
_MODULE_BASICSIZE = torch.nn.Module.__basicsize__
_OBJECT_REDUCE_EX = object.__reduce_ex__
_OBJECT_REDUCE = object.__reduce__
_NEWOBJ = copyreg.__newobj__  # type: ignore[attr-defined]
_current_setting = _modes.current_setting


class ModuleDeepcopy:
    """The descriptor installed as `torch.nn.Module.__deepcopy__` while the shim is installed.

    Attribute lookup through it finds what it finds without the shim, and then, where that is
    nothing, the shim's copier (on instances only):

    - a `__deepcopy__` of a class after `nn.Module` in the MRO (a mixin listed after it),
      which this descriptor would otherwise shadow, is returned as Python returns it: bound
      if it is a descriptor, as it is if not (a callable object), `None` if it is `None`
      (native deepcopy then reduces the object);
    - on the class, and on an instance in a thread or task where no mode applies, nothing
      else: `AttributeError`, so that `hasattr`, `getattr` with a default and `super()`
      answer what they answer without the shim (and deepcopy reduces the module natively).
      `hasattr(cls, "__deepcopy__")`
      is what it is without the shim.  `torch.nn.utils.parametrize` only gives its dynamic
      classes a `__deepcopy__` of their own when that check is False; a module parametrized
      while the shim is installed must still copy after the shim is removed;
    - on an instance, one a class's own `__getattr__` forwards (torch.compile's
      `OptimizedModule` hands over the wrapped module's), as attribute lookup finds it
      without this descriptor; else the shim's copier, bound.
    """

    __slots__ = ()

    def __get__(self, instance: Any, owner: Any = None) -> Any:
        cls = owner if instance is None else type(instance)
        found = _deepcopy_after_module(cls)
        if found is not None:
            value = found[0]
            binder = getattr(type(value), "__get__", None)
            return value if binder is None else binder(value, instance, cls)
        if instance is None or _current_setting() is None:
            # On the class, and wherever no mode applies, the descriptor is not there: Python's
            # own lookup goes on to the class's __getattr__ (nn.Module's raises), so hasattr,
            # getattr with a default and super() answer as natively, and deepcopy reduces the
            # module through copy._reconstruct itself.
            raise AttributeError("__deepcopy__")
        # Without this descriptor, deepcopy's getattr(x, "__deepcopy__") would end in the
        # class's __getattr__; a wrapper that forwards unknown names (torch.compile's
        # OptimizedModule forwards to the module it wraps) may answer there, and native
        # deepcopy then uses that answer.  nn.Module's own __getattr__ never has one.
        forward = cls.__getattr__
        if forward is not _MODULE_GETATTR:
            try:
                found_there = forward(instance, "__deepcopy__")
            except AttributeError:
                pass
            else:
                if getattr(found_there, "__func__", None) is not copy_module:  # not ours, forwarded
                    return found_there
        return MethodType(copy_module, instance)

    def __repr__(self) -> str:
        return "<deepcopy_shim nn.Module.__deepcopy__>"


def _deepcopy_after_module(cls: type) -> Optional[Tuple[Any]]:
    """`(value,)` of the first `__deepcopy__` a class after `nn.Module` in `cls`'s MRO
    defines (the value may be None), or None if none does."""
    mro = cls.__mro__
    if mro[-2] is torch.nn.Module:
        return None  # only `object` follows nn.Module, and it has no __deepcopy__
    # By identity: `mro.index` compares with ==, which a metaclass may answer for any class.
    after = next(i for i, klass in enumerate(mro) if klass is torch.nn.Module) + 1
    for klass in mro[after:]:
        if "__deepcopy__" in klass.__dict__:
            return (klass.__dict__["__deepcopy__"],)
    return None


def copy_module(module: torch.nn.Module, memo: Dict[Any, Any]) -> Any:
    """Deep-copy `module` (called as its `__deepcopy__`); returns the copy, memoised.

    When `module` is the root of the top-level copy, this call owns that copy's record (see
    `_record`): it finishes it when it returns and discards it when it raises.

    The object is reduced exactly as `copy.deepcopy` reduces it (`copyreg.dispatch_table`,
    then `__reduce_ex__(4)`).  A plain reduction (`copyreg.__newobj__`, a state dict, nothing
    else) of a class that keeps `nn.Module`'s own copy protocol (`__getstate__`,
    `__setstate__`, `__reduce_ex__`, `__reduce__`, no `__slots__`) is rebuilt by the fast
    path below; anything else, and every copy made outside the shim's modes, goes through
    `copy._reconstruct`, the very code native deepcopy runs.  Nothing here depends on the
    mode: what is reported is recorded by the tensors the copy meets (see `_record`).
    """
    # One frame, not a call into a helper: it runs once per module, and every frame between a
    # tensor and the copy's root is one more step of the record's walk (see _record).
    try:
        cls = type(module)
        reductor = copyreg.dispatch_table.get(cls)
        rv: Any = module.__reduce_ex__(4) if reductor is None else reductor(module)
        if reductor is not None or not _is_plain_reduction(rv, cls):
            new = module if isinstance(rv, str) else reconstruct(module, memo, *rv)
        else:
            new = cls.__new__(cls)  # what rv[0](*rv[1]), copyreg.__newobj__(cls), does
            memo[id(module)] = new
            state = rv[2]
            # Every object memoised below is reachable from `state`, the reduction's dict;
            # keeping it alive as long as the memo is what deepcopy's per-object _keep_alive
            # guarantees: no memoised id can be reused by a new object during this copy.
            keep_alive(state, memo)
            # The class's own __setstate__ is nn.Module's (checked above), and a new object has
            # no instance attribute that could shadow it.
            _MODULE_SETSTATE(new, _copy_state(state, memo))  # type: ignore[no-untyped-call]
    except BaseException:
        if _record.open_records():
            _record.module_copy_ended(module, failed=True)
        raise
    if id(module) in _owned:  # the root of a copy whose record this call finishes
        _record.module_copy_ended(module, failed=False)
    return new


def _is_plain_reduction(rv: Any, cls: Any) -> bool:
    """True if `rv`, the reduction of an instance of `cls`, is one the fast path rebuilds:
    object's own `(copyreg.__newobj__, (cls,), state dict, None, None)` of a class that keeps
    nn.Module's copy protocol, while deepcopy's own copiers for atoms, tuples and dicts are in
    place.  (Where no mode applies, the descriptor is not found and this copier never runs.)"""
    return (
        type(rv) is tuple
        and len(rv) == 5
        and rv[0] is _NEWOBJ
        and rv[3] is None
        and rv[4] is None
        and type(rv[2]) is dict
        and len(rv[1]) == 1
        and rv[1][0] is cls
        # The class (or a mixin) may compute its state or restore it differently: then only
        # the generic reconstruction is known to do what native deepcopy does.
        and getattr(cls, "__getstate__", None) is _MODULE_GETSTATE
        and cls.__setstate__ is _MODULE_SETSTATE
        and cls.__reduce_ex__ is _OBJECT_REDUCE_EX
        and cls.__reduce__ is _OBJECT_REDUCE
        # Slots would add storage beyond nn.Module's layout (native drops them; so would we,
        # but a class with slots is one this path does not claim to understand).
        and cls.__basicsize__ == _MODULE_BASICSIZE
        # The shortcuts keep atoms and tuples of atoms, and copy dicts, as deepcopy's own
        # copiers do.
        and dispatch_is_copys_own()
    )


def _copy_state(state: Dict[str, Any], memo: Dict[Any, Any]) -> Dict[str, Any]:
    """`copy.deepcopy(state, memo)` for a module's state dict, without its generic overhead.

    Equal to the generic copy item by item, in the same order: the same containers, the same
    memo entries (so a `RemovableHandle` or anything else referring to a hook dict still
    finds its copy), the same deepcopy of every value no shortcut below covers.  Most of a
    module's state is its hook OrderedDicts (10 in torch 2.0, 11 in 2.13), almost always
    empty, and an empty set; the generic path reduces and reconstructs each of them.
    """
    # Atoms, and tuples of atoms, are what deepcopy returns unchanged: start from them.
    new_state = dict(state)
    memo_get = memo.get
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
        new_state = {keys_made.get(id(key), key): value for key, value in new_state.items()}
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
    that order, without deepcopy's dispatch.  Other values go through deepcopy, and inside a
    survey every value goes to the survey's copier.
    """
    scope = _modes.current_scope()
    if scope is not None and scope.survey is not None:
        return _copy_items(mapping, memo, scope.survey.copy_value)
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


# A dict copied here instead of by deepcopy is still a step of the copy's path, and the module
# copier is a copy frame that can be the root of a copy (a deepcopy written in C calls it
# directly) and owns the record of a copy whose root it copies (see _record).
COPY_FRAMES[id(_copy_items.__code__)] = "mapping"
COPY_FRAMES[id(_copy_parameters.__code__)] = "mapping"
COPY_FRAMES[id(copy_module.__code__)] = ROOT_FRAMES[id(copy_module.__code__)] = "module"
OWNER_FRAMES[id(copy_module.__code__)] = "module"
