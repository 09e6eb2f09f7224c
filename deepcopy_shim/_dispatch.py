"""Where the shim meets `copy.deepcopy`: the dispatch table it asks for every object.

`copy.deepcopy(x, memo)` asks `copy._deepcopy_dispatch.get(type(x))` for a copier before it
does anything else with an object the memo does not hold, and only `copy.deepcopy` reads that
table (torch's StateDictStager and other copiers keep tables of their own).  While the shim is
installed, the table is a `DispatchTable`: the same entries, and a `get` that answers

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
from typing import Any, Callable, Dict, Optional

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
_current = _record.current
_scope_chain = _modes.scope_chain
_current_setting = _modes.current_setting


def copier_for(cls: type, copy_: _record.Copy) -> Optional[_Copier]:
    """The shim's copier for an object of class `cls` that copy's table has no entry for, in
    `copy_`; None: deepcopy's own way (`__deepcopy__`, then the reduction)."""
    if copy_.survey is not None:
        surveyed: Optional[_Copier] = copy_.survey.copier_for(cls)
        return surveyed
    return copy_module if issubclass(cls, _Module) else None


class DispatchTable(dict):  # type: ignore[type-arg]
    """`copy._deepcopy_dispatch` while the shim is installed: a dict with the entries of the
    table it stands in for (`original`, which every change made through this one changes too,
    and which deepcopy's questions are answered from), and a `get` that answers as the module
    docstring says."""

    __slots__ = ("original",)

    def __init__(self, original: Dict[type, Any]) -> None:
        super().__init__(original)
        self.original = original

    def get(self, cls: Any, default: Any = None) -> Any:
        found = self.original.get(cls, default)
        if _tracing():  # torch.compile's tracer, tracing copy's code: the entry, as natively
            return found
        # Only `copy.deepcopy`'s own question is answered otherwise: whoever else asks the
        # table (a copier of its own, monkeypatch) gets its entries as they are.
        copy_ = _current()
        if copy_ is not None and copy_.chain is _scope_chain() and copy_.open:
            # An object of the copy running here: the table's entry, or the shim's copier for
            # a module or a survey's tensor (copier_for, written out: this runs for every one).
            if found is None and (copy_.survey is not None or issubclass(cls, _Module)):
                copier = copier_for(cls, copy_)
                if copier is not None and _getframe(1).f_code is _DEEPCOPY_CODE:
                    return copier
            return found
        if copy_ is not None and copy_.survey is not None and copy_.open:
            if _getframe(1).f_code is _DEEPCOPY_CODE:
                return self.copy_root  # a scope entered during a survey is surveyed too
        scope = _scope_chain()
        if scope is None:
            setting = _modes.global_setting()
        else:
            setting = scope.setting if scope.live else _current_setting()
        if setting is not None and _getframe(1).f_code is _DEEPCOPY_CODE:
            return self.copy_root  # the first object of a copy made in a mode
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
        with _record.opened(copy_):
            copier = found if found is not None else copier_for(cls, copy_)
            copied = copier(x, memo) if copier is not None else _protocol.copy_undispatched(x, memo)
            copy_.settle_storages()
        if copy_.met and survey is None:
            copy_.report()
        return copied

    # Changes go to both tables, so that the one put back when the shim is removed holds them.
    def __setitem__(self, key: Any, value: Any) -> None:
        self.original[key] = value
        dict.__setitem__(self, key, value)

    def __delitem__(self, key: Any) -> None:
        del self.original[key]
        dict.__delitem__(self, key)

    def setdefault(self, key: Any, default: Any = None) -> Any:
        self.original.setdefault(key, default)
        return dict.setdefault(self, key, default)

    def pop(self, key: Any, *default: Any) -> Any:
        self.original.pop(key, *default)
        return dict.pop(self, key, *default)

    def popitem(self) -> Any:
        key, value = dict.popitem(self)
        self.original.pop(key, None)
        return key, value

    def update(self, *args: Any, **kwargs: Any) -> None:
        changes = dict(*args, **kwargs)
        self.original.update(changes)
        dict.update(self, changes)

    def __ior__(self, other: Any) -> DispatchTable:  # type: ignore[misc]
        self.update(other)
        return self

    def clear(self) -> None:
        self.original.clear()
        dict.clear(self)
