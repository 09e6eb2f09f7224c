"""The public switches: enable/disable, the enabled() scope, the one-off deepcopy(), and the
questions a user asks of them (is_enabled, current_mode, find_nonleaf_tensors)."""

from __future__ import annotations

import copy
import functools
import sys
from types import TracebackType
from typing import TYPE_CHECKING, Any, Callable, Dict, List, NoReturn, Optional, Tuple, Type, TypeVar, Union

from . import _modes, _patch
from ._modes import Mode, ModeSetting, Source
from ._names import class_name

if TYPE_CHECKING:
    import torch

__all__ = [
    "NotAScope",
    "current_mode",
    "deepcopy",
    "disable",
    "enable",
    "enabled",
    "find_nonleaf_tensors",
    "is_enabled",
    "scope",
    "set_global",
    "written",
]

_F = TypeVar("_F", bound=Callable[..., Any])
_T = TypeVar("_T")
ModeLike = Union[Mode, str, bool, int]


def written(value: ModeLike) -> str:
    """`value` as a user writes it in code: `'warn'`, `True`, `deepcopy_shim.Mode.STRICT`."""
    if isinstance(value, Mode):
        return f"deepcopy_shim.Mode.{value.name}"
    return repr(value)


def enable(mode: ModeLike = "warn") -> NotAScope:
    """Make every `copy.deepcopy` in the process use the shim, in `mode`.

    `mode` takes the vocabulary of every door: `"warn"`, `"strict"` or `"silent"` (a
    `Mode` or its name, any case); `True`, `1`, `"on"`, `"1"`, `"true"` or `"yes"` mean
    `warn`; `False`, `0`, `"off"`, `"0"`, `"false"` or `"no"` mean `disable()`.

    Idempotent: a second call only changes the mode; the patch is never applied twice.  If torch
    is not imported yet, the patch is applied when it is (this call does not import torch).

    Returns:
        A `NotAScope`, which a plain call (`deepcopy_shim.enable("silent")` as a statement)
            simply drops.  It is there for the line that meant `enabled(...)`:
            `with deepcopy_shim.enable(...):` and `@deepcopy_shim.enable(...)` first undo this
            call (the process is left as it was before it) and then raise `TypeError` naming
            `deepcopy_shim.enabled(...)`, the scope for a block or a function.

    Raises:
        ModeValueError: `mode` (a `ValueError`) is not in the vocabulary, a blank string
            included (`enable(os.environ.get("FLAG", ""))` is not `disable()`); nothing changes.
        TypeError: `mode` is of no accepted type (None, a float, bytes); nothing changes.
        RuntimeError: the patch cannot be installed (another patch replaced
            `copy._deepcopy_dispatch` with something that is not a dict); nothing changes.
    """
    parsed = _modes.parse_mode(mode)
    setting = None if parsed is None else ModeSetting(
        parsed, Source.CODE, f"deepcopy_shim.enable({written(mode)})", "deepcopy_shim.enable({!r})")
    return NotAScope(written(mode), set_global(setting), setting)


class NotAScope:
    """What `enable()` returns: nothing to use, and a clear error where a scope was meant.

    `enable()` sets the mode of the whole process; `enabled()` is the scope.  One letter apart,
    `with deepcopy_shim.enable("silent"):` would otherwise fail with Python's words about None
    and leave the shim on for the whole process.  Entering this object or decorating with it
    undoes its `enable()` call (the global setting in effect before it is put back, with its
    user of the patch, as long as nothing changed the setting since) and raises `TypeError`
    naming `deepcopy_shim.enabled(...)`.  It holds the mode as written and two small settings,
    nothing else.
    """

    __slots__ = ("_written", "_previous", "_made")

    def __init__(self, written_mode: str, previous: Optional[ModeSetting],
                 made: Optional[ModeSetting]) -> None:
        self._written = written_mode  # the mode as the call wrote it: 'silent', True, ...
        self._previous = previous  # the global setting before the call (None: off)
        self._made = made  # the one the call made (None: it disabled)

    def _refuse(self, what: str, instead: str) -> NoReturn:
        undone = _modes.global_setting() is self._made  # else a later call set it: kept
        if undone:
            set_global(self._previous)
        raise TypeError(
            f"deepcopy_shim.enable({self._written}) switches the shim for the whole process and "
            f"is not {what}, so {'it was undone' if undone else 'the mode set since is kept'}; "
            f"use {instead.format(f'deepcopy_shim.enabled({self._written})')}"
        )

    def __enter__(self) -> NoReturn:
        self._refuse("a scope", "`with {}:` for a block")

    def __exit__(self, *exc: object) -> None:  # pragma: no cover - __enter__ always raises
        pass  # never called, but `with` looks it up before it calls `__enter__`

    def __call__(self, func: object) -> NoReturn:
        self._refuse("a decorator", "`@{}` for a function")

    def __repr__(self) -> str:
        # What the REPL shows after `deepcopy_shim.enable(...)`: what the call did.
        done = f"mode {self._made.mode.value}" if self._made is not None else "off"
        return f"<deepcopy_shim.enable({self._written}): {done} for the whole process>"


def set_global(setting: Optional[ModeSetting]) -> Optional[ModeSetting]:
    """Make `setting` the process-wide one (`None`: off), counting the patch's user first;
    return the setting it replaced (`None`: it was off).

    The door behind `enable()`/`disable()`, the environment variable, the runner and
    the pytest option, each passing its own `Source`.  No lock is held while the patch
    is acquired or released (see `_patch`).
    """
    if setting is None:
        previous = _modes.swap_global(None)
        if previous is not None:
            _patch.release()
        else:
            _patch.settle()  # in a forked child, users forgotten at the fork may have left it
        return previous
    _patch.acquire()  # the user is counted before the setting is visible, and undone on failure
    previous = _modes.swap_global(setting)
    if previous is not None:
        _patch.release()  # it was enabled already: that earlier enable holds the patch
    return previous


def disable() -> None:
    """Undo `enable()` (and start-up activation). Safe to call when not enabled.

    Once no `enabled` scope is active either, the patch is removed completely:
    `torch.Tensor.__dict__["__deepcopy__"]` is the original function object again and
    `copy._deepcopy_dispatch` the original dict.  Scopes still active in other
    threads keep their mode until they exit.
    """
    set_global(None)


def is_enabled() -> bool:
    """True if a deep copy made now, in this thread or task, would use the shim.

    That is: after `enable()`, or inside an `enabled` scope (even before torch is
    imported, when the patch is still waiting for `import torch`), unless the shim stays out
    of the way because this torch does not refuse non-leaf tensors as expected (a
    `TorchCompatibilityWarning` said so).  `current_mode()` also says which mode and where
    it was set.
    """
    return current_mode() is not None


def current_mode() -> Optional[ModeSetting]:
    """The mode in effect for a copy made now in this thread or task, and where it was set.

    Returns `None` when copies behave natively (no mode set here, or the shim stays out of
    the way on this torch), else a `ModeSetting`: `mode` (a `Mode`), `source` (a
    `Source`: code, scope, environment, runner or pytest) and `how`, the setting as
    written; `str()` of it reads `"strict (from DEEPCOPY_SHIM=strict)"`.
    """
    if _patch.inert_reason() is not None:
        return None
    return _modes.current_setting()


class enabled:
    """Use the shim in `mode` for the current thread or async task only.

    One object, three uses, like time-machine's `travel`
    ([time-machine](https://time-machine.readthedocs.io/): a context manager, a decorator, and
    `start()`/`stop()`):

    ```python
    with deepcopy_shim.enabled("strict"):
        copy.deepcopy(model)

    @deepcopy_shim.enabled("silent")
    def make_target(net): return copy.deepcopy(net)

    scope = deepcopy_shim.enabled(); scope.start(); ...; scope.stop()
    ```

    `mode` takes the vocabulary of `enable()`; an off word makes a scope in which copies
    behave natively even while the shim is enabled globally.  On exit the previous state is
    restored exactly; scopes nest, the innermost wins, and the global mode is never touched.
    A copy made inside the scope is a copy of its own, also when the scope is entered inside
    another copy's `__deepcopy__`.

    One object may be entered by several threads and tasks at once, in any order: each thread
    or task leaves the scopes it entered, innermost first (a `stop()` for a scope entered
    earlier in the same thread or task leaves that one).  Decorating a function gives each call
    a scope of its own (sync or async); decorating a `unittest.TestCase` subclass decorates its
    test methods, `setUp`/`tearDown` (and their async and class-level forms) that the class
    defines.

    Raises:
        ModeValueError: `mode` (a `ValueError`) is not in the vocabulary (at construction).
        TypeError: `mode` is of no accepted type (at construction).
        RuntimeError: `stop()` in a thread or task that entered no scope of this object.
        TypeError: decorating a generator function, or a class that is not a `TestCase`.
    """

    def __init__(self, mode: ModeLike = "warn") -> None:
        self._init(mode, Source.SCOPE, f"deepcopy_shim.enabled({written(mode)})",
                   "deepcopy_shim.enabled({!r})")

    def _init(self, mode: ModeLike, source: Source, how: str, template: str) -> None:
        parsed = _modes.parse_mode(mode)
        self._setting = None if parsed is None else ModeSetting(parsed, source, how, template)

    @property
    def mode(self) -> Optional[Mode]:
        """The scope's mode (None: copies behave natively in it); fixed at construction."""
        return self._setting.mode if self._setting is not None else None

    def start(self) -> None:
        """Enter the scope in this thread or task (installing the patch for its first user)."""
        if self._setting is not None:
            _patch.acquire(here=True)
        try:
            _modes.push_scope(self, self._setting)
        except BaseException:  # pragma: no cover - pushing a scope allocates one object
            if self._setting is not None:
                _patch.release(here=True)
            raise

    def stop(self) -> None:
        """Leave the innermost scope of this object that this thread or task entered: from
        now on it applies nowhere, also not in a task or context copied from this one while it
        was entered.  Releases its user of the patch."""
        left = _modes.pop_scope(self)
        if left.setting is not None:
            _patch.release(here=True)

    def __enter__(self) -> enabled:
        self.start()
        return self

    def __exit__(self, exc_type: Optional[Type[BaseException]], exc: Optional[BaseException],
                 tb: Optional[TracebackType]) -> None:
        self.stop()

    def __call__(self, func: _F) -> _F:
        """Decorate `func` (sync or async) so that each call runs in its own scope, or a
        `unittest.TestCase` subclass (see the class docstring); returns the decorated object.

        Raises:
            TypeError: `func` is a generator function (its body runs when iterated, outside
                any scope the call could set up), or a class that is not a `TestCase`.
        """
        import inspect  # here, not at module level: it is a third of this package's import time

        if isinstance(func, type):
            return self._decorate_test_case(func)  # type: ignore[return-value]
        if inspect.isgeneratorfunction(func) or inspect.isasyncgenfunction(func):
            raise TypeError(
                f"deepcopy_shim.enabled cannot decorate the generator function {func.__name__}: "
                "its body runs outside the call; use `with deepcopy_shim.enabled(...):` inside it."
            )
        scope = self
        if inspect.iscoroutinefunction(func):
            @functools.wraps(func)
            async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
                scope.start()
                try:
                    return await func(*args, **kwargs)
                finally:
                    scope.stop()
            return async_wrapper  # type: ignore[return-value]

        @functools.wraps(func)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            scope.start()
            try:
                return func(*args, **kwargs)
            finally:
                scope.stop()
        return wrapper  # type: ignore[return-value]

    def _decorate_test_case(self, cls: type) -> type:
        import inspect
        import unittest

        if not issubclass(cls, unittest.TestCase):
            raise TypeError(
                f"deepcopy_shim.enabled can decorate functions and unittest.TestCase subclasses, "
                f"not the class {class_name(cls)}: decorate its methods, or use "
                "`with deepcopy_shim.enabled(...):` inside them."
            )
        prefix = unittest.TestLoader.testMethodPrefix
        hooks = ("setUp", "tearDown", "asyncSetUp", "asyncTearDown")
        for name in dir(cls):
            if not (name.startswith(prefix) or name in hooks or name in ("setUpClass", "tearDownClass")):
                continue
            owner = next((k for k in cls.__mro__ if name in vars(k)), None)
            if owner is None or owner.__module__.split(".")[0] == "unittest":
                continue  # unittest's own empty hooks
            raw = inspect.getattr_static(cls, name)
            if isinstance(raw, classmethod):
                setattr(cls, name, classmethod(self(raw.__func__)))
            elif isinstance(raw, staticmethod):
                setattr(cls, name, staticmethod(self(raw.__func__)))
            elif inspect.isfunction(raw) and not inspect.isgeneratorfunction(raw):
                setattr(cls, name, self(raw))
        return cls

    def __repr__(self) -> str:
        return f"deepcopy_shim.enabled(mode={self.mode.value if self.mode else 'off'!r})"


enabled.__module__ = "deepcopy_shim"


def scope(mode: ModeLike, source: Source, template: str, how: Optional[str] = None) -> enabled:
    """An `enabled` scope whose setting says it came from `source`, written as `how` (default:
    `template` filled with `mode` as given); another mode is written as `template` filled with
    it (the pytest marker and fixture)."""
    made = enabled.__new__(enabled)
    made._init(mode, source, template.format(mode) if how is None else how, template)
    return made


def deepcopy(obj: _T, memo: Optional[Dict[int, Any]] = None, *, mode: ModeLike = "warn") -> _T:
    """Return `copy.deepcopy(obj, memo)` made with the shim's semantics in `mode`.

    Called as `copy.deepcopy` is (`deepcopy(x)`, `deepcopy(x, memo)`), it replaces it for one
    copy; the mode is given by keyword: `deepcopy(model, mode="silent")`.  A mode given
    second instead of a memo (`deepcopy(model, "silent")`, as earlier releases took it) is
    still read as the mode: a str, a `Mode`, a bool or 0/1 is never a memo.

    A copy of its own wherever it is called, also inside another copy's `__deepcopy__`.
    Nothing is enabled globally: other threads keep their behaviour.  Mode `warn` emits one
    `DetachedTensorsWarning` when the copy is complete, naming every tensor it detached;
    mode `strict` raises `NonLeafTensorError` at the first tensor with history, naming every
    such tensor the copy would meet; an off word makes a native copy.  `obj` is never
    modified; `memo`, as in `copy.deepcopy`, receives the copy's entries.

    Raises:
        ModeValueError: `mode` (a `ValueError`) is not in the vocabulary.
        TypeError: `mode` is of no accepted type, `memo` is neither a dict (or another
            mapping with `get`) nor a mode, or a mode is given second and another by keyword.
        NonLeafTensorError: mode `strict` and the copy met a tensor with autograd history.
    """
    if isinstance(memo, (str, int, Mode)):  # the mode, given second (bool is an int)
        if mode != "warn":
            raise TypeError(f"deepcopy_shim: deepcopy() got two modes, {written(memo)} second and "
                            f"mode={written(mode)}; give one, by keyword: mode=...")
        memo, mode = None, memo
    elif memo is not None and not (callable(getattr(memo, "get", None)) and hasattr(memo, "__setitem__")):
        hint = (f"; the object to copy comes first: deepcopy_shim.deepcopy(obj, mode={_modes.shown(obj)})"
                if isinstance(obj, str) and not isinstance(obj, Mode) else "")  # swapped
        raise TypeError(f"deepcopy_shim: deepcopy()'s second argument is the memo, a dict as "
                        f"copy.deepcopy takes, or the mode; not {type(memo).__name__} "
                        f"({_modes.shown(memo)}){hint}")
    parsed = _modes.parse_mode(mode)
    setting = None if parsed is None else ModeSetting(
        parsed, Source.SCOPE, f"deepcopy_shim.deepcopy(obj, mode={written(mode)})",
        "deepcopy_shim.deepcopy(obj, mode={!r})")
    owner = object()
    if setting is not None:
        _patch.acquire(here=True)
    try:
        _modes.push_scope(owner, setting)
        try:
            return copy.deepcopy(obj, memo)
        finally:
            _modes.pop_scope(owner)
    finally:
        if setting is not None:
            _patch.release(here=True)


def find_nonleaf_tensors(obj: Any) -> List[Tuple[str, torch.Tensor]]:
    """Every tensor with autograd history that deep-copying `obj` would detach.

    Returns `(path, tensor)` pairs in the order the copy meets them, with the paths that
    mode `warn` reports; `[]` if there are none (and when torch is not imported).

    The answer comes from the copy itself, so it follows `copy.deepcopy`'s protocol exactly:
    tensors that a custom `__deepcopy__` or reduction leaves out are not listed.  The copy is
    made with a stand-in for every tensor (on the meta device: no tensor data is copied) and
    discarded; `obj` is not modified.  Code in `obj`'s own copy methods runs as in any copy.
    Where that copy cannot be made without the tensors' data (a `__setstate__` that reads
    values), the real copy is made once, in mode `warn`, and discarded.

    Raises:
        Exception: whatever else the copy of `obj` raises (an object that cannot be copied).
    """
    if "torch" not in sys.modules:
        return []
    from . import _survey

    entries, error = _survey.run(obj, _survey.dry_memo(), _patch.holding)
    if error is None:
        return [(e.label, e.tensor) for e in entries]
    return _found_by_copying(obj)


def _found_by_copying(obj: Any) -> List[Tuple[str, torch.Tensor]]:
    import warnings

    from ._errors import DetachedTensorsWarning

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        deepcopy(obj, mode=Mode.WARN)
    found: List[Tuple[str, torch.Tensor]] = []
    for seen in caught:
        if isinstance(seen.message, DetachedTensorsWarning):  # its tensors are obj's, alive
            found.extend((path, tensor) for path, tensor in zip(seen.message.paths, seen.message.tensors)
                         if tensor is not None)
        else:  # not ours: shown as it would have been
            warnings.warn_explicit(seen.message, seen.category, seen.filename, seen.lineno)
    return found
