"""The public switches: enable/disable, the enabled() scope, the one-off deepcopy(), and the
questions a user asks of them (is_enabled, current_mode, find_nonleaf_tensors)."""

from __future__ import annotations

import copy
import functools
from contextvars import Token
from types import TracebackType
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Tuple, Type, TypeVar, Union

from . import _modes, _patch
from ._modes import Mode, ModeSetting, Source
from ._warnings import NonLeafTensorError

if TYPE_CHECKING:
    import torch

__all__ = [
    "current_mode",
    "deepcopy",
    "disable",
    "enable",
    "enabled",
    "find_nonleaf_tensors",
    "is_enabled",
    "scope",
    "set_global",
]

_F = TypeVar("_F", bound=Callable[..., Any])
_T = TypeVar("_T")
ModeLike = Union[Mode, str, bool]


def enable(mode: ModeLike = "warn") -> None:
    """Make every `copy.deepcopy` in the process use the shim, in `mode`.

    `mode` takes the vocabulary of every door: `"warn"`, `"strict"` or `"silent"` (a
    `Mode` or its name, any case); `True`, `"on"`, `"1"`, `"true"` or `"yes"` mean
    `warn`; `False`, `"off"`, `"0"`, `"false"` or `"no"` mean `disable()`.

    Idempotent: a second call only changes the mode; the patch is never applied twice.  If torch
    is not imported yet, the patch is applied when it is (this call does not import torch).

    Raises:
        ValueError: `mode` is not in the vocabulary; nothing changes.
        RuntimeError: the patch cannot be installed (another patch owns
            `nn.Module.__deepcopy__`); nothing changes.
    """
    setting = _modes.parse_mode(mode)
    if setting is None:
        disable()
        return
    set_global(ModeSetting(setting, Source.CODE, "deepcopy_shim.enable({!r})"))


def set_global(setting: Optional[ModeSetting]) -> None:
    """Make `setting` the process-wide one (`None`: off), counting the patch's user first.

    The door behind `enable()`/`disable()`, the environment variable, the runner and
    the pytest option, each passing its own `Source`.  No lock is held while the patch
    is acquired or released (see `_patch`).
    """
    if setting is None:
        if _modes.swap_global(None) is not None:
            _patch.release()
        return
    _patch.acquire()  # the user is counted before the setting is visible, and undone on failure
    if _modes.swap_global(setting) is not None:
        _patch.release()  # it was enabled already: that earlier enable holds the patch


def disable() -> None:
    """Undo `enable()` (and start-up activation). Safe to call when not enabled.

    Once no `enabled` scope is active either, the patch is removed completely:
    `torch.Tensor.__dict__["__deepcopy__"]` is the original function object again and
    `torch.nn.Module` has exactly its original attributes.  Scopes still active in other
    threads keep their mode until they exit.
    """
    set_global(None)


def is_enabled() -> bool:
    """True if a deep copy made now, in this thread or task, would use the shim.

    That is: after `enable()`, or inside an `enabled` scope (even before torch is
    imported, when the patch is still waiting for `import torch`).  `current_mode()` also
    says which mode and where it was set.
    """
    return _modes.current_setting() is not None


def current_mode() -> Optional[ModeSetting]:
    """The mode in effect for a copy made now in this thread or task, and where it was set.

    Returns `None` when copies behave natively, else a `ModeSetting`:
    `mode` (a `Mode`), `source` (a `Source`: code, scope, environment,
    runner or pytest) and `how`, the setting as written; `str()` of it reads
    `"strict (from DEEPCOPY_SHIM=strict)"`.
    """
    return _modes.current_setting()


class enabled:
    """Use the shim in `mode` for the current thread or async task only.

    One object, three uses (like `time_machine.travel`):

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
    Other threads are unaffected.

    Raises:
        ValueError: `mode` is not in the vocabulary (at construction).
        RuntimeError: `stop()` without a matching `start()`.
    """

    def __init__(self, mode: ModeLike = "warn") -> None:
        self._init(mode, Source.SCOPE, "deepcopy_shim.enabled({!r})")

    def _init(self, mode: ModeLike, source: Source, how: str) -> None:
        parsed = _modes.parse_mode(mode)
        self.mode: Optional[Mode] = parsed
        self._setting = None if parsed is None else ModeSetting(parsed, source, how)
        self._tokens: List[Token[Optional[ModeSetting]]] = []

    def start(self) -> None:
        """Enter the scope (installing the patch if this is its first user)."""
        if self._setting is not None:
            _patch.acquire()
        self._tokens.append(_modes.push_scope(self._setting))

    def stop(self) -> None:
        """Leave the scope entered by the latest `start()` (same thread or task)."""
        if not self._tokens:
            raise RuntimeError("deepcopy_shim.enabled.stop() called without a matching start()")
        _modes.pop_scope(self._tokens.pop())
        if self._setting is not None:
            _patch.release()

    def __enter__(self) -> enabled:
        self.start()
        return self

    def __exit__(self, exc_type: Optional[Type[BaseException]], exc: Optional[BaseException],
                 tb: Optional[TracebackType]) -> None:
        self.stop()

    def __call__(self, func: _F) -> _F:
        """Decorate `func` (sync or async) so that each call runs in its own scope.

        Raises:
            TypeError: `func` is a generator function: its body runs when iterated, outside
                any scope the call could set up, so decorating it would silently do nothing.
        """
        import inspect  # here, not at module level: it is a third of this package's import time

        if inspect.isgeneratorfunction(func) or inspect.isasyncgenfunction(func):
            raise TypeError(
                f"deepcopy_shim.enabled cannot decorate the generator function {func.__qualname__}: "
                "its body runs outside the call; use `with deepcopy_shim.enabled(...):` inside it."
            )
        scope = self
        if inspect.iscoroutinefunction(func):
            @functools.wraps(func)
            async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
                with scope._fresh():
                    return await func(*args, **kwargs)
            return async_wrapper  # type: ignore[return-value]

        @functools.wraps(func)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            with scope._fresh():
                return func(*args, **kwargs)
        return wrapper  # type: ignore[return-value]

    def _fresh(self) -> enabled:
        # Each call gets a scope of its own: concurrent calls must not share one token stack.
        fresh = copy.copy(self)
        fresh._tokens = []
        return fresh

    def __repr__(self) -> str:
        return f"deepcopy_shim.enabled(mode={self.mode.value if self.mode else 'off'!r})"


enabled.__module__ = "deepcopy_shim"


def scope(mode: ModeLike, source: Source, how: str) -> enabled:
    """An `enabled` scope whose setting says it came from `source`, written `how`
    (the pytest marker and fixture, the one-off `deepcopy()`)."""
    made = enabled.__new__(enabled)
    made._init(mode, source, how)
    return made


def deepcopy(obj: _T, mode: ModeLike = "warn") -> _T:
    """Return `copy.deepcopy(obj)` made with the shim's semantics in `mode`.

    Nothing is enabled globally: other threads keep their behaviour.  Mode `warn` emits one
    `DetachedTensorsWarning` when the copy is complete, naming every tensor it detached;
    mode `strict` raises `NonLeafTensorError` naming every tensor the copy met that it would
    have to detach (the copy is discarded); an off word makes a native copy.  `obj` is never
    modified.

    Raises:
        ValueError: `mode` is not in the vocabulary.
        NonLeafTensorError: mode `strict` and the copy met tensors with autograd history.
    """
    with scope(mode, Source.SCOPE, "deepcopy_shim.deepcopy(obj, mode={!r})"):
        memo: Dict[Any, Any] = {}
        return copy.deepcopy(obj, memo)


def find_nonleaf_tensors(obj: Any) -> List[Tuple[str, torch.Tensor]]:
    """Every tensor with autograd history that deep-copying `obj` would detach.

    Returns `(path, tensor)` pairs in the order the copy meets them, with the paths that
    mode `warn` reports; `[]` if there are none (and when torch is not imported).

    The answer comes from the copy itself, so it follows `copy.deepcopy`'s protocol exactly:
    tensors that a custom `__deepcopy__` or reduction leaves out are not listed.  That is
    also its cost: `obj` is deep-copied once (as `deepcopy(obj, "strict")` does) and the
    copy is discarded; `obj` is not modified.

    Raises:
        Exception: whatever else the copy of `obj` raises (an object that cannot be copied).
    """
    import sys

    if "torch" not in sys.modules:
        return []
    try:
        deepcopy(obj, Mode.STRICT)
    except NonLeafTensorError as refusal:
        return list(zip(refusal.paths, refusal.tensors))
    return []
