"""Modes, the one vocabulary that names them, and which mode applies where.

The global setting is made by `deepcopy_shim.enable()` (and by the environment, the runner
and the pytest option, which call it); `deepcopy_shim.enabled` and
`deepcopy_shim.deepcopy()` override it for the current thread or async task only.  Every
setting remembers how it was written, so that messages can say how to change it.  Nothing here
imports torch.
"""

from __future__ import annotations

import contextvars
import enum
import os
import sys
import threading
import weakref
from typing import Any, Callable, Optional, Union

__all__ = [
    "OFF_WORDS",
    "ON_WORDS",
    "Mode",
    "ModeSetting",
    "ModeValueError",
    "Scope",
    "Source",
    "copy_wanted",
    "current_setting",
    "global_setting",
    "innermost_scope",
    "on_and_off_words",
    "parse_mode",
    "pop_scope",
    "push_scope",
    "running_copy",
    "scope_head",
    "start_copy",
    "end_copy",
    "swap_global",
    "valid_values",
]

# Spellings that mean "on, in the default mode" and "off", accepted by every door.  A blank
# value is none of them: only the environment variable reads it as unset (see `_bootstrap`);
# in code and on a command line it means something was left out.
ON_WORDS = ("1", "true", "on", "yes")
OFF_WORDS = ("0", "false", "off", "no")


class Mode(str, enum.Enum):
    """What a deep copy does when it meets a tensor with autograd history (a non-leaf tensor).

    - `WARN`: copy it as a detached leaf; when the copy is complete, emit one
      `DetachedTensorsWarning` naming every tensor it detached.
    - `STRICT`: refuse it where torch refuses it, with `NonLeafTensorError`, naming every
      such tensor the copy would meet.
    - `SILENT`: copy it as a detached leaf without a word.

    A mode is also a `str` (`Mode.WARN == "warn"`), so either form is accepted everywhere.
    """

    __module__ = "deepcopy_shim"

    WARN = "warn"
    STRICT = "strict"
    SILENT = "silent"

    @classmethod
    def parse(cls, value: Union[Mode, str]) -> Mode:
        """Return the mode named by `value` (a `Mode` or its name, any case).

        Raises `ValueError` naming the bad value and the valid ones.  For the whole
        vocabulary, on and off words included, see `deepcopy_shim.enable()`.
        """
        mode = parse_mode(value)
        if mode is None:
            raise ModeValueError(
                f"deepcopy_shim: {value!r} means off, which is not a mode; valid modes are "
                f"{', '.join(repr(m.value) for m in cls)}"
            )
        return mode

    def __str__(self) -> str:
        return self.value


class Source(str, enum.Enum):
    """Where the mode in effect was set: the door a user opened, and so the one to change it."""

    __module__ = "deepcopy_shim"

    CODE = "code"
    """`deepcopy_shim.enable()` in the program."""
    SCOPE = "scope"
    """A `deepcopy_shim.enabled()` scope or a `deepcopy_shim.deepcopy()` call."""
    ENVIRONMENT = "environment"
    """The `DEEPCOPY_SHIM` environment variable, read at interpreter start-up."""
    RUNNER = "runner"
    """`python -m deepcopy_shim --mode MODE` / `deepcopy-shim --mode MODE`."""
    PYTEST = "pytest"
    """The pytest plugin: `--deepcopy-shim`, the ini key, the marker or the fixture."""

    def __str__(self) -> str:
        return self.value


class ModeSetting:
    """The mode in effect and where it came from, as `deepcopy_shim.current_mode()` says.

    `mode` is a `Mode`, `source` a `Source`, and `how` the setting as it was written
    (`"DEEPCOPY_SHIM=on"`, `"deepcopy_shim.enable(True)"`); `spelled(mode)` writes the same
    setting for another mode (`"DEEPCOPY_SHIM=silent"`), which is how messages say exactly
    what to write instead.  Settings compare equal when mode, source and `how` are equal.
    """

    __slots__ = ("mode", "source", "how", "_template")
    __module__ = "deepcopy_shim"

    mode: Mode
    source: Source
    how: str
    _template: str

    def __init__(self, mode: Mode, source: Source, how: str, template: Optional[str] = None) -> None:
        # `template` has `{}` where the mode goes; None: `how` is that template filled with
        # this mode's name.
        object.__setattr__(self, "mode", Mode.parse(mode))
        object.__setattr__(self, "source", Source(source))
        object.__setattr__(self, "_template", how if template is None else template)
        object.__setattr__(self, "how", how.format(self.mode.value) if template is None else how)

    def spelled(self, mode: Union[Mode, str, None] = None) -> str:
        """This setting as written for `mode` (default: as written), e.g. `DEEPCOPY_SHIM=silent`."""
        if mode is None:
            return self.how
        return self._template.format(Mode.parse(mode).value)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"ModeSetting is read-only: cannot set {name!r}")

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ModeSetting):
            return NotImplemented
        return (self.mode, self.source, self.how) == (other.mode, other.source, other.how)

    def __hash__(self) -> int:
        return hash((self.mode, self.source, self.how))

    def __repr__(self) -> str:
        return (f"ModeSetting(mode={self.mode.value!r}, source={self.source.value!r}, "
                f"how={self.how!r})")

    def __str__(self) -> str:
        return f"{self.mode.value} (from {self.how})"


class ModeValueError(ValueError):
    """An unknown mode spelling; its message names the value and the valid ones."""

    __module__ = "deepcopy_shim"


def valid_values() -> str:
    """The accepted spellings, in words, for messages: `warn, strict, silent; 1, true, ...`."""
    modes = ", ".join(m.value for m in Mode)
    return f"{modes}; {', '.join(ON_WORDS)} (warn); {', '.join(OFF_WORDS)} (off)"


def on_and_off_words(sep: str = "/") -> tuple[str, str]:
    """The on and off words joined by `sep` (`"1/true/on/yes"`, `"0/false/off/no"`), for help texts."""
    return sep.join(ON_WORDS), sep.join(OFF_WORDS)


def parse_mode(value: Union[Mode, str, bool, int], what: str = "mode") -> Optional[Mode]:
    """The mode `value` names, or `None` for off: the vocabulary of every door.

    A `Mode` or its name (any case, surrounding blanks ignored); `True`, `1` or an on
    word (`"1"`, `"true"`, `"on"`, `"yes"`) for `warn`; `False`, `0` or an off word
    (`"0"`, `"false"`, `"off"`, `"no"`) for off.

    Raises `ModeValueError` (a `ValueError`) for a value of an accepted type that names no
    mode, a blank string included (`enable(os.environ.get("X", ""))` must not quietly mean
    off; the environment door reads blank as unset before asking here), naming `what` was
    bad (`"mode"` from Python; a text door's own name, such as `"DEEPCOPY_SHIM value"`,
    whose message then lists only what can be written there), the value and the valid ones;
    `TypeError` for a value of any other type (None included, with the way to say warn or
    off), as Python does.
    """
    if isinstance(value, Mode):
        return value
    if isinstance(value, (bool, int)) and value in (0, 1):  # True/False are 1/0
        return Mode.WARN if value else None
    if isinstance(value, str):
        word = value.strip().lower()
        if word in OFF_WORDS:
            return None
        if word in ON_WORDS:
            return Mode.WARN
        for mode in Mode:
            if word == mode.value:
                return mode
    elif not isinstance(value, int):
        hint = " (leave the argument out for 'warn', or pass 'off')" if value is None else ""
        raise TypeError(
            f"deepcopy_shim: {what} must be a str, a deepcopy_shim.Mode, a bool or 0/1, "
            f"not {type(value).__name__} ({value!r}){hint}"
        )
    # Only Python code passes a bool, an int or a Mode: a text door's value is a string.
    python_only = "; also True/False, 1/0 and deepcopy_shim.Mode members" if what == "mode" else ""
    raise ModeValueError(
        f"deepcopy_shim: invalid {what} {value!r}; valid values are {valid_values()} "
        f"(in any case{python_only})"
    )


class Scope:
    """One entry into a scope, in one thread or task, linked to the one it nests in.

    `setting` is None for a scope in which copies behave natively.  `survey` is set inside the
    shim's own data-free walk (see `_survey`) and inherited by scopes entered during it.
    `entrant` is the thread and asyncio task that entered it: a task created inside the scope
    inherits it (asyncio copies the context) but cannot leave it.  `live` is True until the
    entrant leaves it: from then on it applies nowhere, also not in the tasks and contexts that
    were copied from the entrant's while it was live and still hold it.  `hides` is the copy
    that was running where it was entered (see `running_copy`), until it is left.
    """

    __slots__ = ("owner", "setting", "outer", "survey", "entrant", "live", "hides")

    def __init__(self, owner: object, setting: Optional[ModeSetting], outer: Optional[Scope],
                 survey: Any = None) -> None:
        self.owner = owner
        self.setting = setting
        self.outer = outer
        self.survey: Any = survey if survey is not None else (outer.survey if outer is not None else None)
        self.entrant: Any = _entrant()
        self.live = True
        self.hides: Any = None


def _entrant() -> Any:
    """This thread and asyncio task: (thread id, weak reference to the task or None).

    The task is held weakly: it holds its context, which holds the scope.  Two such pairs are
    equal for the same thread and the same live task (weak references to live objects compare
    their referents, and a task's `==` is identity).  asyncio is looked up, not imported:
    where it is not imported, no task runs.
    """
    asyncio = sys.modules.get("asyncio")
    task = None
    # Another thread may be importing asyncio right now: a half-made module lacks the names
    # below, and then no task can be running in this thread.
    running_loop = getattr(asyncio, "_get_running_loop", None)
    current_task = getattr(asyncio, "current_task", None)
    if running_loop is not None and current_task is not None:
        loop = running_loop()
        if loop is not None:
            task = current_task(loop)
    return (threading.get_ident(), weakref.ref(task) if task is not None else None)


_global: Optional[ModeSetting] = None
# Guards read-modify-write of the global setting only; never held while anything is imported
# or installed (see _activation).
_global_lock = threading.Lock()
# The innermost scope of this thread or task.  A context variable, not a thread-local: it
# follows asyncio tasks as well as threads, and a new thread starts outside every scope, which
# is the isolation `enabled()` promises.  Scopes are a linked list rather than contextvars
# tokens: a token can only be reset in the context that made it, and one `enabled` object is
# shared by threads and tasks that enter and leave it in any order.
_scoped: contextvars.ContextVar[Optional[Scope]] = contextvars.ContextVar(
    "deepcopy_shim_scope", default=None
)


def innermost_scope() -> Optional[Scope]:
    """The innermost live scope of this thread or task (None: the global setting applies)."""
    scope = _scoped.get()
    while scope is not None and not scope.live:  # left by its entrant, here or in a parent task
        scope = scope.outer
    return scope


def current_setting() -> Optional[ModeSetting]:
    """The setting that applies to a copy made now in this thread/task; None: native behaviour."""
    scope = _scoped.get()
    while scope is not None:
        if scope.live:
            return scope.setting
        scope = scope.outer
    return _global


def copy_wanted() -> bool:
    """True if a copy started now in this thread or task is one of the shim's: a mode applies
    here, or a survey (see `_survey`) runs in the scope it is started in."""
    scope = _scoped.get()
    while scope is not None:
        if scope.live:
            return scope.setting is not None or scope.survey is not None
        scope = scope.outer
    return _global is not None


# The copy of the shim's running in this thread or task (a `_record.Copy`, open or closed): set
# by the call that starts it (`start_copy`) and reset by that call as it ends, whatever happens
# in between.  A scope entered while it runs hides it (a copy made in the scope is a copy of its
# own) until that scope is left, when it runs on.  Which copy runs is never worked out from the
# scope chain: a scope's exit may leave the chain other than it found it (see `pop_scope`).
_running: contextvars.ContextVar[Any] = contextvars.ContextVar("deepcopy_shim_copy", default=None)
# running_copy() -> that copy, or None.  The variable's own bound `get`, not a function around
# it: it runs for every object a copy meets.
running_copy: Callable[[], Any] = _running.get
start_copy = _running.set  # -> the token its caller resets the variable with as the copy ends
end_copy = _running.reset


# scope_head() -> this thread's or task's innermost scope entry, live or not (see `copy_wanted`).
scope_head: Callable[[], Optional[Scope]] = _scoped.get


def global_setting() -> Optional[ModeSetting]:
    """The process-wide setting made by `enable()` and the doors that call it."""
    return _global


def _new_lock_after_fork() -> None:
    # In a forked child another thread, gone there, may have held it at the fork.
    global _global_lock
    _global_lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_new_lock_after_fork)


def swap_global(setting: Optional[ModeSetting]) -> Optional[ModeSetting]:
    """Make `setting` the global one; return the previous one (atomically)."""
    global _global
    with _global_lock:
        previous, _global = _global, setting
    return previous


def push_scope(owner: object, setting: Optional[ModeSetting], survey: Any = None) -> Scope:
    """Enter a scope of `owner` in this thread or task (`setting` None: off in it), hiding the
    copy running here, if any, until it is left."""
    scope = Scope(owner, setting, _scoped.get(), survey)
    scope.hides = _running.get()
    if scope.hides is not None:
        _running.set(None)
    _scoped.set(scope)
    return scope


def pop_scope(owner: object) -> Scope:
    """Leave the innermost live scope `owner` entered in this thread or task; return it.

    It applies nowhere from now on (see `Scope.live`).  Scopes of other owners entered after it
    (left out of order) stay in effect.  Raises `RuntimeError` if `owner` entered no live scope
    in this thread or task.
    """
    here = _entrant()
    scope = _scoped.get()
    while scope is not None and not (scope.live and scope.owner is owner and scope.entrant == here):
        scope = scope.outer
    if scope is None:
        raise RuntimeError(
            "deepcopy_shim.enabled.stop() without a matching start() in this thread or task "
            "(each thread and asyncio task leaves the scopes it entered)"
        )
    scope.live = False
    hidden, scope.hides = scope.hides, None
    top = _scoped.get()
    if top is scope or (top is not None and not top.live):
        _scoped.set(innermost_scope())  # the chain's dead head is dropped here
    if top is scope and hidden is not None and hidden.open and _running.get() is None:
        _running.set(hidden)  # left where it was entered: the copy it was entered in runs on
    return scope
