"""Copying a module: what native deepcopy does, call for call, without its generic detours.

Native deepcopy reduces a module (`__reduce_ex__(4)`: `copyreg.__newobj__`, the class, a state
dict) and rebuilds it with `copy._reconstruct`, which deep-copies the state dict item by item:
most of that state is a dozen containers nn.Module makes for every module (hook OrderedDicts,
the `_parameters`/`_buffers`/`_modules` dicts), almost always empty, each reduced and rebuilt
through the generic protocol.  `copy_module` makes the same copy where it can prove that nothing
could tell the difference: the same objects made, the same memo entries in the same order, the
same objects kept alive by the memo, the same calls of every method of every object inside the
module (`__deepcopy__`, `__reduce_ex__`, `__getstate__`, `__setstate__`) in the same order.
Everything else, and anything it cannot prove so, goes through deepcopy's own code.
"""

from __future__ import annotations

import copy
import copyreg
import gc
from collections import OrderedDict
from typing import Any, Dict

import torch

from ._protocol import ATOMIC_TYPES as _ATOMIC  # deepcopy returns these unchanged
from ._protocol import DEEPCOPY as _deepcopy
from ._protocol import DEEPCOPY_ATOMIC as _DEEPCOPY_ATOMIC
from ._protocol import DISPATCH as _DISPATCH
from ._protocol import NIL as _NIL
from ._protocol import dispatch_is_copys_own, keep_alive

__all__ = ["copy_module"]

# pytest leaves this module's frames out of the tracebacks it shows: a copy that fails inside
# a module reads as native deepcopy's frames and the user's own.
__tracebackhide__ = True

_referents = gc.get_referents
_MODULE_GETATTR = torch.nn.Module.__getattr__
_OBJECT_GETATTRIBUTE = object.__getattribute__
_MODULE_STORES = ("_parameters", "_buffers", "_modules")
_NEWOBJ = copyreg.__newobj__  # type: ignore[attr-defined]
# The copy module, typed as Any: `copy._reconstruct` is read when it is called, as deepcopy reads
# it, with no type checker's comment on the line a traceback shows.
_copy: Any = copy
_LIST_COPIER = copy._deepcopy_list  # type: ignore[attr-defined]


def copy_module(module: Any, memo: Dict[Any, Any]) -> Any:
    """Deep-copy `module`, an `nn.Module` (called by `copy.deepcopy` as the copier its table
    gives for the module's class, in a copy made in a mode; see `_dispatch`); returns the copy,
    which deepcopy memoises and keeps alive, as it does for what `copy._reconstruct` returns.

    Asks the module what deepcopy asks, in its order: its `__deepcopy__` (called if it has one),
    then its reduction (`copyreg.dispatch_table`, then `__reduce_ex__(4)`).  A plain reduction
    (`copyreg.__newobj__` of the class, a state dict, nothing else), copied with a plain dict
    memo, is rebuilt here as `copy._reconstruct` rebuilds it: a new instance, memoised, its
    state deep-copied (`_copy_state`), then given to the instance (its `__setstate__`, whatever
    wraps it: torch.compile's generation tagging sees every copy).  Anything else goes through
    `copy._reconstruct`, the very code native deepcopy runs.  Raises what native raises.
    """
    cls: Any = type(module)
    copier = _own_deepcopy(module, cls)
    if copier is not None:
        return copier(memo)
    reductor = copyreg.dispatch_table.get(cls)
    rv: Any = reductor(module) if reductor else module.__reduce_ex__(4)
    if reductor or not _is_plain_reduction(rv, cls, memo):
        return module if isinstance(rv, str) else _copy._reconstruct(module, memo, *rv)
    # `copy._reconstruct` deep-copies the arguments `(cls,)` first: a class is its own copy,
    # and nothing is memoised (see _is_plain_reduction), so `copyreg.__newobj__(cls)` it is.
    new: Any = cls.__new__(cls)
    memo[id(module)] = new
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


def _is_plain_reduction(rv: Any, cls: Any, memo: Any) -> bool:
    """True if `rv`, the reduction of an instance of `cls`, is one `copy_module` rebuilds:
    object's own `(copyreg.__newobj__, (cls,), state dict, None, None)`, copied with a plain
    dict memo (a memo of another class may answer deepcopy's questions its own way) that holds
    nothing for `cls`, while deepcopy's own copiers for atoms, tuples, dicts and classes are in
    place (so the class is its own copy, as `copy._reconstruct` finds when it copies it)."""
    return (
        type(rv) is tuple
        and len(rv) == 5
        and rv[0] is _NEWOBJ
        and rv[3] is None
        and rv[4] is None
        and type(rv[2]) is dict
        and len(rv[1]) == 1
        and rv[1][0] is cls
        and type(memo) is dict
        and id(cls) not in memo
        and _DISPATCH.get(type(cls), _DEEPCOPY_ATOMIC) is _DEEPCOPY_ATOMIC
        and dispatch_is_copys_own()
    )


def _copy_state(state: Dict[str, Any], memo: Dict[Any, Any]) -> Dict[str, Any]:
    """`copy.deepcopy(state, memo)` for a module's state dict, with a plain dict memo.

    deepcopy's dict copier memoises the new dict, then copies each item, its value before its
    key (`y[deepcopy(key)] = deepcopy(value)`), and deepcopy keeps the state alive afterwards.
    So does this, with deepcopy itself for every value and key except those whose copy it can
    make without deepcopy's detour and with the same effect on the memo, checked by identity
    in the memo first, as deepcopy asks it first:

    - an atom, or a tuple of atoms none of which the memo holds: its own copy, memoised nowhere;
    - an empty OrderedDict without instance state (a hook dict), or an empty dict: a new empty
      one, memoised and kept alive as deepcopy memoises and keeps it (an OrderedDict's
      reduction, `OrderedDict()` with nothing else, is rebuilt by `copy._reconstruct`);
    - an empty set: see `_copy_empty_set`.

    Those shortcuts hold only while deepcopy's own copiers and reductions for them are in
    place: asked again after any value whose copy ran other code, which may have changed them.
    What the memo keeps alive is appended to its keep-alive list as `copy._keep_alive` does,
    the list read again after other code ran.
    """
    found = memo.get(id(state), _NIL)
    if found is not _NIL:
        return found  # type: ignore[no-any-return]
    new_state: Dict[str, Any] = {}
    memo[id(state)] = new_state
    memo_get = memo.get
    own = _copiers_are_copys_own()
    kept = memo_get(id(memo))  # the memo's keep-alive list, once there is one (copy._keep_alive)
    for key, value in state.items():
        ident = id(value)
        copied = memo_get(ident, _NIL)
        if copied is _NIL:
            kind = type(value)
            if not own:
                copied = _deepcopy(value, memo)
                kept = memo_get(id(memo))
            elif kind is OrderedDict and not value and not _referents(value):
                copied = memo[ident] = OrderedDict()
                if kept is None:
                    kept = memo[id(memo)] = [value]
                else:
                    kept.append(value)
            elif kind in _ATOMIC or (kind is tuple and _atoms_unmemoised(value, memo)):
                copied = value
            elif kind is dict and not value:
                copied = memo[ident] = {}
                if kept is None:
                    kept = memo[id(memo)] = [value]
                else:
                    kept.append(value)
            elif kind is set and not value:
                copied = _copy_empty_set(value, memo)
                kept = memo_get(id(memo))
            else:
                copied = _deepcopy(value, memo)
                own = _copiers_are_copys_own()  # the copy ran other code, which may have changed them
                kept = memo_get(id(memo))
        if type(key) in _ATOMIC and own and id(key) not in memo:
            new_state[key] = copied
        else:
            new_state[_deepcopy(key, memo)] = copied
            own = _copiers_are_copys_own()
            kept = memo_get(id(memo))
    keep_alive(state, memo)
    return new_state


def _copy_empty_set(value: Any, memo: Dict[Any, Any]) -> Any:
    """`copy.deepcopy(value, memo)` for an empty set the memo does not hold: deepcopy reduces it
    (`__reduce_ex__(4)`: `set`, a new empty list, no state), `copy._reconstruct` deep-copies the
    list (memoised and kept alive) and memoises the set it makes of it, and deepcopy keeps the
    source set alive.  A reduction of another shape is rebuilt by `copy._reconstruct` itself."""
    rv = value.__reduce_ex__(4)
    if (type(rv) is tuple and len(rv) == 3 and rv[0] is set and rv[2] is None and len(rv[1]) == 1
            and type(rv[1][0]) is list and not rv[1][0] and id(rv[1][0]) not in memo):
        listed = rv[1][0]
        made: Any = []
        memo[id(listed)] = made
        keep_alive(listed, memo)
        copied = memo[id(value)] = set(made)
    else:
        copied = _copy._reconstruct(value, memo, *rv)
        if copied is value:
            return copied
        memo[id(value)] = copied
    keep_alive(value, memo)
    return copied


def _copiers_are_copys_own() -> bool:
    """deepcopy's own copiers for atoms, tuples and dicts are in place, and an OrderedDict is
    copied through its own reduction (no copier or copyreg reducer registered for it)."""
    return (dispatch_is_copys_own() and _DISPATCH.get(list) is _LIST_COPIER
            and OrderedDict not in _DISPATCH and OrderedDict not in copyreg.dispatch_table
            and set not in _DISPATCH and set not in copyreg.dispatch_table)


def _atoms_unmemoised(items: Any, memo: Dict[Any, Any]) -> bool:
    """True if every item is an atom the memo holds nothing for, and the memo holds nothing
    for `items` itself (it was checked already)."""
    for item in items:
        if type(item) not in _ATOMIC or id(item) in memo:
            return False
    return True
