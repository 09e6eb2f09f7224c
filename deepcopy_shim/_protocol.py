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
import sys
from typing import Any, Callable, Dict, List, Optional

__all__ = [
    "ATOMIC_TYPES",
    "COPY_FRAMES",
    "DEEPCOPY",
    "DEEPCOPY_ATOMIC",
    "DEEPCOPY_CODE",
    "DISPATCH",
    "KEEP_ALIVE_DEPTH",
    "MEMO_LOCAL",
    "NIL",
    "OWNER_FRAMES",
    "ROOT_FRAMES",
    "X_LOCAL",
    "dispatch_is_copys_own",
    "keep_alive",
    "own_get",
    "own_set",
    "reconstruct",
    "reduce_for_copy",
]

DEEPCOPY = copy.deepcopy
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

# Frames that copy one object each, and the local holding that object: deepcopy's own, and the
# shortcuts the shim's module copier takes instead of deepcopy (it registers them), so that a
# record of the copy sees every object the copy went through.  Keyed by id() of the code
# object (they live as long as their functions): hashing a code object costs twice as much,
# and a record looks up every frame between a tensor and the copy's root.
COPY_FRAMES: Dict[int, str] = {id(DEEPCOPY_CODE): X_LOCAL}
# Those of them that can start a top-level copy: deepcopy's own, and the module copier (a
# deepcopy written in C calls it directly).  OWNER_FRAMES: those that finish the record of a
# copy whose root they copy, when they return (see _record).
ROOT_FRAMES: Dict[int, str] = {id(DEEPCOPY_CODE): X_LOCAL}
OWNER_FRAMES: Dict[int, str] = {}

# deepcopy ends every copy it makes (of an object that is not its own copy) with
# `_keep_alive(x, memo)`, which does `memo[id(memo)].append(x)`: the end of a copy the shim
# does not own is seen there (see _record).  KEEP_ALIVE_DEPTH is how many frames above that
# `append` the deepcopy call that copied `x` is (`sys._getframe(KEEP_ALIVE_DEPTH)` inside
# `append`), measured below on this Python's own copy module; None if it does not end copies
# that way, and then reports are made tensor by tensor.


def _measure_keep_alive_depth() -> Optional[int]:
    depths: List[Optional[int]] = []

    class Probe(list):  # type: ignore[type-arg]
        def append(self, obj: Any) -> None:
            list.append(self, obj)
            frame: Any = sys._getframe(1)
            depth = 1
            while frame is not None and frame.f_code is not DEEPCOPY_CODE:
                frame, depth = frame.f_back, depth + 1
            found = frame is not None and frame.f_locals.get(X_LOCAL) is obj
            depths.append(depth if found else None)

    memo: Dict[Any, Any] = {}
    memo[id(memo)] = Probe()
    root: List[Any] = [[]]
    DEEPCOPY(root, memo)
    if len(depths) != 2 or depths[0] != depths[1]:  # the inner list, then the root
        return None
    return depths[-1]


KEEP_ALIVE_DEPTH: Optional[int] = _measure_keep_alive_depth()

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
