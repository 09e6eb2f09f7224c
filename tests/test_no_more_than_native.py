"""No more than native (issue 26): exactly native where no mode applies, and no call native would
not make where one does.

Native is torch without the shim; for tensors with history the *detaching oracle* is native
deepcopy after each such tensor ``t`` is replaced by ``t.detach().clone().requires_grad_(...)``.
Each test is one property, shown to fail on the code before the change that made it hold.
"""

from __future__ import annotations

import collections
import copy
import dataclasses
import functools
import gc
import os
import subprocess
import sys
import textwrap
import threading
import warnings
import weakref
from typing import Any, Callable, ClassVar, Dict, List, Optional, Tuple

import pytest
import torch
import torch.nn as nn
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.models import ORIGINAL_DISPATCH, resolve, with_history
from support.processes import REPO, in_a_thread

import deepcopy_shim
from deepcopy_shim import DetachedTensorsWarning, NonLeafTensorError
from deepcopy_shim._record import surveying

pytestmark = pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors:UserWarning")


def warn_paths(obj: Any, memo: Optional[Dict[Any, Any]] = None) -> List[str]:
    """The paths one copy in mode warn detaches (every warning it emits, in order)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with deepcopy_shim.enabled("warn"):
            copy.deepcopy(obj, memo)
    return [p for w in caught if isinstance(w.message, DetachedTensorsWarning) for p in w.message.paths]


def strict_refusal(obj: Any, memo: Optional[Dict[Any, Any]] = None) -> NonLeafTensorError:
    with deepcopy_shim.enabled("strict"), pytest.raises(NonLeafTensorError) as info:
        copy.deepcopy(obj, memo)
    return info.value


def found(obj: Any) -> List[str]:
    return [path for path, _ in deepcopy_shim.find_nonleaf_tensors(obj)]


def incomplete(error: BaseException) -> bool:
    return "may be incomplete" in " ".join(str(error).split())


# --- 1. strict never re-enters the code it refused --------------------------------------------


class LockedFallback:
    """Copies its cached tensor under its own (non-reentrant) lock; on torch's refusal it logs
    `str(exc)` and copies itself without the cache, as a library's fallback does."""

    copies = 0
    reraises = False  # after logging: let the refusal through instead of falling back

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.cache = with_history()
        self.log: List[str] = []

    def __deepcopy__(self, memo: Dict[int, Any]) -> LockedFallback:
        type(self).copies += 1
        new = type(self).__new__(type(self))
        new.lock, new.log = threading.Lock(), []
        with self.lock:
            try:
                new.cache = copy.deepcopy(self.cache, memo)
            except RuntimeError as exc:
                self.log.append(str(exc))
                if self.reraises:
                    raise
                new.cache = None
        return new


def test_a_refusal_read_inside_a_locked_fallback_completes_the_copy_as_natively() -> None:
    held = LockedFallback()
    LockedFallback.copies = 0

    def strict_copy() -> Any:
        with deepcopy_shim.enabled("strict"):
            return copy.deepcopy({"held": held, "other": with_history()}["held"])

    made = in_a_thread(strict_copy)
    assert made.cache is None and LockedFallback.copies == 1  # as native: one call, and a copy
    (logged,) = held.log
    assert "graph leaves" in logged  # torch's words stay on its last line
    assert "may be incomplete" in " ".join(logged.split())
    assert "find_nonleaf_tensors" in logged  # how to get the rest


class ReRaises(LockedFallback):
    """Logs the refusal inside the copy, then lets it through."""

    reraises = True


def test_a_refusal_read_inside_the_copy_and_again_after_it_names_everything_after() -> None:
    held = ReRaises()
    root = {"held": held, "other": with_history()}
    error = in_a_thread(lambda: strict_refusal(root))
    assert incomplete(held.log[0])
    # Outside every copy the survey may run: the full list, both tensors.
    assert error.paths == ("['held'].cache", "['other']")
    assert not incomplete(error)


def test_reading_a_refusal_inside_any_copy_calls_no_copy_method() -> None:
    """A strict copy made and read inside another copy's __deepcopy__ (a fresh explicit copy)."""
    inner_root = LockedFallback()
    seen: List[str] = []

    class Outer:
        def __deepcopy__(self, memo: Dict[int, Any]) -> Outer:
            try:
                deepcopy_shim.deepcopy({"x": inner_root, "t": with_history()}, "strict")
            except NonLeafTensorError as exc:
                seen.append(str(exc))
                seen.extend(exc.paths)
            return Outer()

    LockedFallback.copies = 0
    in_a_thread(lambda: copy.deepcopy(Outer()))
    assert LockedFallback.copies == 1  # the inner copy's one call; no survey inside Outer's copy
    assert "may be incomplete" in " ".join(seen[0].split())
    assert "['t']" in seen[1:]


# --- 2. invisible where no mode applies --------------------------------------------------------


class Cooperative(nn.Module):
    """A mixin pattern: delegate to super().__deepcopy__ when there is one."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(2, 2)

    def __deepcopy__(self, memo: Dict[int, Any]) -> Any:
        parent = getattr(super(), "__deepcopy__", None)
        if parent is not None:
            return parent(memo)
        new = type(self).__new__(type(self))
        memo[id(self)] = new
        new.__dict__.update(copy.deepcopy(self.__dict__, memo))
        new.took = "own"
        return new


def _lookups(module: nn.Module) -> Tuple[bool, Any, Any]:
    """What a module answers: hasattr, getattr with a default, and the same through super()."""
    def unbound(found: Any) -> Any:  # a bound method compares its instance too: the function
        return getattr(found, "__func__", found)

    return (hasattr(module, "__deepcopy__"), unbound(getattr(module, "__deepcopy__", None)),
            unbound(getattr(super(type(module), module), "__deepcopy__", None)))


def test_no_mode_here_lookups_on_a_module_answer_as_natively() -> None:
    native = _lookups(nn.Linear(2, 2)), _lookups(Cooperative())
    deepcopy_shim.enable("warn")
    with deepcopy_shim.enabled("off"):
        assert (_lookups(nn.Linear(2, 2)), _lookups(Cooperative())) == native
        assert copy.deepcopy(Cooperative()).took == "own"
    deepcopy_shim.disable()
    # Another thread's scope holds the patch; this thread has no mode.
    entered, leave = threading.Event(), threading.Event()

    def holder() -> None:
        with deepcopy_shim.enabled("silent"):
            entered.set()
            leave.wait(10)

    thread = threading.Thread(target=holder)
    thread.start()
    entered.wait(10)
    try:
        assert copy._deepcopy_dispatch is not ORIGINAL_DISPATCH  # the patch is installed
        assert (_lookups(nn.Linear(2, 2)), _lookups(Cooperative())) == native
    finally:
        leave.set()
        thread.join()


def _share_parameters_copy(obj: Any, memo: Dict[int, Any]) -> Any:
    """A copier that follows deepcopy's protocol with its own tensor handling (the shape of
    torch.distributed.checkpoint's StateDictStager): tensors are shared, not copied."""
    if id(obj) in memo:
        return memo[id(obj)]
    if isinstance(obj, torch.Tensor):
        return obj
    copier = getattr(obj, "__deepcopy__", None)
    if copier is not None:
        return copier(memo)
    if isinstance(obj, dict):
        new: Any = type(obj)()
        memo[id(obj)] = new
        for key, value in obj.items():
            new[key] = _share_parameters_copy(value, memo)
        return new
    if isinstance(obj, (list, tuple, str, int, float, bool, type(None))) or callable(obj):
        return obj
    rv = obj.__reduce_ex__(4)
    new = rv[0](*rv[1])
    memo[id(obj)] = new
    new.__setstate__(_share_parameters_copy(rv[2], memo))
    return new


def test_no_mode_here_a_protocol_following_copier_gets_natives_result() -> None:
    model = nn.Sequential(nn.Linear(2, 2))
    native = _share_parameters_copy(model, {})
    assert native[0].weight is model[0].weight
    deepcopy_shim.enable("warn")
    with deepcopy_shim.enabled("off"):
        shimmed = _share_parameters_copy(model, {})
    assert shimmed[0].weight is model[0].weight


def _chain(depth: int) -> nn.Module:
    root = node = nn.Module()
    for _ in range(depth):
        child = nn.Module()
        node.add_module("c", child)
        node = child
    return root


def _deepest_copy() -> int:
    low, high = 1, 2000
    while low < high:
        middle = (low + high + 1) // 2
        try:
            copy.deepcopy(_chain(middle))
            low = middle
        except RecursionError:
            high = middle - 1
    return low


def test_no_mode_here_copies_recurse_as_deep_as_natively() -> None:
    native = _deepest_copy()
    deepcopy_shim.enable("warn")
    with deepcopy_shim.enabled("off"):
        assert _deepest_copy() == native


def test_no_mode_here_a_tensor_binds_torchs_own_function() -> None:
    t = torch.ones(2)
    native = t.__deepcopy__
    deepcopy_shim.enable("warn")
    with deepcopy_shim.enabled("off"):
        bound = t.__deepcopy__
    assert bound.__func__ is native.__func__


# --- 3. linear in copies sharing a memo ---------------------------------------------------------


class HoldsOne:
    def __init__(self) -> None:
        self.t = with_history()


@pytest.mark.parametrize("mode", ["warn", "silent", "strict"])
def test_a_memo_shared_by_many_copies_keeps_one_keep_alive_list(mode: str) -> None:
    """The keep-alive list of a memo shared by many copies is never copied: it is the same list,
    holding what native keeps alive (copying it per copy made warn quadratic)."""
    memo: Dict[Any, Any] = {}
    copy.deepcopy([1.0, []], memo)  # native starts the list
    kept = memo[id(memo)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with deepcopy_shim.enabled(mode):
            for _ in range(50):
                try:
                    copy.deepcopy(HoldsOne(), memo)
                except NonLeafTensorError:
                    pass
    assert memo[id(memo)] is kept and type(kept) is list


# --- 4. the same report for every root -----------------------------------------------------------


class Fallback:
    """Catches the refusal of its cached tensor and copies itself without it."""

    def __init__(self) -> None:
        self.cache = with_history()

    def __deepcopy__(self, memo: Dict[int, Any]) -> Fallback:
        new = Fallback.__new__(Fallback)
        try:
            new.cache = copy.deepcopy(self.cache, memo)
        except RuntimeError:
            new.cache = None
        return new


Pair = collections.namedtuple("Pair", "a b")


@dataclasses.dataclass(frozen=True)
class Frozen:
    a: Any
    b: Any


class Reduces:
    def __init__(self, a: Any, b: Any) -> None:
        self.a, self.b = a, b

    def __reduce_ex__(self, protocol: int) -> Any:
        return (Reduces, (self.a, self.b))


class Labelled(torch.Tensor):
    def new_empty(self, *args: Any, **kwargs: Any) -> Any:  # native deepcopy needs it
        return super().new_empty(*args, **kwargs).as_subclass(Labelled)


class Holder(nn.Module):
    def __init__(self, a: Any, b: Any) -> None:
        super().__init__()
        self.a, self.b = a, b


def _labelled_with(a: Any, b: Any) -> torch.Tensor:
    leaf = torch.ones(2).as_subclass(Labelled)
    leaf.a, leaf.b = a, b
    return leaf


def _plain_tensor_with(a: Any, b: Any) -> torch.Tensor:
    leaf = torch.ones(2)
    leaf.a, leaf.b = a, b
    return leaf


ROOTS: Dict[str, Callable[[Any, Any], Any]] = {
    "tuple": lambda a, b: (a, b),
    "namedtuple": Pair,
    "frozen dataclass": Frozen,
    "list": lambda a, b: [a, b],
    "dict": lambda a, b: {"a": a, "b": b},
    "module": Holder,
    "tensor": _plain_tensor_with,
    "tensor subclass": _labelled_with,
    "own __reduce_ex__": Reduces,
}


@pytest.mark.parametrize("kind", list(ROOTS))
def test_strict_warn_and_find_name_the_same_tensors_for_every_kind_of_root(kind: str) -> None:
    root = ROOTS[kind](Fallback(), with_history())
    expected = warn_paths(root)
    assert len(expected) == 2, expected
    assert found(root) == expected
    error = strict_refusal(root)
    assert list(error.paths) == expected and not incomplete(error)
    for path, tensor in zip(error.paths, error.tensors):
        assert resolve(root, path) is tensor


@pytest.mark.parametrize("kind", list(ROOTS))
def test_strict_names_the_same_for_every_root_with_a_memo_shared_by_earlier_copies(kind: str) -> None:
    memo: Dict[Any, Any] = {}
    for _ in range(3):
        copy.deepcopy({"earlier": [torch.ones(1)]}, memo)
    root = ROOTS[kind](Fallback(), with_history())
    expected = warn_paths(root)
    error = strict_refusal(root, memo)
    assert list(error.paths) == expected and not incomplete(error)


def test_a_memo_entry_made_by_hand_still_leaves_its_object_out_of_strict_report() -> None:
    skipped = Fallback()
    root = (skipped, Fallback(), with_history())
    error = strict_refusal(root, {id(skipped): None})
    assert error.paths == ("[1].cache", "[2]")


# --- 5. what a tensor subclass's own __deepcopy__ copies ----------------------------------------


class WithMeta(nn.Parameter):
    """A Parameter subclass whose own __deepcopy__ deep-copies its metadata dict."""

    def __deepcopy__(self, memo: Dict[int, Any]) -> WithMeta:
        new = type(self)(self.data.clone(), self.requires_grad)
        memo[id(self)] = new
        new.meta = copy.deepcopy(self.meta, memo)
        return new


def test_what_a_tensor_subclasss_own_deepcopy_copies_is_found_and_named_by_strict() -> None:
    model = nn.Linear(2, 2)
    weight = WithMeta(torch.ones(2, 2))
    weight.meta = {"scale": with_history(1)}
    model.weight = weight
    assert warn_paths(model) == ["weight.meta['scale']"]
    assert found(model) == ["weight.meta['scale']"]
    error = strict_refusal(model)
    assert error.paths == ("weight.meta['scale']",) and not incomplete(error)


# --- 6. a failed copy is freed as soon as its error is handled ----------------------------------


class Fails:
    def __deepcopy__(self, memo: Dict[int, Any]) -> None:
        raise ValueError("cannot copy this")


class Watched:
    """Its copy is watched by a weak reference."""

    copies: ClassVar[List[Any]] = []

    def __deepcopy__(self, memo: Dict[int, Any]) -> Watched:
        new = Watched()
        memo[id(self)] = new
        Watched.copies.append(weakref.ref(new))
        return new


def _fails_after_a_tensor_with_history(door: str) -> weakref.ref[torch.Tensor]:
    """Copy a root that fails after a tensor with history; return a weak reference to that
    tensor (the source's: the caller holds nothing else of it)."""
    t = with_history()
    root: Any = {"watched": Watched(), "t": t, "fails": Fails()}
    if door == "module":
        root = Holder(Watched(), t)
        root.fails = Fails()
    source = weakref.ref(t)
    del t
    try:
        if door == "deepcopy()":
            deepcopy_shim.deepcopy(root, "warn")
        elif door == "scope":
            with deepcopy_shim.enabled("warn"):
                copy.deepcopy(root)
        else:
            copy.deepcopy(root)
    except (ValueError, NonLeafTensorError):  # strict refuses the tensor before the failure
        pass
    return source


@pytest.mark.parametrize("mode", ["warn", "silent", "strict"])
@pytest.mark.parametrize("door", ["enable()", "scope", "deepcopy()", "module"])
def test_nothing_of_a_failed_copy_outlives_its_except(mode: str, door: str) -> None:
    gc.collect()
    gc.disable()  # freed by reference counting, as natively, not by the garbage collector
    try:
        Watched.copies = []
        deepcopy_shim.enable(mode)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            source = _fails_after_a_tensor_with_history(door)
        assert Watched.copies and all(ref() is None for ref in Watched.copies)
        assert source() is None  # nor of what it copied: no record of it is left open
    finally:
        gc.enable()


# --- 7. every tensor kind ------------------------------------------------------------------------


def _nested() -> torch.Tensor:
    leaf = torch.nested.nested_tensor([torch.ones(2), torch.ones(3)], requires_grad=True)
    return leaf * 2


def _sparse() -> torch.Tensor:
    return torch.eye(3, requires_grad=True).to_sparse() * 2


def _meta() -> torch.Tensor:
    return torch.ones(2, device="meta", requires_grad=True) * 2


def _view() -> torch.Tensor:
    return with_history(4)[1:3]


KINDS = {"nested": _nested, "sparse": _sparse, "meta": _meta, "view": _view,
         "subclass": lambda: torch.ones(2, requires_grad=True).as_subclass(Labelled) * 2}


@pytest.mark.parametrize("kind", list(KINDS))
def test_every_tensor_kind_is_named_alike_by_every_mode_and_no_message_fails(kind: str) -> None:
    with torch.enable_grad():
        tensor = KINDS[kind]()
    assert tensor.grad_fn is not None
    root = {"x": tensor}
    assert found(root) == ["['x']"]
    error = strict_refusal(root)
    assert error.paths == ("['x']",) and "['x']" in str(error)
    for mode in ("silent", "warn"):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                copied = deepcopy_shim.deepcopy(root, mode)
            except deepcopy_shim.DetachedCopyError as exc:  # torch cannot copy even the leaf
                assert "['x']" in str(exc) and exc.path == "['x']"
                continue
        assert copied["x"].grad_fn is None
        if mode == "warn":
            assert [w.message.paths for w in caught if isinstance(w.message, DetachedTensorsWarning)] \
                == [("['x']",)]


# --- 8. the dispatch table ------------------------------------------------------------------------


def test_a_copier_registered_for_dict_is_called_as_natively(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: List[int] = []
    own = copy._deepcopy_dispatch[dict]  # type: ignore[attr-defined]

    def counting(x: Any, memo: Dict[int, Any], deepcopy: Any = copy.deepcopy) -> Any:
        calls.append(id(x))
        return own(x, memo, deepcopy)

    monkeypatch.setitem(copy._deepcopy_dispatch, dict, counting)  # type: ignore[attr-defined]
    model = nn.Sequential(nn.Linear(2, 2), nn.ReLU())
    copy.deepcopy(model)
    native = len(calls)
    assert native > 0
    for mode in ("silent", "warn", "strict"):
        calls.clear()
        deepcopy_shim.deepcopy(model, mode)
        assert len(calls) == native, mode


# --- 9. strict raises wherever native raises -----------------------------------------------------


def test_strict_refuses_a_grad_with_history_that_the_memo_already_holds() -> None:
    leaf = torch.ones(2, requires_grad=True)
    grad = with_history()
    leaf.grad = grad
    with pytest.raises(RuntimeError, match="graph leaves"):
        copy.deepcopy(leaf, {id(grad): torch.zeros(2)})
    with deepcopy_shim.enabled("strict"), pytest.raises(NonLeafTensorError):
        copy.deepcopy(leaf, {id(grad): torch.zeros(2)})


# --- 10. exceptions from user code arrive unchanged ----------------------------------------------


class Raises:
    raised: ClassVar[List[BaseException]] = []

    def __deepcopy__(self, memo: Dict[int, Any]) -> None:
        error = ValueError("mine")
        Raises.raised.append(error)
        raise error


@pytest.mark.parametrize("mode", ["silent", "warn"])
def test_an_error_a_tensors_dict_value_raises_arrives_unchanged(mode: str) -> None:
    tensor = with_history()
    tensor.extra = Raises()
    Raises.raised = []
    with pytest.raises(ValueError) as info:
        deepcopy_shim.deepcopy({"t": tensor}, mode)
    assert info.value is Raises.raised[-1]


# --- 11. every path reads the very tensor --------------------------------------------------------


class Shadowed:
    @property
    def out(self) -> str:
        return "formatted"


def test_an_attribute_a_class_property_shadows_is_spelled_through_the_instance_dict() -> None:
    holder = Shadowed()
    holder.__dict__["out"] = with_history()
    obj = {"h": holder}
    (path,) = found(obj)
    assert resolve(obj, path) is holder.__dict__["out"]
    assert warn_paths(obj) == [path]
    assert strict_refusal(obj).paths == (path,)


class ShadowedModule(nn.Module):
    @property
    def inner(self) -> str:
        return "formatted"


def test_a_submodule_a_class_property_shadows_is_spelled_through_its_store() -> None:
    outer = ShadowedModule()
    outer._modules["inner"] = nn.Linear(2, 2)
    outer._modules["inner"].last = with_history()
    (path,) = found(outer)
    assert resolve(outer, path) is outer._modules["inner"].last


# --- 12. fork ------------------------------------------------------------------------------------


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork on this platform")
def test_after_a_fork_the_child_can_remove_the_patch_another_threads_scope_held() -> None:
    code = textwrap.dedent(
        """
        import os, threading, torch, deepcopy_shim
        entered, leave = threading.Event(), threading.Event()
        def holder():
            with deepcopy_shim.enabled("silent"):
                entered.set(); leave.wait(20)
        thread = threading.Thread(target=holder); thread.start(); entered.wait(20)
        deepcopy_shim.enable("warn")
        pid = os.fork()
        if pid == 0:
            deepcopy_shim.disable()
            ok = "__deepcopy__" not in vars(torch.nn.Module)
            os._exit(0 if ok else 3)
        _, status = os.waitpid(pid, 0)
        leave.set(); thread.join()
        print("child", os.waitstatus_to_exitcode(status))
        """
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          cwd=REPO, env={**os.environ, "DEEPCOPY_SHIM": ""})
    assert done.stdout.strip().endswith("child 0"), done.stdout + done.stderr


# --- 13. the self-check's words ------------------------------------------------------------------


def test_the_self_check_says_when_another_function_wraps_torchs_deepcopy(
        monkeypatch: pytest.MonkeyPatch) -> None:
    original = vars(torch.Tensor)["__deepcopy__"]

    @functools.wraps(original)
    def someone_elses(self: torch.Tensor, memo: Dict[int, Any]) -> Any:
        return original(self, memo)

    monkeypatch.setattr(torch.Tensor, "__deepcopy__", someone_elses)
    from deepcopy_shim._tensor import refusal_problem

    problem = refusal_problem(someone_elses)
    assert problem is not None
    assert "does not recognise" not in problem
    # who wraps it: functools.wraps gave it torch's name, so it is named by its code
    assert "someone_elses" in problem and os.path.basename(__file__) in problem


# --- the properties, generalised: root kinds x shared memos x fallbacks that log ---------------


class LogsAndFallsBack:
    """A library's fallback: copies its cache; on a refusal it reads the error (`str(exc)`,
    the message a logger formats), counts the calls made to it and copies itself without it."""

    calls = 0
    survey_calls = 0  # those made by a strict refusal's survey, as the refused copy ends
    logged: ClassVar[List[str]] = []

    def __init__(self, cache: Any) -> None:
        self.cache = cache

    def __deepcopy__(self, memo: Dict[int, Any]) -> LogsAndFallsBack:
        if surveying():
            type(self).survey_calls += 1
        else:
            type(self).calls += 1
        new = LogsAndFallsBack.__new__(LogsAndFallsBack)
        try:
            new.cache = copy.deepcopy(self.cache, memo)
        except RuntimeError as exc:
            LogsAndFallsBack.logged.append(str(exc))
            new.cache = None
        return new


def _members(draw: Any) -> List[Any]:
    kinds = draw(st.lists(st.sampled_from(["history", "leaf", "fallback", "fallback leaf", "atom"]),
                          min_size=2, max_size=4))
    made: List[Any] = []
    for kind in kinds:
        if kind == "history":
            made.append(with_history())
        elif kind == "leaf":
            made.append(torch.ones(2))
        elif kind == "fallback":
            made.append(LogsAndFallsBack(with_history()))
        elif kind == "fallback leaf":
            made.append(LogsAndFallsBack(torch.ones(2)))
        else:
            made.append(3)
    return made


@st.composite
def _roots(draw: Any) -> Tuple[str, Any]:
    kind = draw(st.sampled_from(sorted(ROOTS)))
    first, *rest = _members(draw)
    second = rest[0] if len(rest) == 1 else list(rest)
    return kind, ROOTS[kind](first, second)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(drawn=_roots(), shared=st.booleans())
def test_every_root_every_memo_every_fallback_names_the_same_and_calls_what_native_calls(
        drawn: Tuple[str, Any], shared: bool) -> None:
    _, root = drawn
    memo: Optional[Dict[Any, Any]] = None
    if shared:  # a memo earlier copies used
        memo = {}
        copy.deepcopy({"earlier": [torch.ones(1)]}, memo)

    def fresh() -> Optional[Dict[Any, Any]]:
        return None if memo is None else dict(memo)

    LogsAndFallsBack.calls = 0
    expected = warn_paths(root, fresh())
    native_calls = LogsAndFallsBack.calls  # warn makes the calls the copy makes
    assert found(root) == expected
    for path, tensor in zip(expected, [t for _, t in deepcopy_shim.find_nonleaf_tensors(root)]):
        assert resolve(root, path) is tensor
    LogsAndFallsBack.calls = LogsAndFallsBack.survey_calls = 0
    LogsAndFallsBack.logged = []
    with deepcopy_shim.enabled("strict"):
        try:
            copy.deepcopy(root, fresh())
        except NonLeafTensorError as exc:
            refused: Optional[NonLeafTensorError] = exc
        else:
            refused = None
    # Every refusal a fallback read inside the copy was read there without a survey: the
    # calls the copy made are its own (at most what warn's whole copy made, strict stopping
    # earlier).  A survey follows the copy once, only where the refusal ended it.
    assert LogsAndFallsBack.calls <= native_calls
    assert LogsAndFallsBack.survey_calls <= (native_calls if refused is not None else 0)
    for message in LogsAndFallsBack.logged:  # read inside: torch's words, and the way to the rest
        assert "graph leaves" in message and incomplete(message) and "find_nonleaf_tensors" in message
    if refused is None:
        assert expected == [] or all(p.endswith(".cache") for p in expected)
    else:
        assert list(refused.paths) == expected and not incomplete(refused)


class ShapeUnknown(torch.Tensor):
    """A subclass whose shape cannot be read (a property that raises): the message names its
    layout instead, and never fails."""

    @property
    def shape(self) -> Any:  # type: ignore[override]
        raise RuntimeError("no shape here")

    def new_empty(self, *args: Any, **kwargs: Any) -> Any:
        return super().new_empty(*args, **kwargs).as_subclass(ShapeUnknown)


def test_the_shape_a_message_gives_for_nested_and_unreadable_tensors() -> None:
    with torch.enable_grad():
        nested = _nested()
        odd = torch.ones(2, requires_grad=True).as_subclass(ShapeUnknown) * 2
    said = str(strict_refusal({"n": nested, "o": odd}))  # torch cannot copy a nested one at all
    assert "shape=nested, 2 tensors" in said, said
    assert "shape=unknown (torch.strided)" in said, said


class SetOnly:
    """A data descriptor with `__set__` but no `__delete__`: it wins over the instance dict."""

    def __get__(self, obj: Any, owner: Any = None) -> str:
        return "from the descriptor"

    def __set__(self, obj: Any, value: Any) -> None:
        raise AttributeError("read-only")


class ShadowedBySetOnly:
    out = SetOnly()


class Elementwise:
    """Compares as a numpy array does: the answer of `!=` has no single truth."""

    __hash__ = None  # type: ignore[assignment]

    def __ne__(self, other: object) -> Any:
        return Ambiguous()


class Ambiguous:
    def __bool__(self) -> bool:
        raise ValueError("the truth value of an array with more than one element is ambiguous")


class DefaultArray:
    """A class attribute whose `!=` is elementwise (as a numpy array default's is)."""

    out = Elementwise()


@pytest.mark.parametrize("cls", [ShadowedBySetOnly, DefaultArray])
def test_an_instance_entry_under_any_class_attribute_is_spelled_so_it_reads_the_tensor(cls: type) -> None:
    holder = cls()
    holder.__dict__["out"] = with_history()
    obj = {"h": holder}
    (path,) = found(obj)
    assert resolve(obj, path) is holder.__dict__["out"]
    assert warn_paths(obj) == [path] and strict_refusal(obj).paths == (path,)
