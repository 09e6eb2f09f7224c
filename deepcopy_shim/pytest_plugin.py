"""pytest plugin (entry point `pytest11`): run a test session, or single tests, with the shim on.

Inert unless asked: with neither option nor ini key nor marker it changes nothing, never imports
torch, and adds nothing to any test (loading it imports the small `deepcopy_shim` package, as
any entry point inside a package does).

* `--deepcopy-shim=MODE` on the command line, or `deepcopy_shim = MODE` in the ini file (the
  command line wins): the shim is enabled for the whole session, and `DEEPCOPY_SHIM=MODE` is
  set for the processes the tests start.  `MODE` takes the vocabulary of every door; an off
  word (`off`, `0`...) switches off a shim that the environment had enabled.
* `@pytest.mark.deepcopy_shim("strict")`: that test (its function-scoped fixtures included) runs
  inside `deepcopy_shim.enabled`; without an argument the mode is `warn`.  The marker is
  applied at collection, to marked tests only: unmarked tests pay nothing.
* The `deepcopy_shim` fixture does the same for the test that requests it (mode from its marker,
  else from `indirect` parametrization, else the session's mode from the option or ini, else
  `warn`) and returns the `deepcopy_shim` module.

The header line of the run says whether the shim is active for the session and in which mode.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, Iterator, List, Optional

import pytest

if TYPE_CHECKING:
    from ._modes import ModeSetting

__all__ = [
    "pytest_addoption",
    "pytest_collection_modifyitems",
    "pytest_configure",
    "pytest_report_header",
    "pytest_unconfigure",
]

def _option_help() -> str:
    from ._modes import on_and_off_words

    on, off = on_and_off_words()
    return ("run the whole session with deepcopy-shim enabled in MODE: warn, strict or silent "
            f"(also {on} for warn; {off} for off, overriding DEEPCOPY_SHIM)")
_MARKER = "deepcopy_shim"
_MARKER_FIXTURE = "_deepcopy_shim_marker"


class _Session:
    """What the option/ini asked for (the setting; None: off), and what to restore at the end
    of the session: the global setting and the `DEEPCOPY_SHIM` value in effect before it (a
    session run inside another one, as `pytester.runpytest_inprocess` runs them, gives the
    outer session back its own)."""

    def __init__(self, setting: Optional[ModeSetting], previous: Optional[ModeSetting],
                 previous_env: Optional[str], off_by: str = "") -> None:
        self.setting = setting
        self.off_by = off_by  # what said off, as written (`--deepcopy-shim=off`), if it did
        self.previous = previous
        self.previous_env = previous_env


# None when the session was not asked to change anything.
_SESSION_KEY = pytest.StashKey[Optional[_Session]]()


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("deepcopy_shim", "deepcopy-shim")
    help_text = _option_help()
    group.addoption("--deepcopy-shim", dest="deepcopy_shim", metavar="MODE", default=None,
                    help=help_text)
    parser.addini("deepcopy_shim", help=help_text, type="string", default="")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        f"{_MARKER}(mode='warn'): run this test with deepcopy-shim enabled in mode "
        "(warn, strict or silent)",
    )
    value: Optional[str] = config.getoption("deepcopy_shim")
    how, what = "pytest --deepcopy-shim={}", "--deepcopy-shim value"
    if value is None:
        ini = str(config.getini("deepcopy_shim") or "")
        if not ini.strip():
            config.stash[_SESSION_KEY] = None
            return
        value, how, what = ini, "`deepcopy_shim = {}` in the pytest ini file", "ini value deepcopy_shim ="
    from ._activation import set_global
    from ._bootstrap import ENV_VAR
    from ._modes import ModeSetting, ModeValueError, Source, global_setting, parse_mode

    try:
        mode = parse_mode(value, what)
    except ModeValueError as exc:
        raise pytest.UsageError(str(exc)) from None
    setting = None if mode is None else ModeSetting(mode, Source.PYTEST, how.format(value.strip()), how)
    config.stash[_SESSION_KEY] = _Session(setting, global_setting(), os.environ.get(ENV_VAR),
                                          how.format(value.strip()))
    set_global(setting)
    # Child processes of the tests (spawn workers, subprocess) are activated by the .pth hook.
    os.environ[ENV_VAR] = mode.value if mode is not None else "off"


def pytest_unconfigure(config: pytest.Config) -> None:
    session = config.stash.get(_SESSION_KEY, None)
    if session is None:
        return
    from ._activation import set_global
    from ._bootstrap import ENV_VAR

    set_global(session.previous)
    if session.previous_env is None:
        os.environ.pop(ENV_VAR, None)
    else:
        os.environ[ENV_VAR] = session.previous_env


def pytest_report_header(config: pytest.Config) -> Optional[List[str]]:
    session = config.stash.get(_SESSION_KEY, None)
    if session is not None:
        if session.setting is None:
            return [f"deepcopy_shim: off (from {session.off_by})"]
        return [f"deepcopy_shim: active, mode {session.setting}"]
    # Not asked through pytest; report an activation by DEEPCOPY_SHIM.
    from ._activation import current_mode

    setting = current_mode()
    return [f"deepcopy_shim: active, mode {setting}"] if setting is not None else None


def pytest_collection_modifyitems(items: List[pytest.Item]) -> None:
    # Only marked tests get the fixture that opens their scope (time-machine's pattern): an
    # autouse fixture would run for every test of every project that has this package.
    for item in items:
        if item.get_closest_marker(_MARKER) is None:
            continue
        # A bad marker is the command's mistake, as a bad --deepcopy-shim value is: one usage
        # line naming the test, now, rather than an error with the plugin's code at set-up.
        _marker_scope(item)
        names = getattr(item, "fixturenames", None)
        if isinstance(names, list) and _MARKER not in names and _MARKER_FIXTURE not in names:
            names.insert(0, _MARKER_FIXTURE)


def _marker_mode(node: Any) -> Optional[str]:
    marker = node.get_closest_marker(_MARKER)
    if marker is None:
        return None
    if len(marker.args) + len(marker.kwargs) > 1 or set(marker.kwargs) - {"mode"}:
        raise pytest.UsageError(
            f"deepcopy_shim: the deepcopy_shim marker of {node.nodeid} takes one mode, got "
            f"{marker.args!r} {marker.kwargs!r}; use @pytest.mark.deepcopy_shim('warn'|'strict'|'silent')")
    return str(marker.kwargs.get("mode", marker.args[0] if marker.args else "warn"))


def _scope(mode_name: str, template: str, where: str, how: Optional[str] = None) -> Any:
    from ._activation import scope
    from ._modes import Source

    try:
        return scope(mode_name, Source.PYTEST, template, how)
    except (ValueError, TypeError) as exc:
        raise pytest.UsageError(f"{exc} (in {where})") from None


def _marker_scope(node: Any) -> Any:
    """The scope `node`'s deepcopy_shim marker asks for (None: no marker).

    Raises `pytest.UsageError` naming the test and the marker for a marker pytest cannot apply.
    """
    mode_name = _marker_mode(node)
    if mode_name is None:
        return None
    return _scope(mode_name, "@pytest.mark.deepcopy_shim({!r})",
                  f"the deepcopy_shim marker of {node.nodeid}")


@pytest.fixture(name=_MARKER_FIXTURE)
def _deepcopy_shim_marker(request: pytest.FixtureRequest) -> Iterator[None]:
    """Apply `@pytest.mark.deepcopy_shim(mode)` (added to marked tests at collection)."""
    scope = _marker_scope(request.node)
    if scope is None:  # pragma: no cover - only marked tests request this fixture
        yield
        return
    with scope:
        yield


@pytest.fixture(name="deepcopy_shim")
def deepcopy_shim_fixture(request: pytest.FixtureRequest) -> Iterator[Any]:
    """Run the requesting test with the shim enabled; returns the `deepcopy_shim` module.

    The mode comes from the test's `deepcopy_shim` marker, else from indirect
    parametrization (`@pytest.mark.parametrize("deepcopy_shim", ["strict"], indirect=True)`),
    else from the session (`--deepcopy-shim=MODE` or the ini key, when it names a mode), else
    `warn`.  Only this test's thread/task is affected (`deepcopy_shim.enabled`).
    """
    scope = _marker_scope(request.node)
    if scope is None:
        # Another mode is chosen with the marker, whatever chose this one: messages say so.
        param = getattr(request, "param", None)
        session = request.config.stash.get(_SESSION_KEY, None)
        session_setting = session.setting if session is not None else None
        if param is not None:
            mode_name = str(param)
            how = f"the deepcopy_shim fixture's parameter {mode_name!r} (indirect parametrization)"
        elif session_setting is not None:  # the mode the session was started with
            mode_name = session_setting.mode.value
            how = f"the deepcopy_shim fixture, in the session's mode ({session_setting.how})"
        else:
            mode_name, how = "warn", "the deepcopy_shim fixture's default mode 'warn'"
        try:
            scope = _scope(mode_name, "@pytest.mark.deepcopy_shim({!r})",
                           f"the deepcopy_shim fixture of {request.node.nodeid}", how)
        except pytest.UsageError as exc:  # that test's own parameter: that test fails, in words
            raise pytest.fail.Exception(str(exc), pytrace=False) from None
    import deepcopy_shim

    with scope:
        yield deepcopy_shim
