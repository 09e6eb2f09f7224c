"""Modes, the one vocabulary that names them, and which mode applies where.

The global setting is made by `deepcopy_shim.enable()` (and by the environment, the runner
and the pytest option, which call it); `deepcopy_shim.enabled` and
`deepcopy_shim.deepcopy()` override it for the current thread or async task only, through a
context variable.  Every setting remembers where it came from, so that messages can say how to
change it.  Nothing here imports torch.
"""

from __future__ import annotations

import contextvars
import enum
import threading
from typing import NamedTuple, Optional, Union

__all__ = [
    "OFF_WORDS",
    "ON_WORDS",
    "Mode",
    "ModeSetting",
    "ModeValueError",
    "Source",
    "current_setting",
    "global_setting",
    "parse_mode",
    "pop_scope",
    "push_scope",
    "swap_global",
    "valid_values",
]

# Spellings that mean "on, in the default mode" and "off", accepted by every door.
ON_WORDS = ("1", "true", "on", "yes")
OFF_WORDS = ("0", "false", "off", "no", "")


class Mode(str, enum.Enum):
    """What a deep copy does when it meets a tensor with autograd history (a non-leaf tensor).

    - `WARN`: copy it as a detached leaf; when the copy is complete, emit one
      `DetachedTensorsWarning` naming every tensor it detached.
    - `STRICT`: refuse the copy with `NonLeafTensorError`, naming every such tensor met.
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


class ModeSetting(NamedTuple):
    """The mode in effect and where it came from, as `deepcopy_shim.current_mode()` says.

    `how` is the setting as the user wrote it, with `{}` where the mode goes
    (`"DEEPCOPY_SHIM={}"`, `"deepcopy_shim.enable({!r})"`); `spelled()` fills it in,
    which is how messages say exactly what to write instead.
    """

    mode: Mode
    source: Source
    how: str

    def spelled(self, mode: Union[Mode, str, None] = None) -> str:
        """This setting as written for `mode` (default: its own), e.g. `DEEPCOPY_SHIM=silent`."""
        return self.how.format(Mode.parse(mode).value if mode is not None else self.mode.value)

    def __str__(self) -> str:
        return f"{self.mode.value} (from {self.spelled()})"


ModeSetting.__module__ = "deepcopy_shim"


class ModeValueError(ValueError):
    """An unknown mode spelling; its message names the value and the valid ones."""


def valid_values() -> str:
    """The accepted spellings, in words, for messages."""
    modes = ", ".join(m.value for m in Mode)
    return f"{modes}; {', '.join(ON_WORDS)} (warn); {', '.join(OFF_WORDS[:-1])} (off)"


def parse_mode(value: Union[Mode, str, bool], what: str = "mode") -> Optional[Mode]:
    """The mode `value` names, or `None` for off: the vocabulary of every door.

    A `Mode` or its name (any case, surrounding blanks ignored); `True` or an on word
    (`1`, `true`, `on`, `yes`) for `warn`; `False`, an off word (`0`, `false`,
    `off`, `no`) or a blank string for off.  Raises `ModeValueError` (a
    `ValueError`) naming `what` was bad (`"mode"`, `"DEEPCOPY_SHIM value"`), the value
    and the valid ones.
    """
    if isinstance(value, Mode):
        return value
    if isinstance(value, bool):
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
    raise ModeValueError(f"deepcopy_shim: invalid {what} {value!r}; valid values are {valid_values()}")


# The scope value for "off inside this scope", distinct from "no scope" (None).
OFF = ModeSetting(Mode.SILENT, Source.SCOPE, "off")

_global: Optional[ModeSetting] = None
# Guards read-modify-write of the global setting only; never held while anything is imported
# or installed (see _activation).
_global_lock = threading.Lock()
# A context variable, not a thread-local: it follows asyncio tasks as well as threads, and a new
# thread starts outside every scope, which is the isolation `enabled()` promises.
_scoped: contextvars.ContextVar[Optional[ModeSetting]] = contextvars.ContextVar(
    "deepcopy_shim_mode", default=None
)


def current_setting() -> Optional[ModeSetting]:
    """The setting that applies to a copy made now in this thread/task; None: native behaviour."""
    scoped = _scoped.get()
    if scoped is None:
        return _global
    return None if scoped is OFF else scoped


def global_setting() -> Optional[ModeSetting]:
    return _global


def swap_global(setting: Optional[ModeSetting]) -> Optional[ModeSetting]:
    """Make `setting` the global one; return the previous one (atomically)."""
    global _global
    with _global_lock:
        previous, _global = _global, setting
    return previous


def push_scope(setting: Optional[ModeSetting]) -> contextvars.Token[Optional[ModeSetting]]:
    """Enter a scope in which `setting` applies (`None`: the shim is off in it)."""
    return _scoped.set(OFF if setting is None else setting)


def pop_scope(token: contextvars.Token[Optional[ModeSetting]]) -> None:
    _scoped.reset(token)
