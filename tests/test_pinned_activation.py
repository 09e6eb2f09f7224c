"""What the public switches do that mutation testing of `deepcopy_shim._activation` found
unpinned (issue 20): which frame a scope's copies count from (a scope started, a decorated
function or coroutine, an explicit `deepcopy_shim.deepcopy()`), wherever and however it is
called; what an entry that fails leaves of the patch; what decorating a coroutine function
keeps of it; and which methods decorating a `unittest.TestCase` subclass decorates.

Each test is a behaviour seen through `copy.deepcopy`, the scopes, `current_mode()` and the
warnings; the one that needs an entry to fail makes it fail where it can fail (the scope's
push, as a `KeyboardInterrupt` would) and then reads only what a user can see.
"""

from __future__ import annotations

import asyncio
import copy
import inspect
import textwrap
import unittest
import warnings
from typing import Any, List

import pytest
import torch
from support.lines import marked_line
from support.models import ORIGINAL_TENSOR_DEEPCOPY, CachedActivationsNet, cached_activations_net
from support.processes import DEV_PYTHON, describe, run_code, same_code_env

import deepcopy_shim
from deepcopy_shim import DetachedTensorsWarning, Mode, _modes, _patch

pytestmark = pytest.mark.filterwarnings("default::deepcopy_shim.DeepcopyShimWarning")

PATHS = CachedActivationsNet.PATHS


def mode_now() -> Any:
    setting = deepcopy_shim.current_mode()
    return None if setting is None else setting.mode


# --- a copy made in a scope entered inside another copy is a copy of its own ------------------


class StartsAScope:
    """Its `__deepcopy__` starts a warn scope with `start()` and copies its net in it; `seen`
    is how many `DetachedTensorsWarning`s had been emitted when that copy returned."""

    def __init__(self, net: CachedActivationsNet, caught: List[Any]) -> None:
        self.net, self.caught, self.seen = net, caught, -1

    def __deepcopy__(self, memo: Any) -> StartsAScope:
        scope = deepcopy_shim.enabled("warn")
        scope.start()
        try:
            net = copy.deepcopy(self.net)  # line: copy in a started scope
        finally:
            scope.stop()
        self.seen = len(self.caught)
        return StartsAScope(net, [])


def test_a_scope_started_inside_a_deepcopy_method_makes_a_copy_of_its_own() -> None:
    """The frame that calls `start()` is the scope's boundary: the copy made in it, inside an
    outer (native) copy, reports its own root and paths, as soon as it ends, at its own line."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        holder = StartsAScope(cached_activations_net(), [])
        holder.caught = caught
        copy.deepcopy(holder)
    found = [w for w in caught if isinstance(w.message, DetachedTensorsWarning)]
    assert len(found) == 1
    assert holder.seen == 1  # emitted when the inner copy ended, not after the outer one
    assert found[0].message.paths == PATHS
    assert "deep copy of a CachedActivationsNet detached 3 tensors" in str(found[0].message)
    assert (found[0].filename, found[0].lineno) == (
        __file__, marked_line(__file__, "copy in a started scope"))


def test_start_at_the_top_level_of_a_script() -> None:
    """`scope.start()` works in a frame with no caller (a script's top level, `python -c`)."""
    code = textwrap.dedent("""
        import deepcopy_shim
        scope = deepcopy_shim.enabled("strict")
        scope.start()
        print("in", deepcopy_shim.current_mode())
        scope.stop()
        print("out", deepcopy_shim.current_mode())
    """)
    proc = run_code(DEV_PYTHON, code, same_code_env())
    assert proc.returncode == 0, describe(proc)
    assert proc.stdout.splitlines() == [
        "in strict (from deepcopy_shim.enabled('strict'))", "out None"], describe(proc)


# --- decorated functions and explicit copies called with no Python caller ---------------------

# A class whose copy says which mode it was made in.  It needs no torch: the children below
# never import it (a scope or an explicit copy only counts a user of the deferred patch).
_PROBE = textwrap.dedent("""
    import atexit, copy
    import deepcopy_shim

    class Probe:
        def __deepcopy__(self, memo):
            print("copied in", deepcopy_shim.current_mode(), flush=True)
            return Probe()
""")


def test_a_decorated_function_runs_in_its_scope_as_a_callback_with_no_python_caller() -> None:
    """A decorated function called from C with no Python frame above it (an `atexit`
    handler, a `_thread` function) still runs in its scope."""
    code = _PROBE + textwrap.dedent("""
        @deepcopy_shim.enabled("silent")
        def at_exit():
            print("in", deepcopy_shim.current_mode(), flush=True)
            copy.deepcopy(Probe())

        atexit.register(at_exit)
    """)
    proc = run_code(DEV_PYTHON, code, same_code_env())
    assert proc.returncode == 0 and proc.stderr == "", describe(proc)
    assert proc.stdout.splitlines() == [
        "in silent (from deepcopy_shim.enabled('silent'))",
        "copied in silent (from deepcopy_shim.enabled('silent'))"], describe(proc)


def test_deepcopy_works_as_a_callback_with_no_python_caller() -> None:
    """`deepcopy_shim.deepcopy` called from C with no Python frame above it (here as an
    `atexit` handler) makes its copy in its mode."""
    code = _PROBE + textwrap.dedent("""
        atexit.register(deepcopy_shim.deepcopy, Probe(), "strict")
    """)
    proc = run_code(DEV_PYTHON, code, same_code_env())
    assert proc.returncode == 0 and proc.stderr == "", describe(proc)
    assert proc.stdout.splitlines() == [
        "copied in strict (from deepcopy_shim.deepcopy(obj, mode='strict'))"], describe(proc)


# --- a decorated coroutine ---------------------------------------------------------------------


@deepcopy_shim.enabled("warn")
async def copy_after_a_pause(net: CachedActivationsNet) -> CachedActivationsNet:
    """Copy `net` once the event loop has run something else."""
    await asyncio.sleep(0)
    return copy.deepcopy(net)  # line: copy in a decorated coroutine


class RunsALoop:
    """Its `__deepcopy__` copies its net with `asyncio.run(copy_after_a_pause(net))`; `seen`
    is how many `DetachedTensorsWarning`s had been emitted when that returned."""

    def __init__(self, net: CachedActivationsNet, caught: List[Any]) -> None:
        self.net, self.caught, self.seen = net, caught, -1

    def __deepcopy__(self, memo: Any) -> RunsALoop:
        net = asyncio.run(copy_after_a_pause(self.net))
        self.seen = len(self.caught)
        return RunsALoop(net, [])


def test_a_decorated_coroutine_copies_on_its_own_after_an_await_inside_another_copy() -> None:
    """The scope of a decorated coroutine counts from the coroutine's own frame, on the stack at
    every resumption: its copy after an `await`, in an event loop run inside an outer copy, is
    a copy of its own (its own root and paths, reported when it ends, at its own line)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        holder = RunsALoop(cached_activations_net(), [])
        holder.caught = caught
        copy.deepcopy(holder)
    found = [w for w in caught if isinstance(w.message, DetachedTensorsWarning)]
    assert len(found) == 1
    assert holder.seen == 1
    assert found[0].message.paths == PATHS
    assert "deep copy of a CachedActivationsNet detached 3 tensors" in str(found[0].message)
    assert (found[0].filename, found[0].lineno) == (
        __file__, marked_line(__file__, "copy in a decorated coroutine"))


def test_a_decorated_coroutine_function_keeps_its_name_doc_and_signature() -> None:
    """Decorating a coroutine function keeps what `functools.wraps` carries over."""

    async def fetch(url: str, retries: int = 3) -> str:
        """Fetch `url`."""
        return url

    decorated = deepcopy_shim.enabled("silent")(fetch)
    assert inspect.iscoroutinefunction(decorated)
    assert decorated.__name__ == "fetch"
    assert decorated.__qualname__ == fetch.__qualname__
    assert decorated.__doc__ == "Fetch `url`."
    assert decorated.__module__ == __name__
    assert decorated.__wrapped__ is fetch  # type: ignore[attr-defined]
    assert inspect.signature(decorated) == inspect.signature(fetch)
    assert asyncio.run(decorated("x")) == "x"


# --- an entry into a scope that fails leaves the patch as it was -------------------------------


class Interrupted(BaseException):
    """What a Ctrl-C (KeyboardInterrupt) landing inside the scope's entry would raise."""


@pytest.fixture
def entries_fail(monkeypatch: pytest.MonkeyPatch) -> None:
    """Entering a scope fails where it can: while the scope is pushed, after its user of the
    patch is counted."""
    def push_fails(*args: Any, **kwargs: Any) -> Any:
        raise Interrupted()
    monkeypatch.setattr(_modes, "push_scope", push_fails)


@pytest.mark.usefixtures("entries_fail")
def test_a_scope_whose_entry_fails_takes_its_patch_user_back() -> None:
    """An on scope whose entry fails is not entered and leaves no patch installed."""
    scope = deepcopy_shim.enabled("warn")
    with pytest.raises(Interrupted):
        scope.start()
    with pytest.raises(Interrupted):
        with scope:
            pass  # pragma: no cover - not entered
    assert mode_now() is None
    assert _patch.state() == "off"
    assert vars(torch.Tensor)["__deepcopy__"] is ORIGINAL_TENSOR_DEEPCOPY


@pytest.mark.usefixtures("entries_fail")
def test_an_off_scope_whose_entry_fails_leaves_the_global_mode_its_patch(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """An off scope whose entry fails takes nothing from `enable()`'s hold on the patch."""
    deepcopy_shim.enable("strict")
    with pytest.raises(Interrupted):
        deepcopy_shim.enabled("off").start()
    assert mode_now() is Mode.STRICT
    assert _patch.state() == "installed"
    monkeypatch.undo()  # scopes enter again: the refusal's survey enters one of its own
    with pytest.raises(deepcopy_shim.NonLeafTensorError):
        copy.deepcopy(cached_activations_net())
    deepcopy_shim.disable()
    assert _patch.state() == "off"


# --- decorating a unittest.TestCase subclass ---------------------------------------------------


def test_decorating_a_test_case_leaves_unittests_own_hooks_alone() -> None:
    """Only the hooks the class (or a base of the user's) defines are decorated: unittest's own
    empty `setUp`, `tearDown`, `setUpClass`, `tearDownClass`, `asyncSetUp` and
    `asyncTearDown` stay as they are, inherited, not copied into the class."""

    @deepcopy_shim.enabled("strict")
    class Plain(unittest.TestCase):
        def test_it(self) -> None:
            pass

    @deepcopy_shim.enabled("strict")
    class Async(unittest.IsolatedAsyncioTestCase):
        async def test_it(self) -> None:
            pass

    hooks = ("setUp", "tearDown", "setUpClass", "tearDownClass", "asyncSetUp", "asyncTearDown")
    for cls, base in ((Plain, unittest.TestCase), (Async, unittest.IsolatedAsyncioTestCase)):
        assert [name for name in hooks if name in vars(cls)] == [], cls
        for name in hooks:
            owner = next((k for k in base.__mro__ if name in vars(k)), None)
            if owner is not None:
                assert inspect.getattr_static(cls, name) is vars(owner)[name], (cls, name)
        assert vars(cls)["test_it"].__wrapped__.__name__ == "test_it"


@pytest.mark.parametrize("module", ["tests", "vision.tests", "utils_test", "zoo"])
def test_a_test_case_is_decorated_whatever_its_module_is_called(module: str) -> None:
    """A test case's own tests and hooks are decorated in a module of any name, also one that
    sorts after `unittest`."""
    seen: List[Any] = []

    class Copies(unittest.TestCase):
        def setUp(self) -> None:
            seen.append(mode_now())

        def test_mode(self) -> None:
            seen.append(mode_now())

    Copies.__module__ = module
    deepcopy_shim.enabled("silent")(Copies)
    result = unittest.TestResult()
    unittest.defaultTestLoader.loadTestsFromTestCase(Copies).run(result)
    assert result.wasSuccessful(), result.errors + result.failures
    assert seen == [Mode.SILENT, Mode.SILENT]


def test_decorating_a_test_case_leaves_its_other_test_named_attributes_alone() -> None:
    """A `test...` attribute that is no plain function (data, a generator method) is left as
    it is, and decorating the class does not fail on it."""
    inputs = [1, 2, 3]

    def test_generated(self: Any) -> Any:
        yield 1

    class Cases(unittest.TestCase):
        test_inputs = inputs
        test_limit = 3

        def test_it(self) -> None:
            pass

    Cases.test_generated = test_generated  # type: ignore[attr-defined]
    assert deepcopy_shim.enabled("warn")(Cases) is Cases
    assert vars(Cases)["test_inputs"] is inputs
    assert vars(Cases)["test_limit"] == 3
    assert vars(Cases)["test_generated"] is test_generated
    assert vars(Cases)["test_it"].__wrapped__.__name__ == "test_it"  # the test itself is decorated


def test_a_scope_made_for_a_door_says_how_that_door_wrote_it() -> None:
    """The pytest marker's scope: without `how`, the setting is written as the template filled
    with the mode as given; with it, as `how` says (the fixture's wording)."""
    from deepcopy_shim import Source, _activation

    with _activation.scope("strict", Source.PYTEST, "@pytest.mark.deepcopy_shim({!r})"):
        assert str(deepcopy_shim.current_mode()) == "strict (from @pytest.mark.deepcopy_shim('strict'))"
        assert deepcopy_shim.current_mode().spelled("silent") == (  # type: ignore[union-attr]
            "@pytest.mark.deepcopy_shim('silent')")
    with _activation.scope("silent", Source.PYTEST, "fixture {!r}", how="the deepcopy_shim fixture"):
        assert str(deepcopy_shim.current_mode()) == "silent (from the deepcopy_shim fixture)"


def test_the_fixture_says_which_mode_it_chose_and_why(deepcopy_shim: Any) -> None:
    """The `deepcopy_shim` fixture, unparametrized: mode warn, said to be its default."""
    assert str(deepcopy_shim.current_mode()) == (
        "warn (from the deepcopy_shim fixture's default mode 'warn')")


@pytest.mark.parametrize("deepcopy_shim", ["strict"], indirect=True)
def test_the_fixture_parametrized_says_its_parameter(deepcopy_shim: Any) -> None:
    assert str(deepcopy_shim.current_mode()) == (
        "strict (from the deepcopy_shim fixture's parameter 'strict' (indirect parametrization))")


@pytest.mark.parametrize(("mode", "error"), [("loud", "invalid mode 'loud'"), (3.5, "must be a str")])
def test_a_bad_mode_in_a_marker_or_fixture_is_a_usage_error_naming_where(mode: Any, error: str) -> None:
    from deepcopy_shim import pytest_plugin

    with pytest.raises(pytest.UsageError) as refused:
        pytest_plugin._scope(mode, "@pytest.mark.deepcopy_shim({!r})", "the marker of t.py::test")
    assert error in str(refused.value) and str(refused.value).endswith("(in the marker of t.py::test)")
