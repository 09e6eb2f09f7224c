"""Where the shim meets `copy.deepcopy`: the dispatch table it asks for every object.

`copy.deepcopy(x, memo)` asks `copy._deepcopy_dispatch.get(type(x))` for a copier before it
does anything else with an object the memo does not hold, and only `copy.deepcopy` reads that
table (torch's StateDictStager and other copiers keep tables of their own).  While the shim is
installed, `copy._deepcopy_dispatch` is a `DispatchTable`: a stand-in that holds no entry of
its own and answers every read and write from the table it stands for (so code that took a
reference to that table before the install, and the table put back at removal, are the same
table), and whose `get` answers

- where no mode applies in this thread or task: exactly the table's entry (native);
- for the first object of a copy made where a mode applies: `DispatchTable.copy_root`, which starts the
  top-level copy (a `_record.Copy`), copies the object as deepcopy would, and ends the copy in
  its own `finally`;
- for every other object of that copy: the table's entry, or, for an `nn.Module` the table has
  no entry for, the shim's module copier (`_module.copy_module`), or, inside a survey, the
  survey's stand-in copier for tensors (`_survey`).

To torch.compile's tracer, which traces copy's code called from compiled code, the table answers
with its entry, as natively (see `_compiler`).

Nothing is added to any class: `nn.Module`, its subclasses and their metaclasses answer every
lookup as natively, in every thread, whatever mode applies where.
"""

from __future__ import annotations

import sys
from typing import Any, Callable, ContextManager, Dict, Iterable, Optional

import torch

from . import _compiler, _modes, _protocol, _record
from ._module import copy_module

__all__ = ["DispatchTable", "copier_for"]

# pytest leaves this module's frames out of the tracebacks it shows.
__tracebackhide__ = True

_Copier = Callable[[Any, Any], Any]
_Module = torch.nn.Module
_tracing = _compiler.tracing
_getframe = sys._getframe
_DEEPCOPY_CODE = _protocol.DEEPCOPY_CODE
_running = _modes.running_copy
_copy_wanted = _modes.copy_wanted
_scope_head = _modes.scope_head
_current_setting = _modes.current_setting


def copier_for(cls: type, copy_: _record.Copy) -> Optional[_Copier]:
    """The shim's copier for an object of class `cls` that copy's table has no entry for, in
    `copy_`; None: deepcopy's own way (`__deepcopy__`, then the reduction)."""
    if copy_.survey is not None:
        surveyed: Optional[_Copier] = copy_.survey.copier_for(cls)
        return surveyed
    return copy_module if issubclass(cls, _Module) else None


class DispatchTable(dict):  # type: ignore[type-arg]
    """`copy._deepcopy_dispatch` while the shim is installed: a dict that holds nothing itself
    and answers every read and write, copy, pickle, comparison and repr from `original`, the
    table it stands for, as that plain dict answers them; its `get` answers as the module
    docstring says.  Made by `standing_in_for`."""

    __slots__ = ("original", "hold")
    original: Dict[Any, Any]
    hold: Callable[[], ContextManager[Any]]

    @classmethod
    def standing_in_for(cls, original: Dict[Any, Any],
                        hold: Callable[[], ContextManager[Any]]) -> DispatchTable:
        """The stand-in for `original`; `hold()` keeps the patch installed while a copy runs."""
        made = cls.__new__(cls)
        made.original, made.hold = original, hold
        return made

    def get(self, cls: Any, default: Any = None) -> Any:
        found = self.original.get(cls, default)
        if _tracing():  # torch.compile's tracer, tracing copy's code: the entry, as natively
            return found
        # Only `copy.deepcopy`'s own question is answered otherwise: whoever else asks the
        # table (a copier of its own, monkeypatch) gets its entries as they are.
        copy_ = _running()
        if copy_ is not None and copy_.open:
            # An object of the copy running here: the table's entry, or the shim's copier for
            # a module or a survey's tensor (copier_for, written out: this runs for every one).
            if found is None and (copy_.survey is not None or issubclass(cls, _Module)):
                copier = copier_for(cls, copy_)
                if copier is not None and _getframe(1).f_code is _DEEPCOPY_CODE:
                    return copier
            return found
        # Whether a copy started here is the shim's (`_modes.copy_wanted`, written out for its
        # two common cases: every deepcopy in the process asks this, plain data included).
        scope = _scope_head()
        if scope is None:
            wanted = _modes._global is not None  # the global setting, read without a call
        elif scope.live:
            wanted = scope.setting is not None or scope.survey is not None
        else:
            wanted = _copy_wanted()
        if wanted and _getframe(1).f_code is _DEEPCOPY_CODE:
            return self.copy_root  # the first object of a copy made in a mode, or in a survey
        return found

    def copy_root(self, x: Any, memo: Any) -> Any:
        """Copy `x`, the first object of a top-level copy (`copy.deepcopy` calls this as the
        copier its table gives for `x`): the copy's state is made here and ended here.

        Returns what deepcopy's own code returns for `x` (deepcopy memoises it afterwards).
        Raises what that copy raises, the very object; in mode warn, once the copy is
        complete, emits one `DetachedTensorsWarning` naming every tensor it detached (nothing
        for a copy that fails).
        """
        cls = type(x)
        found = self.original.get(cls)
        setting = _current_setting()
        scope = _modes.innermost_scope()
        survey = scope.survey if scope is not None else None
        if setting is None and survey is None:  # called by someone else, where no mode applies
            return found(x, memo) if found is not None else _protocol.copy_undispatched(x, memo)
        copy_ = _record.Copy(x, memo, setting, sys._getframe(0), survey)
        # The patch stays installed until the copy ends, whoever disables the shim meanwhile
        # (another thread, a scope left inside the copy): a copy is made in the mode it began in.
        with self.hold(), _record.opened(copy_):
            copier = found if found is not None else copier_for(cls, copy_)
            copied = copier(x, memo) if copier is not None else _protocol.copy_undispatched(x, memo)
        if copy_.met and survey is None:
            copy_.report()
        return copied

    # The rest of the dict API, answered by the table stood for: one table, whoever holds it.
    def __getitem__(self, key: Any) -> Any:
        return self.original[key]

    def __setitem__(self, key: Any, value: Any) -> None:
        self.original[key] = value

    def __delitem__(self, key: Any) -> None:
        del self.original[key]

    def __contains__(self, key: object) -> bool:
        return key in self.original

    def __iter__(self) -> Any:
        return iter(self.original)

    def __reversed__(self) -> Any:
        return reversed(self.original)

    def __len__(self) -> int:
        return len(self.original)

    def __eq__(self, other: object) -> bool:
        return self.original == (other.original if isinstance(other, DispatchTable) else other)

    def __ne__(self, other: object) -> bool:
        return not self == other

    def __repr__(self) -> str:
        return repr(self.original)

    def __or__(self, other: Any) -> Any:
        return self.original | other

    def __ror__(self, other: Any) -> Any:
        return other | self.original

    def __ior__(self, other: Any) -> DispatchTable:
        self.original |= other
        return self

    def __init__(self, *args: Any, **kwargs: Any) -> None:  # `t.__init__(...)` updates, as a dict's
        self.original.update(*args, **kwargs)

    def keys(self) -> Any:
        return self.original.keys()

    def values(self) -> Any:
        return self.original.values()

    def items(self) -> Any:
        return self.original.items()

    def pop(self, key: Any, *default: Any) -> Any:
        return self.original.pop(key, *default)

    def popitem(self) -> Any:
        return self.original.popitem()

    def setdefault(self, key: Any, default: Any = None) -> Any:
        return self.original.setdefault(key, default)

    def update(self, *args: Any, **kwargs: Any) -> None:
        self.original.update(*args, **kwargs)

    def clear(self) -> None:
        self.original.clear()

    def copy(self) -> Dict[Any, Any]:
        return self.original.copy()

    __copy__ = copy

    @classmethod
    def fromkeys(cls, keys: Iterable[Any], value: Any = None) -> Dict[Any, Any]:
        return dict.fromkeys(keys, value)

    def __sizeof__(self) -> int:
        return self.original.__sizeof__()

    def __reduce_ex__(self, protocol: Any) -> Any:  # pickled, and deep-copied, as a plain dict
        return (dict, (dict(self.original),))
