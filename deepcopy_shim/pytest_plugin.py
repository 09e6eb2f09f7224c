"""pytest plugin (entry point ``pytest11``): run a test session, or single tests, with the shim on.

Inert unless asked: with neither option nor ini key nor marker it changes nothing and never
imports torch (loading it imports the small ``deepcopy_shim`` package, as any entry point inside a
package does).

* ``--deepcopy-shim=MODE`` on the command line, or ``deepcopy_shim = MODE`` in the ini file (the
  command line wins): :func:`deepcopy_shim.enable` for the whole session and ``DEEPCOPY_SHIM=MODE``
  for the processes the tests start.  ``MODE`` takes the ``DEEPCOPY_SHIM`` vocabulary; an "off"
  value (``off``, ``0``...) switches off a shim that the environment had enabled.
* ``@pytest.mark.deepcopy_shim("strict")``: that test (its function-scoped fixtures included) runs
  inside :class:`deepcopy_shim.enabled`; without an argument the mode is ``warn``.
* The ``deepcopy_shim`` fixture does the same for the test that requests it (mode from its marker,
  else from ``indirect`` parametrization, else ``warn``) and returns the ``deepcopy_shim`` module.

The header line of the run says whether the shim is active for the session and in which mode.
"""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING, Any, Iterator, List, Optional

import pytest

if TYPE_CHECKING:
    from ._modes import Mode

__all__ = ["pytest_addoption", "pytest_configure", "pytest_unconfigure", "pytest_report_header"]

_OPTION_HELP = ("run the whole session with deepcopy-shim enabled in MODE: warn, strict or silent "
                "(also 1/true/on/yes for warn; 0/false/off/no for off, overriding DEEPCOPY_SHIM)")


class _Session:
    """What the option/ini asked for: the mode (None: off), where it came from, and the
    ``DEEPCOPY_SHIM`` value to restore at the end of the session."""

    def __init__(self, mode: Optional[Mode], source: str, previous_env: Optional[str]) -> None:
        self.mode = mode
        self.source = source
        self.previous_env = previous_env


# None when the session was not asked to change anything.
_SESSION_KEY = pytest.StashKey[Optional[_Session]]()


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("deepcopy_shim", "deepcopy-shim")
    group.addoption("--deepcopy-shim", dest="deepcopy_shim", metavar="MODE", default=None,
                    help=_OPTION_HELP)
    parser.addini("deepcopy_shim", help=_OPTION_HELP, type="string", default="")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "deepcopy_shim(mode='warn'): run this test with deepcopy-shim enabled in mode "
        "(warn, strict or silent)",
    )
    value: Optional[str] = config.getoption("deepcopy_shim")
    source = "--deepcopy-shim"
    if value is None:
        ini = str(config.getini("deepcopy_shim") or "")
        if not ini.strip():
            config.stash[_SESSION_KEY] = None
            return
        value, source = ini, "ini deepcopy_shim"
    from ._activation import disable, enable
    from ._bootstrap import ENV_VAR, parse_env_value, valid_values

    try:
        mode = parse_env_value(value)
    except ValueError:
        raise pytest.UsageError(
            f"deepcopy_shim: invalid {source} value {value!r}; valid values are {valid_values()}"
        ) from None
    session = _Session(mode, source, os.environ.get(ENV_VAR))
    config.stash[_SESSION_KEY] = session
    if mode is None:
        disable()
        os.environ.pop(ENV_VAR, None)
    else:
        enable(mode)
        # Child processes of the tests (spawn workers, subprocess) are activated by the .pth hook.
        os.environ[ENV_VAR] = mode.value


def pytest_unconfigure(config: pytest.Config) -> None:
    session = config.stash.get(_SESSION_KEY, None)
    if session is None:
        return
    from ._activation import disable
    from ._bootstrap import ENV_VAR

    if session.mode is not None:
        disable()
    if session.previous_env is None:
        os.environ.pop(ENV_VAR, None)
    else:
        os.environ[ENV_VAR] = session.previous_env


def pytest_report_header(config: pytest.Config) -> Optional[List[str]]:
    session = config.stash.get(_SESSION_KEY, None)
    if session is not None:
        if session.mode is None:
            return [f"deepcopy_shim: off (from {session.source})"]
        return [f"deepcopy_shim: active, mode={session.mode.value} (from {session.source})"]
    # Not asked through pytest; report an activation by DEEPCOPY_SHIM without importing anything.
    modes = sys.modules.get("deepcopy_shim._modes")
    mode = modes.global_mode() if modes is not None else None
    if mode is not None:
        return [f"deepcopy_shim: active, mode={mode.value} (from DEEPCOPY_SHIM)"]
    return None


def _requested_mode(request: pytest.FixtureRequest) -> Optional[str]:
    marker = request.node.get_closest_marker("deepcopy_shim")
    if marker is not None:
        if len(marker.args) + len(marker.kwargs) > 1 or set(marker.kwargs) - {"mode"}:
            raise pytest.UsageError(
                f"deepcopy_shim: the deepcopy_shim marker takes one mode, got {marker.args!r} "
                f"{marker.kwargs!r}; use @pytest.mark.deepcopy_shim('warn'|'strict'|'silent')")
        return str(marker.kwargs.get("mode", marker.args[0] if marker.args else "warn"))
    return None


def _scope(mode_name: str, where: str) -> Any:
    from ._activation import enabled

    try:
        return enabled(mode_name)
    except ValueError as exc:
        raise pytest.UsageError(f"{exc} (in {where})") from None


@pytest.fixture(autouse=True)
def _deepcopy_shim_marker(request: pytest.FixtureRequest) -> Iterator[None]:
    """Apply ``@pytest.mark.deepcopy_shim(mode)``; does nothing for unmarked tests."""
    mode_name = _requested_mode(request)
    if mode_name is None or "deepcopy_shim" in request.fixturenames:
        yield  # the deepcopy_shim fixture, if requested, opens the scope itself
        return
    with _scope(mode_name, f"the deepcopy_shim marker of {request.node.nodeid}"):
        yield


@pytest.fixture(name="deepcopy_shim")
def deepcopy_shim_fixture(request: pytest.FixtureRequest) -> Iterator[Any]:
    """Run the requesting test with the shim enabled; returns the ``deepcopy_shim`` module.

    The mode comes from the test's ``deepcopy_shim`` marker, else from indirect
    parametrization (``@pytest.mark.parametrize("deepcopy_shim", ["strict"], indirect=True)``),
    else ``warn``.  Only this test's thread/task is affected (:class:`deepcopy_shim.enabled`).
    """
    mode_name = _requested_mode(request)
    if mode_name is None:
        mode_name = str(getattr(request, "param", "warn"))
    import deepcopy_shim

    with _scope(mode_name, f"the deepcopy_shim fixture of {request.node.nodeid}"):
        yield deepcopy_shim
