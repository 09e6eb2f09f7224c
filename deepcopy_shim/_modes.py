"""Modes and where the current one comes from.

The global mode is set by :func:`deepcopy_shim.enable`; :class:`deepcopy_shim.enabled` and
:func:`deepcopy_shim.deepcopy` override it for the current thread or async task only, through a
context variable.  Nothing here imports torch.
"""

from __future__ import annotations

import contextvars
import enum
from typing import Optional, Union

__all__ = ["Mode", "current_mode", "global_mode", "set_global_mode", "push_scope", "pop_scope"]


class Mode(str, enum.Enum):
    """What a deep copy does when it meets a tensor with autograd history (a non-leaf tensor).

    ``WARN``: copy it as a detached leaf and emit one :class:`DeepcopyShimWarning` per top-level
    copy naming every such tensor.  ``STRICT``: refuse with :class:`NonLeafTensorError`.
    ``SILENT``: copy it as a detached leaf without a word.

    A mode is also a ``str`` (``Mode.WARN == "warn"``), so either form is accepted everywhere.
    """

    WARN = "warn"
    STRICT = "strict"
    SILENT = "silent"

    @classmethod
    def parse(cls, value: Union[Mode, str]) -> Mode:
        """Return the mode named by ``value`` (a :class:`Mode` or its name, any case).

        Raises ``ValueError`` naming the bad value and the valid ones; nothing else happens.
        """
        if isinstance(value, cls):
            return value
        if isinstance(value, str):
            try:
                return cls(value.strip().lower())
            except ValueError:
                pass
        valid = ", ".join(repr(m.value) for m in cls)
        raise ValueError(f"deepcopy_shim: invalid mode {value!r}; valid modes are {valid}")

    def __str__(self) -> str:
        return self.value


Mode.__module__ = "deepcopy_shim"

_global: Optional[Mode] = None
# A context variable, not a thread-local: it follows asyncio tasks as well as threads, and a new
# thread starts outside every scope, which is the isolation `enabled()` promises.
_scoped: contextvars.ContextVar[Optional[Mode]] = contextvars.ContextVar(
    "deepcopy_shim_mode", default=None
)


def current_mode() -> Optional[Mode]:
    """The mode that applies to a copy made now in this thread/task, or None for native behaviour."""
    scoped = _scoped.get()
    return _global if scoped is None else scoped


def global_mode() -> Optional[Mode]:
    return _global


def set_global_mode(mode: Optional[Mode]) -> None:
    global _global
    _global = mode


def push_scope(mode: Mode) -> contextvars.Token[Optional[Mode]]:
    return _scoped.set(mode)


def pop_scope(token: contextvars.Token[Optional[Mode]]) -> None:
    _scoped.reset(token)
