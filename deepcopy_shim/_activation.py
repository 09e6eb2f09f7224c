"""The public switches: enable/disable, the enabled() scope, and the one-off deepcopy()."""

from __future__ import annotations

import copy
import functools
from contextvars import Token
from types import TracebackType
from typing import Any, Callable, Dict, List, Optional, Type, TypeVar, Union

from . import _modes, _patch
from ._modes import Mode
from ._report import CopyReport

__all__ = ["enable", "disable", "is_enabled", "enabled", "deepcopy"]

_F = TypeVar("_F", bound=Callable[..., Any])
_T = TypeVar("_T")


def enable(mode: Union[Mode, str] = "warn") -> None:
    """Make every ``copy.deepcopy`` in the process use the shim, in ``mode``.

    Idempotent: a second call only changes the mode; the patch is never applied twice.  If torch
    is not imported yet, the patch is applied when it is (torch is not imported by this call).
    Raises ``ValueError`` for an unknown mode and ``RuntimeError`` if the patch cannot be
    installed; in both cases nothing changes.
    """
    new = Mode.parse(mode)
    with _patch.lock:
        if _modes.global_mode() is None:
            _patch.acquire()
        _modes.set_global_mode(new)


def disable() -> None:
    """Undo :func:`enable`. Safe to call when not enabled.

    Once no :class:`enabled` scope is active either, the patch is removed completely:
    ``torch.Tensor.__dict__["__deepcopy__"]`` is the original function object again and
    ``torch.nn.Module`` has exactly its original attributes.  Scopes still active in other
    threads keep their mode until they exit.
    """
    with _patch.lock:
        if _modes.global_mode() is not None:
            _modes.set_global_mode(None)
            _patch.release()


def is_enabled() -> bool:
    """True if a deep copy made now, in this thread or task, would use the shim.

    That is: after :func:`enable`, or inside an :class:`enabled` scope (even before torch is
    imported, when the patch is still waiting for ``import torch``).
    """
    return _modes.current_mode() is not None


class enabled:
    """Use the shim in ``mode`` for the current thread or async task only.

    One object, three uses (like ``time_machine.travel``)::

        with deepcopy_shim.enabled("strict"):
            copy.deepcopy(model)

        @deepcopy_shim.enabled("silent")
        def make_target(net): return copy.deepcopy(net)

        scope = deepcopy_shim.enabled(); scope.start(); ...; scope.stop()

    On exit the previous state is restored exactly; scopes nest, the innermost mode wins, and
    the global mode set by :func:`enable` is never touched.  Other threads are unaffected.
    Raises ``ValueError`` for an unknown mode (at construction) and ``RuntimeError`` from
    :meth:`stop` without a matching :meth:`start`.
    """

    def __init__(self, mode: Union[Mode, str] = "warn") -> None:
        self.mode = Mode.parse(mode)
        self._tokens: List[Token[Optional[Mode]]] = []

    def start(self) -> None:
        """Enter the scope (install the patch if this is its first user)."""
        _patch.acquire()
        self._tokens.append(_modes.push_scope(self.mode))

    def stop(self) -> None:
        """Leave the scope entered by the latest :meth:`start` (same thread or task)."""
        if not self._tokens:
            raise RuntimeError("deepcopy_shim.enabled.stop() called without a matching start()")
        _modes.pop_scope(self._tokens.pop())
        _patch.release()

    def __enter__(self) -> enabled:
        self.start()
        return self

    def __exit__(self, exc_type: Optional[Type[BaseException]], exc: Optional[BaseException],
                 tb: Optional[TracebackType]) -> None:
        self.stop()

    def __call__(self, func: _F) -> _F:
        """Decorate ``func`` (sync or async) so that each call runs in its own scope.

        Raises ``TypeError`` for generator functions: their body runs when iterated, outside
        any scope the call could set up, so decorating them would silently do nothing.
        """
        import inspect  # here, not at module level: it is a third of this package's import time

        if inspect.isgeneratorfunction(func) or inspect.isasyncgenfunction(func):
            raise TypeError(
                f"deepcopy_shim.enabled cannot decorate the generator function {func.__qualname__}: "
                "its body runs outside the call; use `with deepcopy_shim.enabled(...):` inside it."
            )
        mode = self.mode
        if inspect.iscoroutinefunction(func):
            @functools.wraps(func)
            async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
                with enabled(mode):
                    return await func(*args, **kwargs)
            return async_wrapper  # type: ignore[return-value]

        @functools.wraps(func)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            with enabled(mode):
                return func(*args, **kwargs)
        return wrapper  # type: ignore[return-value]

    def __repr__(self) -> str:
        return f"deepcopy_shim.enabled(mode={self.mode.value!r})"


enabled.__module__ = "deepcopy_shim"


def deepcopy(obj: _T, mode: Union[Mode, str] = "warn") -> _T:
    """Return ``copy.deepcopy(obj)`` made with the shim's semantics in ``mode``.

    Nothing is enabled globally: other threads keep their behaviour.  In mode ``strict`` the
    whole object is checked first and :class:`NonLeafTensorError` is raised before anything is
    copied; in mode ``warn`` one :class:`DeepcopyShimWarning` names every detached tensor.
    ``obj`` is never modified.  Raises ``ValueError`` for an unknown mode.
    """
    chosen = Mode.parse(mode)
    report = CopyReport(obj)
    if chosen is Mode.STRICT:
        report.check_strict()
    memo: Dict[Any, Any] = {}
    report.attach(memo)
    with enabled(chosen):
        return copy.deepcopy(obj, memo)
