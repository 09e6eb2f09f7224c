"""What torch.compile's compiler (dynamo) sees of the shim: what it sees of copy's own code.

Dynamo meets the shim in two ways, both through `copy.deepcopy` called by compiled code:

- it *traces* deepcopy (it inlines it, as it inlines copy's code called from compiled code):
  `DispatchTable.get` then answers it with the table's entry (`tracing()` is True only to
  dynamo, which folds it), so the copy is traced as natively;
- where it cannot trace on (a tensor's copy), deepcopy runs eagerly while compiled code runs,
  and dynamo is offered every frame that starts: it never compiles copy's frames (its
  skip-list), and `keep_out()` marks the shim's so that it never compiles them either (compiled,
  a frame of the table's `get` would answer from guards that do not hold).

Both use torch's private API where torch has it, and nothing where it does not (torch 2.0 to
2.2, where dynamo does not inline copy's code).
"""

from __future__ import annotations

import os
import sys
import types
from typing import Any, Callable, Iterator, List, Optional, Set

import torch

__all__ = ["keep_out", "tracing"]

_HERE = os.path.dirname(os.path.abspath(__file__))  # the package's folder: its code, its modules

try:
    # False when called; True to dynamo, which folds it while it traces.
    from torch.compiler import is_dynamo_compiling as tracing
except ImportError:  # torch before 2.3
    def tracing() -> bool:
        return False


def _skipper() -> Optional[Callable[[types.CodeType], None]]:
    """torch's way to keep dynamo from compiling frames of a code object, or None."""
    frames = getattr(getattr(torch._C, "_dynamo", None), "eval_frame", None)
    skip_code = getattr(frames, "skip_code", None)
    if skip_code is not None:  # torch up to 2.5
        return skip_code  # type: ignore[no-any-return]
    strategy = getattr(frames, "set_code_exec_strategy", None)
    action = getattr(frames, "_FrameAction", None)
    kind = getattr(frames, "_FrameExecStrategy", None)
    if strategy is None or action is None or kind is None:
        return None
    # SKIP this frame, DEFAULT for the frames it calls: a copy method of the user's that the
    # shim calls is offered to dynamo as when copy's code calls it.
    how = kind(action.SKIP, action.DEFAULT)
    return lambda code: strategy(code, how)


# The package's modules whose code is not marked yet (None: not listed yet).  A module imported
# later than the first install (the report's `_tested`) is marked at the next one.  Never changed
# in place, only replaced: two threads installing at once both mark (the patch is prepared
# outside its lock), and marking a code object twice is harmless, so whichever list is written
# last holds only names that one of them marked.
_unmarked: Optional[List[str]] = None
_skip: Optional[Callable[[types.CodeType], None]] = None


def keep_out() -> None:
    """Mark the code of every loaded module of this package so that dynamo never compiles a
    frame of it (frames it calls are offered to dynamo as usual).  Idempotent and safe from
    several threads at once: after the first call, a look-up of each module not yet marked
    (about 1 us)."""
    global _unmarked, _skip
    unmarked, skip = _unmarked, _skip
    if unmarked is None:
        skip = _skipper()
        names = sorted(name[:-3] for name in os.listdir(_HERE) if name.endswith(".py"))
        unmarked = [] if skip is None else [
            __package__ if name == "__init__" else f"{__package__}.{name}" for name in names]
        _skip = skip
    left = []
    for name in unmarked:
        module = sys.modules.get(name)
        if module is None:
            left.append(name)
            continue
        assert skip is not None
        for code in _codes(vars(module).values(), set()):
            skip(code)
    _unmarked = left


def _codes(values: Any, seen: Set[int]) -> Iterator[types.CodeType]:
    """Every code object of the functions and classes defined in a module (`values` its
    namespace), nested functions and methods included."""
    for value in values:
        if id(value) in seen:
            continue
        seen.add(id(value))
        if isinstance(value, type):
            if value.__module__.startswith(str(__package__)):
                yield from _codes(vars(value).values(), seen)
            continue
        if isinstance(value, (tuple, list)):  # functions kept in a table
            yield from _codes(value, seen)
            continue
        function = getattr(value, "__func__", value)  # a classmethod or staticmethod
        code = getattr(function, "__code__", None)
        if isinstance(code, types.CodeType) and code.co_filename.startswith(_HERE):
            yield from _nested(code)
        elif isinstance(value, property):
            yield from _codes((value.fget, value.fset, value.fdel), seen)


def _nested(code: types.CodeType) -> Iterator[types.CodeType]:
    yield code
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from _nested(const)

