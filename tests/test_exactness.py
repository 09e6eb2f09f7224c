"""Exactly native in every grad mode, thread and task, and faithful to the last attribute
(issue 16): the install-time self-check, a plain tensor's __dict__, a __deepcopy__ found after
nn.Module in the MRO, one scope object shared by threads and tasks, decorated test classes, and
nested pytest sessions."""

from __future__ import annotations

import asyncio
import copy
import threading
import unittest
import warnings
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional

import pytest
import torch
import torch.nn as nn
from support.models import CachedActivationsNet, cached_activations_net, with_history
from support.processes import DEV_PYTHON, describe, run, run_code, same_code_env

import deepcopy_shim
from deepcopy_shim import Mode, _patch

# --- 1. the self-check gives the same answer in every grad mode and torch mode ----------------

SELF_CHECK = """
import copy, warnings, torch, deepcopy_shim
warnings.simplefilter("error")  # a TorchCompatibilityWarning would fail the child
{setup}
{enter}
    with deepcopy_shim.enabled("silent"):  # the first use of the shim in this process
        inside = deepcopy_shim.is_enabled()
{leave}
w = torch.ones(2, requires_grad=True, device="cpu", dtype=torch.float32)
with torch.enable_grad(), deepcopy_shim.enabled("silent"):
    made = copy.deepcopy(w * 2)
deepcopy_shim.disable()
deepcopy_shim.enable("strict")
print(inside, made.is_leaf and made.requires_grad, deepcopy_shim.is_enabled(),
      deepcopy_shim.current_mode().mode.value)
"""

_MODE_CLASSES = """
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
class Function(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))
class Dispatch(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))
"""

CALLER_STATES = {
    "no_grad": ("", "with torch.no_grad():", ""),
    "inference_mode": ("", "with torch.inference_mode():", ""),
    "default dtype float64 and device meta": (
        "torch.set_default_dtype(torch.float64)\n"
        "if hasattr(torch, 'set_default_device'):\n    torch.set_default_device('meta')",
        "if True:", "torch.set_default_dtype(torch.float32)\n"
        "if hasattr(torch, 'set_default_device'):\n    torch.set_default_device('cpu')"),
    "deterministic algorithms": ("torch.use_deterministic_algorithms(True)", "if True:", ""),
    "a torch function mode": (_MODE_CLASSES, "with Function():", ""),
    "a torch dispatch mode": (_MODE_CLASSES, "with Dispatch():", ""),
}


@pytest.mark.parametrize("state", sorted(CALLER_STATES))
def test_the_self_check_gives_the_same_answer_whatever_the_callers_torch_state(state: str) -> None:
    setup, enter, leave = CALLER_STATES[state]
    code = SELF_CHECK.replace("{setup}", setup).replace("{enter}", enter).replace("{leave}", leave)
    proc = run_code(DEV_PYTHON, code, same_code_env())
    assert proc.returncode == 0, describe(proc)
    assert proc.stdout.split() == ["True", "True", "True", "strict"], describe(proc)


def test_an_ema_update_decorated_with_no_grad_turns_the_shim_on_for_good() -> None:
    code = """
import copy, warnings, torch, deepcopy_shim
warnings.simplefilter("error")
@torch.no_grad()
def ema_update(model):
    with deepcopy_shim.enabled():  # the first use of the shim in this process
        return copy.deepcopy(model)
w = torch.ones(2, requires_grad=True)
ema_update({"w": w})
with torch.enable_grad():
    with deepcopy_shim.enabled("silent"):
        print(deepcopy_shim.is_enabled(), copy.deepcopy(w * 2).is_leaf)
"""
    proc = run_code(DEV_PYTHON, code, same_code_env())
    assert proc.returncode == 0, describe(proc)
    assert proc.stdout.split() == ["True", "True"]


# --- 2. a plain tensor with history keeps its __dict__ ---------------------------------------


def test_a_plain_tensor_with_history_keeps_its_instance_dict() -> None:
    shared = {"name": "shared"}
    x = with_history()
    x.tag = "kept"
    x.meta = shared
    with deepcopy_shim.enabled("silent"):
        made_x, made_shared = copy.deepcopy((x, shared))
    assert made_x.tag == "kept" and made_x.meta == shared
    assert made_x.meta is made_shared  # deep-copied through the memo, as torch does for leaves
    assert made_x.meta is not shared and "tag" in vars(x)  # the source keeps its own


def test_a_tensor_in_a_tensors_dict_is_found_and_named() -> None:
    x = with_history()
    x.aux = with_history()
    found = deepcopy_shim.find_nonleaf_tensors({"x": x})
    assert [p for p, _ in found] == ["['x']", "['x'].aux"] and found[1][1] is x.aux


# --- 3. a __deepcopy__ after nn.Module in the MRO is found as natively -----------------------


class CopiesByMixin:
    def __deepcopy__(self, memo: Dict[int, Any]) -> str:
        return "mixin copy"


class CallableCopier:
    def __call__(self, memo: Dict[int, Any]) -> str:
        return "callable copy"


class CallableMixin:
    __deepcopy__ = CallableCopier()  # not a descriptor: found as it is, called with the memo


class OptsOut:
    __deepcopy__ = None  # "use the reduction": native deepcopy then reduces the object


class WithMixin(nn.Linear, CopiesByMixin):
    pass


class WithCallable(nn.Linear, CallableMixin):
    pass


class OptingOut(nn.Linear, OptsOut, CopiesByMixin):
    pass


def _observed() -> Dict[str, Any]:
    out: Dict[str, Any] = {}
    for cls in (WithMixin, WithCallable, OptingOut, nn.Linear):
        made = copy.deepcopy(cls(2, 2))
        out[cls.__name__] = (hasattr(cls, "__deepcopy__"), made if isinstance(made, str) else type(made))
    return out


def test_mixins_after_nn_module_behave_as_without_the_shim() -> None:
    native = _observed()
    assert native == {"WithMixin": (True, "mixin copy"), "WithCallable": (True, "callable copy"),
                      "OptingOut": (True, OptingOut), "Linear": (False, nn.Linear)}
    with deepcopy_shim.enabled("silent"):
        assert _observed() == native
    deepcopy_shim.enable("warn")
    assert _observed() == native
    deepcopy_shim.disable()
    assert _observed() == native


def test_a_mixin_class_parametrized_while_installed_keeps_its_mixins_deepcopy() -> None:
    from torch.nn.utils import parametrize

    class Doubled(nn.Module):
        def forward(self, weight: torch.Tensor) -> torch.Tensor:
            return weight * 2

    deepcopy_shim.enable()
    layer = parametrize.register_parametrization(WithMixin(2, 2), "weight", Doubled())
    deepcopy_shim.disable()
    assert copy.deepcopy(layer) == "mixin copy"  # parametrize saw hasattr True, as natively


# --- 4. one scope object shared by threads and tasks -----------------------------------------

SHARED = deepcopy_shim.enabled("silent")


def test_one_scope_object_entered_by_two_threads_at_once() -> None:
    inside = threading.Barrier(2)
    errors: List[BaseException] = []

    def work() -> None:
        try:
            with SHARED:
                inside.wait(10)
                made = copy.deepcopy([with_history()])
                assert made[0].is_leaf
                inside.wait(10)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=work) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert _patch.state() == "off" and vars(torch.Tensor)["__deepcopy__"] is not None


def test_one_scope_object_entered_by_two_tasks_that_leave_out_of_order() -> None:
    async def task(delay: float, order: List[float]) -> Optional[Mode]:
        with SHARED:
            await asyncio.sleep(delay)
            copy.deepcopy([with_history()])
            order.append(delay)
            mode = deepcopy_shim.current_mode()
        return mode.mode if mode else None

    async def both() -> List[Any]:
        order: List[float] = []
        modes = await asyncio.gather(task(0.05, order), task(0.01, order))
        return [list(modes), order]

    modes, order = asyncio.run(both())
    assert modes == [Mode.SILENT, Mode.SILENT] and order == [0.01, 0.05]  # entered A, B; left B, A
    assert _patch.state() == "off"


def test_a_decorated_function_called_from_two_threads_at_once() -> None:
    inside = threading.Barrier(2)

    @deepcopy_shim.enabled("strict")
    def copy_it(obj: Any) -> Any:
        inside.wait(10)
        return copy.deepcopy(obj)

    with ThreadPoolExecutor(2) as pool:
        futures = [pool.submit(copy_it, [with_history()]) for _ in range(2)]
    assert all(isinstance(f.exception(), deepcopy_shim.NonLeafTensorError) for f in futures)
    assert _patch.state() == "off"


def test_many_scoped_copies_while_other_threads_enable_and_disable() -> None:
    stop = threading.Event()

    def churn() -> None:
        while not stop.is_set():
            deepcopy_shim.enable("strict")
            deepcopy_shim.disable()

    def scoped(n: int) -> bool:
        with deepcopy_shim.enabled("silent"):
            made = copy.deepcopy([with_history(), cached_activations_net(n % 3)])
        return bool(made[0].is_leaf)

    churners = [threading.Thread(target=churn) for _ in range(2)]
    for thread in churners:
        thread.start()
    try:
        with ThreadPoolExecutor(4) as pool:
            assert all(pool.map(scoped, range(60)))
    finally:
        stop.set()
        for thread in churners:
            thread.join()
    deepcopy_shim.disable()
    assert _patch.state() == "off"


def test_stop_in_a_thread_that_did_not_start_leaves_the_count_as_it_was() -> None:
    scope = deepcopy_shim.enabled("warn")
    scope.start()
    errors: List[BaseException] = []

    def stop_elsewhere() -> None:
        try:
            scope.stop()
        except RuntimeError as exc:
            errors.append(exc)

    thread = threading.Thread(target=stop_elsewhere)
    thread.start()
    thread.join()
    assert len(errors) == 1 and "without a matching start() in this thread or task" in str(errors[0])
    assert _patch.state() == "installed"  # this thread's scope still holds the patch
    scope.stop()
    assert _patch.state() == "off"


def test_scopes_left_out_of_order_in_one_thread_each_leave_their_own() -> None:
    outer, inner = deepcopy_shim.enabled("strict"), deepcopy_shim.enabled("silent")
    outer.start()
    inner.start()
    outer.stop()  # leaves the strict scope; the silent one entered after it stays in effect
    setting = deepcopy_shim.current_mode()
    assert setting is not None and setting.mode is Mode.SILENT
    inner.stop()
    assert deepcopy_shim.current_mode() is None and _patch.state() == "off"


# --- 5. decorating a class ---------------------------------------------------------------------


def test_a_decorated_test_case_runs_its_tests_and_hooks_in_the_scope() -> None:
    seen: List[Any] = []

    @deepcopy_shim.enabled("strict")
    class Copies(unittest.TestCase):
        @classmethod
        def setUpClass(cls) -> None:
            seen.append(("setUpClass", deepcopy_shim.current_mode()))

        def setUp(self) -> None:
            seen.append(("setUp", deepcopy_shim.current_mode()))

        def tearDown(self) -> None:
            seen.append(("tearDown", deepcopy_shim.current_mode()))

        def test_refuses(self) -> None:
            with self.assertRaises(deepcopy_shim.NonLeafTensorError):
                copy.deepcopy(with_history())
            seen.append(("test", deepcopy_shim.current_mode()))

        def helper(self) -> None:  # not a test: left alone
            seen.append(("helper", deepcopy_shim.current_mode()))

    result = unittest.TestResult()
    suite = unittest.defaultTestLoader.loadTestsFromTestCase(Copies)
    assert suite.countTestCases() == 1
    unittest.TestSuite([suite]).run(result)
    assert result.wasSuccessful(), result.errors + result.failures
    Copies("test_refuses").helper()
    names = [name for name, _ in seen]
    assert names == ["setUpClass", "setUp", "test", "tearDown", "helper"]
    assert all(m is not None and m.mode is Mode.STRICT for n, m in seen if n != "helper")
    assert seen[-1][1] is None
    assert _patch.state() == "off"


def test_an_async_test_case_is_decorated_too() -> None:
    seen: List[Any] = []

    @deepcopy_shim.enabled("silent")
    class AsyncCopies(unittest.IsolatedAsyncioTestCase):
        async def asyncSetUp(self) -> None:
            seen.append(deepcopy_shim.current_mode())

        async def test_copies(self) -> None:
            seen.append(deepcopy_shim.current_mode())
            assert copy.deepcopy(with_history()).is_leaf

    result = unittest.TestResult()
    unittest.defaultTestLoader.loadTestsFromTestCase(AsyncCopies).run(result)
    assert result.wasSuccessful(), result.errors + result.failures
    assert [m.mode for m in seen] == [Mode.SILENT, Mode.SILENT]


def test_decorating_a_class_that_is_not_a_test_case_is_refused() -> None:
    with pytest.raises(TypeError, match=r"unittest\.TestCase subclasses, not the class Plain"):
        @deepcopy_shim.enabled("warn")
        class Plain:
            pass


# --- 6. nested pytest sessions -----------------------------------------------------------------

NESTED_SESSION = '''
import deepcopy_shim

pytest_plugins = ["pytester"]


def test_a_nested_session_gives_the_outer_one_its_shim_back(pytester):
    before = deepcopy_shim.current_mode()
    pytester.makepyfile(test_inner="""
        import deepcopy_shim
        def test_inner():
            assert deepcopy_shim.current_mode().mode.value == "strict"
    """)
    result = pytester.runpytest_inprocess("--deepcopy-shim=strict", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)
    assert deepcopy_shim.current_mode() == before and before is not None
    print("OUTER", before)
'''


def test_a_nested_in_process_session_restores_the_outer_sessions_setting(tmp_path: Path) -> None:
    (tmp_path / "test_outer.py").write_text(NESTED_SESSION)
    proc = run([DEV_PYTHON, "-m", "pytest", "-p", "no:cacheprovider", "-s", "-q",
                "--deepcopy-shim=warn", "test_outer.py"], same_code_env(), cwd=tmp_path)
    assert proc.returncode == 0, describe(proc)
    assert "OUTER warn (from pytest --deepcopy-shim=warn)" in proc.stdout


def test_grad_modes_do_not_change_what_a_copy_reports(cached_net: CachedActivationsNet) -> None:
    results: Dict[str, Any] = {}
    modes: Dict[str, Callable[[], Any]] = {
        "enable_grad": torch.enable_grad, "no_grad": torch.no_grad, "inference_mode": torch.inference_mode,
    }
    for name, mode in modes.items():
        with mode(), warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            deepcopy_shim.deepcopy(cached_net, "warn")
        results[name] = [w.message.paths for w in caught]
    assert results["no_grad"] == results["enable_grad"] == results["inference_mode"]
    assert results["enable_grad"] == [CachedActivationsNet.PATHS]
