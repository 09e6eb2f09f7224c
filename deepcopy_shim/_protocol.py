"""What deepcopy_shim relies on in the standard library's `copy` module, in one place.

Every other module asks this one about `copy.deepcopy`'s protocol: which types it returns
unchanged, how it uses a memo, which frames are its own and what their locals are called, and
how it keeps temporaries alive.  Where the running Python's `copy` module differs from what is
written here, the import-time checks below fail loudly instead of letting a report go wrong.
"""

from __future__ import annotations

import copy
import copyreg
import operator
from typing import Any, Callable, Dict, Optional

__all__ = [
    "ATOMIC_TYPES",
    "DEEPCOPY",
    "DEEPCOPY_ATOMIC",
    "DEEPCOPY_CODE",
    "DISPATCH",
    "MEMO_LOCAL",
    "NIL",
    "X_LOCAL",
    "copy_undispatched",
    "dispatch_is_copys_own",
    "keep_alive",
    "own_get",
    "own_set",
    "reconstruct",
    "reduce_for_copy",
]

DEEPCOPY = copy.deepcopy
# The copy module, typed as Any: its private names are read through it, when they are used (so
# that whoever replaced one is called as deepcopy calls it), with no type checker's comment on
# a line that a traceback shows.
_copy: Any = copy
DEEPCOPY_CODE = copy.deepcopy.__code__
DISPATCH: Dict[type, Any] = copy._deepcopy_dispatch  # type: ignore[attr-defined]
reconstruct: Callable[..., Any] = copy._reconstruct  # type: ignore[attr-defined]
# The copier deepcopy's dispatch table gives the types it returns unchanged (functions, types,
# ranges, ...): it returns the object itself and memoises nothing.
DEEPCOPY_ATOMIC: Callable[..., Any] = copy._deepcopy_atomic  # type: ignore[attr-defined]

# The names of deepcopy's first two parameters, read from its frames to learn which object a
# frame copies and with which memo.  Every CPython from 3.9 to 3.14 calls them `x` and `memo`.
X_LOCAL, MEMO_LOCAL = DEEPCOPY_CODE.co_varnames[:2]
assert (X_LOCAL, MEMO_LOCAL) == ("x", "memo"), (
    f"deepcopy_shim: copy.deepcopy's parameters are {DEEPCOPY_CODE.co_varnames[:2]!r}, not "
    "('x', 'memo'); this Python's copy module is not one deepcopy_shim knows"
)

# deepcopy looks its dispatch table up by its global name at every call (`_deepcopy_dispatch.get(
# cls)`, the first thing it asks about an object the memo does not hold): the table installed in
# the module is the one it asks.  Checked here, on this Python's own copy module.
assert "_deepcopy_dispatch" in DEEPCOPY_CODE.co_names and "_reconstruct" in DEEPCOPY_CODE.co_names, (
    "deepcopy_shim: this Python's copy.deepcopy does not look up _deepcopy_dispatch and "
    "_reconstruct by name; its copy module is not one deepcopy_shim knows"
)


def copy_undispatched(x: Any, memo: Any) -> Any:
    """What `copy.deepcopy(x, memo)` does for `x` once its dispatch table has no copier for
    `type(x)`: a class is its own copy, then `x.__deepcopy__(memo)`, then the reduction
    (`copyreg.dispatch_table`, `__reduce_ex__(4)`, `__reduce__`) rebuilt by `copy._reconstruct`.
    Returns the copy; deepcopy itself memoises it and keeps `x` alive afterwards.  Raises what
    those raise, and `copy.Error` for an object with none of them, as deepcopy does.

    Line for line deepcopy's own code in CPython 3.9 to 3.13, so that a copy the shim starts
    (see `_dispatch`) asks every object exactly what a native copy asks."""
    cls = type(x)
    if issubclass(cls, type):
        return _copy._deepcopy_atomic(x, memo)
    copier = getattr(x, "__deepcopy__", None)
    if copier is not None:
        return copier(memo)
    reductor = copyreg.dispatch_table.get(cls)
    if reductor:
        rv = reductor(x)
    else:
        reductor = getattr(x, "__reduce_ex__", None)
        if reductor is not None:
            rv = reductor(4)
        else:
            reductor = getattr(x, "__reduce__", None)
            if reductor:
                rv = reductor()
            else:
                raise copy.Error(f"un(deep)copyable object of type {cls}")
    if isinstance(rv, str):
        return x
    # Looked up now, as deepcopy looks it up: whoever replaced it is called as natively.
    return _copy._reconstruct(x, memo, *rv)


# deepcopy returns these unchanged and never memoises them, and a tuple of them is its own copy,
# as long as its dispatch table holds its own copiers for them (see `dispatch_is_copys_own`).
_ATOMS = (type(None), bool, int, float, complex, str, bytes)
ATOMIC_TYPES = frozenset(_ATOMS)
_copiers_of_atoms = operator.itemgetter(*_ATOMS)
_TUPLE_COPIER: Callable[..., Any] = copy._deepcopy_tuple  # type: ignore[attr-defined]
_DICT_COPIER: Callable[..., Any] = copy._deepcopy_dict  # type: ignore[attr-defined]


def dispatch_is_copys_own() -> bool:
    """True while deepcopy's dispatch table copies every type of `ATOMIC_TYPES` with its own
    atomic copier, tuples with its own tuple copier and dicts with its own dict copier: only
    then is an atom, or a tuple of atoms, its own copy, and a dict copied item by item (a
    copier registered in their place is what deepcopy calls, and the shim's module copier then
    leaves every call to deepcopy).  Compared by identity: a copier may compare equal to
    anything."""
    try:
        none, bool_, int_, float_, complex_, str_, bytes_ = _copiers_of_atoms(DISPATCH)
        tuple_ = DISPATCH[tuple]
        dict_ = DISPATCH[dict]
    except KeyError:  # an entry removed: deepcopy reduces such objects
        return False
    atomic = DEEPCOPY_ATOMIC
    return (none is atomic and bool_ is atomic and int_ is atomic and float_ is atomic
            and complex_ is atomic and str_ is atomic and bytes_ is atomic
            and tuple_ is _TUPLE_COPIER and dict_ is _DICT_COPIER)

# A sentinel no memo value can be, as deepcopy's own `_nil`.
NIL: Any = []


def keep_alive(obj: Any, memo: Any) -> None:
    """Keep `obj` alive as long as `memo`, exactly as `copy._keep_alive` does.

    The memo is keyed by `id()`: a temporary memoised and then freed would let a later object
    reuse its id and receive the wrong copy (seen as "can't assign Variable as its own grad").
    """
    try:
        memo[id(memo)].append(obj)
    except KeyError:
        memo[id(memo)] = [obj]


def own_get(memo: Any, key: Any, default: Any = None) -> Any:
    """Read an entry of `memo` without calling a subclass's `get`.

    Memo subclasses exist that treat every key passed to `get` as an object id (pyro's
    `detach`/`deep_to`): the shim's bookkeeping must not go through their methods.
    """
    if isinstance(memo, dict):
        return dict.get(memo, key, default)
    return memo.get(key, default)


def own_set(memo: Any, key: Any, value: Any) -> None:
    """Write the shim's own entry into `memo` without calling a subclass's `__setitem__`."""
    if isinstance(memo, dict):
        dict.__setitem__(memo, key, value)
    else:
        memo[key] = value


def reduce_for_copy(obj: Any) -> Any:
    """`obj` reduced exactly as `copy.deepcopy` reduces it: `copyreg.dispatch_table` first,
    then `__reduce_ex__(4)`.  Returns a string or a tuple, as the reduction protocol does."""
    reductor: Optional[Callable[[Any], Any]] = copyreg.dispatch_table.get(type(obj))
    if reductor is not None:
        return reductor(obj)
    return obj.__reduce_ex__(4)
