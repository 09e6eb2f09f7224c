"""Properties over random object graphs: what the shim reports is what the copy does.

Each example is an object graph mixing tensors with and without autograd history (shared, and
views of each other) with containers, nn.Modules, partials of bound methods, and classes that
take over the copy protocol: a ``__deepcopy__`` returning None, one copying with the memo, one
starting a fresh copy of its own, a ``__reduce_ex__`` and a ``__getstate__`` that leave an
attribute out.  It is copied with a fresh memo, a plain dict memo, or a memo subclass like
pyro's.  For every example:

1. strict raises ``NonLeafTensorError`` exactly when native ``copy.deepcopy`` raises torch's
   "graph leaves" error, and otherwise returns what native returns;
2. silent's (and warn's) copy equals native's copy of the detached twin graph: native
   deepcopy with each tensor with history copied as torch copies its detached leaf, keeping
   requires_grad (a ten-line stand-in for ``Tensor.__deepcopy__``, independent of the shim);
3. the tensors strict reports are, in order, those that stand-in sees native deepcopy meet,
   and warn reports the same paths as strict, in one warning.
"""

from __future__ import annotations

import copy
import functools
import warnings
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Tuple

import pytest
import torch
import torch.nn as nn
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from support.graphdiff import GraphDiff
from support.models import ObjectIdMemo

import deepcopy_shim

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning:torch")

# --- the classes of the graphs --------------------------------------------------------------


class Plain:
    def __init__(self, **attributes: Any) -> None:
        self.__dict__.update(attributes)

    def method(self, *args: Any) -> None:
        pass


class DropsOnCopy(Plain):
    def __deepcopy__(self, memo: Dict[int, Any]) -> None:
        return None


class CopiesWithMemo(Plain):
    def __deepcopy__(self, memo: Dict[int, Any]) -> CopiesWithMemo:
        new = CopiesWithMemo.__new__(CopiesWithMemo)
        memo[id(self)] = new
        new.__dict__.update(copy.deepcopy(self.__dict__, memo))
        return new


class StartsAFreshCopy(Plain):
    def __deepcopy__(self, memo: Dict[int, Any]) -> StartsAFreshCopy:
        new = StartsAFreshCopy.__new__(StartsAFreshCopy)
        new.__dict__.update(copy.deepcopy(self.__dict__))  # a top-level copy of its own
        return new


class ReducesWithoutHidden(Plain):
    def __reduce_ex__(self, protocol: Any) -> Any:
        return (ReducesWithoutHidden, (), {k: v for k, v in self.__dict__.items() if k != "hidden"})


class GetstateWithoutHidden(Plain):
    def __getstate__(self) -> Dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k != "hidden"}


class Holder(nn.Module):
    def __init__(self, **attributes: Any) -> None:
        super().__init__()
        for name, value in attributes.items():
            setattr(self, name, value)


WRAPPERS: Dict[str, type] = {
    "plain": Plain, "drops": DropsOnCopy, "memo_copy": CopiesWithMemo,
    "fresh_copy": StartsAFreshCopy, "reduce_without": ReducesWithoutHidden,
    "getstate_without": GetstateWithoutHidden, "module": Holder,
}


MEMOS: Dict[str, Callable[[], Optional[Dict[int, Any]]]] = {
    "fresh": lambda: None, "dict": dict, "object_id_memo": ObjectIdMemo,
}

# --- descriptions of graphs, built twice: with history, and as the detached twin ------------


@dataclass(frozen=True)
class TensorSpec:
    kind: str  # "leaf", "leaf_grad", "history" or "view" (of the tensor before it)
    seed: int


def _tensors() -> st.SearchStrategy[List[TensorSpec]]:
    spec = st.builds(TensorSpec, st.sampled_from(["leaf", "leaf_grad", "history", "history", "view"]),
                     st.integers(0, 1000))
    history = st.builds(TensorSpec, st.just("history"), st.integers(0, 1000))
    return st.tuples(history, st.lists(spec, max_size=4)).map(lambda pair: [pair[0], *pair[1]])


def _graph(pool_size: int) -> st.SearchStrategy[Any]:
    tensor = st.tuples(st.just("tensor"), st.integers(0, pool_size - 1))
    leaves = st.one_of(
        tensor, tensor,
        st.tuples(st.just("atom"), st.one_of(st.integers(-3, 3), st.text(max_size=3), st.none())),
    )

    def extend(children: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
        # "_forward_hooks": a module's own hook dict replaced by whatever the graph puts there.
        names = st.sampled_from(["a", "b", "cache", "hidden", "_forward_hooks"])
        return st.one_of(
            st.tuples(st.just("list"), st.lists(children, max_size=3)),
            st.tuples(st.just("tuple"), st.lists(children, max_size=3)),
            st.tuples(st.just("dict"), st.dictionaries(names, children, max_size=3)),
            st.tuples(st.just("partial"), children),
            st.tuples(st.sampled_from(sorted(WRAPPERS)), st.dictionaries(names, children, max_size=3)),
        )

    return st.recursive(leaves, extend, max_leaves=8)


def _make_tensors(specs: List[TensorSpec]) -> List[torch.Tensor]:
    pool: List[torch.Tensor] = []
    for spec in specs:
        generator = torch.Generator().manual_seed(spec.seed)
        base = torch.randn(4, generator=generator)
        if spec.kind == "view" and pool and not pool[-1].is_leaf:
            pool.append(pool[-1][1:])  # a view with history of the tensor before it
        elif spec.kind in ("history", "view"):
            pool.append(base.requires_grad_(True) * 2)
        else:
            pool.append(base.requires_grad_(spec.kind == "leaf_grad"))
    return pool


def _build(desc: Any, pool: List[torch.Tensor]) -> Any:
    kind, body = desc
    if kind == "atom":
        return body
    if kind == "tensor":
        return pool[body]
    if kind in ("list", "tuple"):
        items = [_build(child, pool) for child in body]
        return items if kind == "list" else tuple(items)
    if kind == "dict":
        return {key: _build(child, pool) for key, child in body.items()}
    if kind == "partial":
        return functools.partial(Plain(held=_build(body, pool)).method, _build(body, pool))
    return WRAPPERS[kind](**{key: _build(child, pool) for key, child in body.items()})


# --- the copies -----------------------------------------------------------------------------

GRAPH_LEAVES = "graph leaves"


def _native(graph: Any, memo: Optional[Dict[int, Any]]) -> Tuple[str, Any]:
    try:
        return "ok", copy.deepcopy(graph, memo)
    except RuntimeError as exc:
        if GRAPH_LEAVES not in str(exc):
            raise
        return "graph-leaves", exc


def _native_detaching(graph: Any, memo: Optional[Dict[int, Any]]) -> Tuple[List[torch.Tensor], Any]:
    """Native deepcopy of the detached twin of ``graph``, and the tensors with history it met.

    ``Tensor.__deepcopy__`` is replaced for the duration by a stand-in that copies a tensor with
    history as torch copies its detached leaf, then sets requires_grad, and records it.
    """
    original = vars(torch.Tensor)["__deepcopy__"]
    met: List[torch.Tensor] = []

    def detaching(self: torch.Tensor, memo: Dict[Any, Any]) -> torch.Tensor:
        if self.is_leaf:
            return original(self, memo)  # type: ignore[no-any-return]
        if id(self) in memo:
            return memo[id(self)]  # type: ignore[no-any-return]
        if all(seen is not self for seen in met):  # one copy names a tensor once, where met first
            met.append(self)
        alias = self.detach()
        memo.setdefault(id(memo), []).append(alias)  # keep the temporary's id its own
        made = original(alias, memo).requires_grad_(self.requires_grad)
        memo[id(self)] = made
        return made  # type: ignore[no-any-return]

    torch.Tensor.__deepcopy__ = detaching  # type: ignore[method-assign]
    try:
        return met, copy.deepcopy(graph, memo)
    finally:
        torch.Tensor.__deepcopy__ = original  # type: ignore[method-assign]


def _in_mode(mode: str, graph: Any, memo: Optional[Dict[int, Any]]) -> Tuple[Any, Any]:
    """(the copy or the NonLeafTensorError, the DetachedTensorsWarnings emitted)."""
    with warnings.catch_warnings(record=True) as caught, deepcopy_shim.enabled(mode):
        warnings.simplefilter("always")
        try:
            made: Any = copy.deepcopy(graph, memo)
        except deepcopy_shim.NonLeafTensorError as refusal:
            made = refusal
    return made, [w.message for w in caught if w.category is deepcopy_shim.DetachedTensorsWarning]


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), specs=_tensors(), memo_kind=st.sampled_from(sorted(MEMOS)))
def test_reports_are_what_the_copy_does(data: st.DataObject, specs: List[TensorSpec],
                                        memo_kind: str) -> None:
    outcome = check_graph(data.draw(_graph(len(specs)), label="graph"), specs, memo_kind)
    event(f"native: {outcome}")


HISTORY, LEAF = TensorSpec("history", 1), TensorSpec("leaf_grad", 2)
# Graphs random search rarely builds, each a way a report could go wrong.
TRICKY: Dict[str, Tuple[Any, List[TensorSpec]]] = {
    "fresh_copy_inside_after_an_outer_tensor": (
        ("list", [("tensor", 0), ("fresh_copy", {"a": ("tensor", 1)})]), [HISTORY, TensorSpec("history", 3)]),
    "fresh_copy_inside_meets_a_tensor_met_before": (
        ("list", [("tensor", 0), ("fresh_copy", {"a": ("tensor", 0)})]), [HISTORY]),
    "dropped_beside_copied": (("dict", {"a": ("drops", {"cache": ("tensor", 0)}), "b": ("tensor", 1)}),
                              [HISTORY, TensorSpec("history", 3)]),
    "hidden_by_reduce_and_getstate": (
        ("list", [("reduce_without", {"hidden": ("tensor", 0), "a": ("tensor", 1)}),
                  ("getstate_without", {"hidden": ("tensor", 0)})]), [HISTORY, LEAF]),
    "view_and_base": (("tuple", [("tensor", 1), ("tensor", 0), ("tensor", 1)]),
                      [HISTORY, TensorSpec("view", 0)]),
    "partial_of_a_bound_method": (("module", {"hook": ("partial", ("tensor", 0))}), [HISTORY]),
    "memo_copy_reached_twice": (("list", [("memo_copy", {"a": ("tensor", 0)}), ("tensor", 0)]), [HISTORY]),
    "hook_dict_replaced_by_a_tensor": (("module", {"_forward_hooks": ("tensor", 0)}), [HISTORY]),
}


@pytest.mark.parametrize("memo_kind", sorted(MEMOS))
@pytest.mark.parametrize("name", sorted(TRICKY))
def test_reports_are_what_the_copy_does_on_tricky_graphs(name: str, memo_kind: str) -> None:
    desc, specs = TRICKY[name]
    check_graph(desc, specs, memo_kind)


def check_graph(desc: Any, specs: List[TensorSpec], memo_kind: str) -> str:
    """The three properties for the graph ``desc`` describes, copied with a ``memo_kind`` memo;
    returns what native deepcopy did ("ok" or "graph-leaves")."""
    pool = _make_tensors(specs)
    graph = _build(desc, pool)
    new_memo = MEMOS[memo_kind]

    native_outcome, native = _native(graph, new_memo())
    met, twin_copy = _native_detaching(graph, new_memo())
    strict, strict_warnings = _in_mode("strict", graph, new_memo())
    assert not strict_warnings

    # 1. strict refuses exactly what native deepcopy refuses, and otherwise copies as native
    if native_outcome == "graph-leaves":
        assert isinstance(strict, deepcopy_shim.NonLeafTensorError)
    else:
        assert not isinstance(strict, deepcopy_shim.NonLeafTensorError), strict
        GraphDiff(graph, native, strict).check()
        assert met == []

    # 3. what strict reports is, in order, what the copy met
    reported = list(strict.tensors) if isinstance(strict, deepcopy_shim.NonLeafTensorError) else []
    assert [id(t) for t in reported] == [id(t) for t in met]

    # 2. silent copies as native copies the detached twin
    silent, silent_warnings = _in_mode("silent", graph, new_memo())
    assert not silent_warnings
    GraphDiff(graph, twin_copy, silent).check()

    # 3. warn reports the same tensors as strict, in one warning, and copies as silent does
    warned_copy, warn_messages = _in_mode("warn", graph, new_memo())
    if reported:
        (message,) = warn_messages
        assert message.paths == strict.paths
    else:
        assert warn_messages == []
    GraphDiff(graph, twin_copy, warned_copy).check()
    return native_outcome


# --- nesting and failure: copies made inside copies, caught refusals, copies that fail -------
#
# Classes whose __deepcopy__ nests another copy: with the same memo under a scope of another
# mode, with a try/except fallback that catches torch's refusal, as an explicit
# deepcopy_shim.deepcopy() or a find_nonleaf_tensors() question, or that raise.  The oracle
# for silent and warn (native deepcopy with a stand-in Tensor.__deepcopy__ that detaches) must
# not call the shim while it has replaced Tensor.__deepcopy__, so each class has an oracle form
# (`_ORACLE`), and tensors met inside a copy of the class's own (an explicit call, a scope) are
# not the top-level copy's: the stand-in records only outside them (`_INNER`).

_ORACLE = [False]
_INNER = [0]


class _Nests(Plain):
    def _new(self, memo: Dict[int, Any]) -> Any:
        new = type(self).__new__(type(self))
        memo[id(self)] = new
        return new


class FallsBackOnRefusal(_Nests):
    def __deepcopy__(self, memo: Dict[int, Any]) -> Any:
        new = self._new(memo)
        try:
            state = copy.deepcopy(self.__dict__, memo)
        except RuntimeError as exc:
            assert GRAPH_LEAVES in str(exc)
            _INNER[0] += 1
            try:
                state = copy.deepcopy(self.__dict__) if _ORACLE[0] else deepcopy_shim.deepcopy(
                    self.__dict__, "silent")
            finally:
                _INNER[0] -= 1
        new.__dict__.update(state)
        return new


class SilentScopeInside(_Nests):
    def __deepcopy__(self, memo: Dict[int, Any]) -> Any:
        new = self._new(memo)
        _INNER[0] += 1
        try:
            if _ORACLE[0]:
                state = copy.deepcopy(self.__dict__, memo)
            else:
                with deepcopy_shim.enabled("silent"):
                    state = copy.deepcopy(self.__dict__, memo)
        finally:
            _INNER[0] -= 1
        new.__dict__.update(state)
        return new


class ExplicitCopyInside(_Nests):
    def __deepcopy__(self, memo: Dict[int, Any]) -> Any:
        new = self._new(memo)
        _INNER[0] += 1
        try:
            state = copy.deepcopy(self.__dict__) if _ORACLE[0] else deepcopy_shim.deepcopy(
                self.__dict__, "silent")
        finally:
            _INNER[0] -= 1
        new.__dict__.update(state)
        return new


class AsksInside(_Nests):
    def __deepcopy__(self, memo: Dict[int, Any]) -> Any:
        if not _ORACLE[0]:  # a question: it changes nothing of the copy around it
            deepcopy_shim.find_nonleaf_tensors(self.__dict__)
        new = self._new(memo)
        new.__dict__.update(copy.deepcopy(self.__dict__, memo))
        return new


class RaisesOnCopy(Plain):
    def __deepcopy__(self, memo: Dict[int, Any]) -> None:
        raise ValueError("this object cannot be copied")


NESTING: Dict[str, type] = {
    **WRAPPERS, "falls_back": FallsBackOnRefusal, "silent_scope": SilentScopeInside,
    "explicit_copy": ExplicitCopyInside, "asks": AsksInside, "raises": RaisesOnCopy,
}


def _nesting_graph(pool_size: int) -> st.SearchStrategy[Any]:
    tensor = st.tuples(st.just("tensor"), st.integers(0, pool_size - 1))
    leaves = st.one_of(tensor, tensor, st.tuples(st.just("atom"), st.integers(-3, 3)))

    def extend(children: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
        names = st.sampled_from(["a", "b", "cache"])
        return st.one_of(
            st.tuples(st.just("list"), st.lists(children, max_size=3)),
            st.tuples(st.just("dict"), st.dictionaries(names, children, max_size=3)),
            st.tuples(st.sampled_from(sorted(NESTING)), st.dictionaries(names, children, max_size=3)),
        )

    return st.recursive(leaves, extend, max_leaves=8)


def _build_nesting(desc: Any, pool: List[torch.Tensor]) -> Any:
    kind, body = desc
    if kind == "atom":
        return body
    if kind == "tensor":
        return pool[body]
    if kind == "list":
        return [_build_nesting(child, pool) for child in body]
    if kind == "dict":
        return {key: _build_nesting(child, pool) for key, child in body.items()}
    return NESTING[kind](**{key: _build_nesting(child, pool) for key, child in body.items()})


def _outcome(call: Callable[[], Any]) -> Tuple[str, Any]:
    try:
        return "ok", call()
    except deepcopy_shim.NonLeafTensorError as refusal:
        return "refused", refusal
    except RuntimeError as exc:
        if type(exc) is RuntimeError and GRAPH_LEAVES in str(exc):
            return "graph-leaves", exc
        return "error", (type(exc), str(exc))
    except ValueError as exc:
        return "error", (type(exc), str(exc))


def _oracle_detaching(graph: Any, memo: Optional[Dict[int, Any]]
                      ) -> Tuple[List[torch.Tensor], Tuple[str, Any]]:
    original = vars(torch.Tensor)["__deepcopy__"]
    met: List[torch.Tensor] = []

    def detaching(self: torch.Tensor, memo: Dict[Any, Any]) -> torch.Tensor:
        if self.is_leaf:
            return original(self, memo)  # type: ignore[no-any-return]
        if id(self) in memo:
            return memo[id(self)]  # type: ignore[no-any-return]
        if not _INNER[0] and all(seen is not self for seen in met):  # named once, where met first
            met.append(self)
        alias = self.detach()
        memo.setdefault(id(memo), []).append(alias)
        made = original(alias, memo).requires_grad_(self.requires_grad)
        memo[id(self)] = made
        return made  # type: ignore[no-any-return]

    torch.Tensor.__deepcopy__ = detaching  # type: ignore[method-assign]
    _ORACLE[0] = True
    try:
        return met, _outcome(lambda: copy.deepcopy(graph, memo))
    finally:
        _ORACLE[0] = False
        torch.Tensor.__deepcopy__ = original  # type: ignore[method-assign]


def _same(source: Any, expected: Tuple[str, Any], got: Tuple[str, Any]) -> None:
    assert got[0] == expected[0], (expected, got)
    if got[0] == "ok":
        GraphDiff(source, expected[1], got[1]).check()
    elif got[0] == "error":
        assert got[1] == expected[1]


def _in_scope(mode: Any, graph: Any, memo: Optional[Dict[int, Any]]) -> Tuple[Tuple[str, Any], List[Any]]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with deepcopy_shim.enabled(mode):
            outcome = _outcome(lambda: copy.deepcopy(graph, memo))
    if memo is not None:
        # Nothing of the shim's is left in a memo the caller keeps, once that memo is used
        # again (a failed copy's error handled inside the scope: its stand-in for the memo's
        # keep-alive list gives the list back at the memo's next keep-alive append).
        copy.deepcopy([[]], memo)
        assert type(dict.get(memo, id(memo), [])) is list
    return outcome, [w.message for w in caught if w.category is deepcopy_shim.DetachedTensorsWarning]


def check_nesting(desc: Any, specs: List[TensorSpec], memo_kind: str) -> str:
    pool = _make_tensors(specs)
    graph = _build_nesting(desc, pool)
    new_memo = MEMOS[memo_kind]

    native = _outcome(lambda: copy.deepcopy(graph, new_memo()))
    met, twin = _oracle_detaching(graph, new_memo())

    # no mode: exactly native, with the patch installed (a global mode switched off here)
    deepcopy_shim.enable("warn")
    try:
        off, off_warnings = _in_scope(False, graph, new_memo())
    finally:
        deepcopy_shim.disable()
    _same(graph, native, off)
    assert not off_warnings

    # strict: refuses exactly where native raises torch's refusal, naming what silent meets
    strict, strict_warnings = _in_scope("strict", graph, new_memo())
    assert not strict_warnings
    if native[0] == "graph-leaves":
        assert strict[0] == "refused", strict
        assert [id(t) for t in strict[1].tensors] == [id(t) for t in met]
        assert type(strict[1].__cause__) is RuntimeError
    else:
        _same(graph, native, strict)

    # silent and warn: the detached twin's copy; warn names what it detached, once
    for mode in ("silent", "warn"):
        outcome, messages = _in_scope(mode, graph, new_memo())
        _same(graph, twin, outcome)
        if mode == "silent" or outcome[0] != "ok" or not met:
            assert messages == []
        else:
            (message,) = messages
            assert [id(t) for t in message.tensors] == [id(t) for t in met]
    return native[0]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), specs=_tensors(), memo_kind=st.sampled_from(sorted(MEMOS)))
def test_copies_nested_in_copies_and_copies_that_fail_are_exactly_native(
        data: st.DataObject, specs: List[TensorSpec], memo_kind: str) -> None:
    outcome = check_nesting(data.draw(_nesting_graph(len(specs)), label="graph"), specs, memo_kind)
    event(f"native: {outcome}")


NESTED: Dict[str, Tuple[Any, List[TensorSpec]]] = {
    "fallback_then_refusal": (("list", [("falls_back", {"a": ("tensor", 0)}), ("tensor", 1)]),
                              [HISTORY, TensorSpec("history", 3)]),
    "scope_then_raise": (("list", [("silent_scope", {"a": ("tensor", 0)}), ("raises", {})]), [HISTORY]),
    "refusal_then_raise": (("list", [("tensor", 0), ("raises", {})]), [HISTORY]),
    "explicit_copy_shares_nothing": (("list", [("explicit_copy", {"a": ("tensor", 0)}), ("tensor", 0)]),
                                     [HISTORY]),
    "question_inside": (("dict", {"q": ("asks", {"a": ("tensor", 0)}), "b": ("tensor", 1)}),
                        [HISTORY, TensorSpec("history", 3)]),
    # Two views of one base, one copied in a scope a __deepcopy__ enters, with the same memo:
    # they share one storage, as leaves would (found by the property above).
    "scope_shares_a_storage": (("list", [("tensor", 2), ("silent_scope", {"a": ("tensor", 1)})]),
                               [HISTORY, TensorSpec("view", 0), TensorSpec("view", 0)]),
}


@pytest.mark.parametrize("memo_kind", sorted(MEMOS))
@pytest.mark.parametrize("name", sorted(NESTED))
def test_nesting_and_failure_on_chosen_graphs(name: str, memo_kind: str) -> None:
    desc, specs = NESTED[name]
    check_nesting(desc, specs, memo_kind)
