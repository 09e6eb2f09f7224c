"""A tensor with history is copied exactly as torch copies its detached alias, through the same memo.

The rule of modes silent and warn: `copy.deepcopy(t)` for a tensor `t` with autograd history is
what torch's own `Tensor.__deepcopy__` makes of `t.detach()` with the copy's memo (its storage
copied once per copy and shared by every tensor of that storage in the copy, strides and storage
offset kept, conj and neg bits as torch resolves them on a leaf), then given `t.requires_grad`.
The reference is the detaching oracle (`support.graphdiff.detaching_deepcopy`), which is native
deepcopy with that rule and nothing of the shim.
"""

from __future__ import annotations

import copy
from typing import Any, Callable, Dict, List, Tuple

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.graphdiff import detaching_deepcopy

import deepcopy_shim


def layout(t: torch.Tensor) -> Tuple[Any, ...]:
    """What a copy's layout is: shape, strides, storage offset, storage size, bits and values."""
    return (tuple(t.shape), t.stride(), t.storage_offset(), t.untyped_storage().nbytes(),
            t.dtype, t.is_conj(), t.is_neg(), t.requires_grad, t.is_leaf,
            t.detach().resolve_conj().resolve_neg().tolist())


def sharing(tensors: List[torch.Tensor]) -> List[int]:
    """Which of `tensors` share a storage: each one's index of the first with the same storage."""
    first: Dict[int, int] = {}
    return [first.setdefault(t.untyped_storage().data_ptr(), i) for i, t in enumerate(tensors)]


def silent_copy(obj: Any) -> Any:
    with deepcopy_shim.enabled("silent"):
        return copy.deepcopy(obj)


def _leaf() -> torch.Tensor:
    torch.manual_seed(0)
    return torch.randn(4, 3, requires_grad=True)


def _act() -> torch.Tensor:
    torch.manual_seed(1)
    return torch.randn(8, 8, requires_grad=True) * 2


VIEWS: Dict[str, Callable[[], torch.Tensor]] = {
    "expanded view of a transposed leaf": lambda: _leaf().t()[:1].expand(3, 4),
    "a block of an activation": lambda: _act()[2:4, 1:5],
    "a diagonal": lambda: _act()[:4, :4].diagonal(),
    "a column": lambda: _act()[:, 3],
    "a first row": lambda: _act()[0],
    "as_strided with an offset": lambda: _act().as_strided((3, 2), (5, 2), 7),
    "a conj view": lambda: (torch.randn(3, dtype=torch.complex64, requires_grad=True) * 1).conj(),
    "a neg view": lambda: torch._neg_view(torch.randn(3, requires_grad=True) * 1),
}


@pytest.mark.parametrize("name", sorted(VIEWS))
def test_a_tensor_with_history_is_copied_with_the_layout_of_its_detached_alias(name: str) -> None:
    view = VIEWS[name]()
    assert not view.is_leaf
    assert layout(silent_copy(view)) == layout(detaching_deepcopy(view))


class RebuildsAView:
    """Holds `data` and rebuilds `first`, a view of it, from its state (as classes that cache a
    view of their own tensor do)."""

    def __init__(self, data: torch.Tensor) -> None:
        self.data = data
        self.first = data[0]

    def __getstate__(self) -> Dict[str, Any]:
        return {"data": self.data}

    def __setstate__(self, state: Dict[str, Any]) -> None:
        self.data = state["data"]
        self.first = self.data[0]


@pytest.mark.parametrize("base_first", [False, True], ids=["base copied after", "base copied before"])
def test_a_view_made_of_a_copy_while_the_copy_runs_still_aliases_it(base_first: bool) -> None:
    act = _act()
    holder = RebuildsAView(act[2:4])
    source = [act, holder] if base_first else [holder, act]
    made = silent_copy(source)
    oracle = detaching_deepcopy(source)
    copied = made[1] if base_first else made[0]
    expected = oracle[1] if base_first else oracle[0]
    assert expected.first.untyped_storage().data_ptr() == expected.data.untyped_storage().data_ptr()
    assert copied.first.untyped_storage().data_ptr() == copied.data.untyped_storage().data_ptr()
    whole = made[0] if base_first else made[1]
    assert copied.data.untyped_storage().data_ptr() == whole.untyped_storage().data_ptr()
    assert layout(copied.data) == layout(expected.data)
    assert layout(copied.first) == layout(expected.first)


# --- the property: every layout, several views of one base, with and without the base --------

_VIEW_OPS: List[Tuple[str, Callable[[torch.Tensor, int], torch.Tensor]]] = [
    ("narrow", lambda t, k: t.narrow(0, k % t.shape[0], max(1, t.shape[0] - k % t.shape[0]))),
    ("select", lambda t, k: t[k % t.shape[0]] if t.dim() > 1 else t),
    ("transpose", lambda t, k: t.transpose(0, -1)),
    ("step", lambda t, k: t[:: 1 + k % 2]),
    ("expand", lambda t, k: t.unsqueeze(0).expand(2, *t.shape)),
    ("diagonal", lambda t, k: t.diagonal() if t.dim() >= 2 else t),
    ("as_strided", lambda t, k: t.as_strided((2, 2), (1, 2), k % 3)),
    ("view", lambda t, k: t.reshape(-1) if t.is_contiguous() else t),
    ("conj", lambda t, k: t.conj() if t.is_complex() else t),
    ("neg", lambda t, k: torch._neg_view(t) if not t.is_complex() else t),
]


@st.composite
def _sources(draw: st.DrawFn) -> Tuple[List[torch.Tensor], List[str]]:
    dtype = draw(st.sampled_from([torch.float32, torch.float64, torch.complex64]))
    rows, cols = draw(st.integers(2, 6)), draw(st.integers(3, 6))
    leaf = torch.arange(rows * cols, dtype=torch.float64).reshape(rows, cols).to(dtype).requires_grad_(True)
    history = draw(st.booleans())
    base = leaf * 1 if history else leaf  # a base with history, or views of a leaf (they have it)
    views: List[torch.Tensor] = []
    names: List[str] = []
    for _ in range(draw(st.integers(1, 4))):
        tensor = base
        chain = draw(st.lists(st.tuples(st.integers(0, len(_VIEW_OPS) - 1), st.integers(0, 5)),
                              min_size=1, max_size=3))
        for index, k in chain:
            name, op = _VIEW_OPS[index]
            try:
                tensor = op(tensor, k)
            except RuntimeError:  # not a view of this shape: keep the one made so far
                continue
            names.append(name)
        views.append(tensor)
    if draw(st.booleans()):  # the base in the copy too, before or after the views
        at = draw(st.integers(0, len(views)))
        views.insert(at, base)
    return views, names


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(drawn=_sources(), order=st.sampled_from(["list", "dict", "reversed"]))
def test_every_copy_has_the_layout_and_sharing_of_the_detached_aliases_copy(
        drawn: Tuple[List[torch.Tensor], List[str]], order: str) -> None:
    views, _ = drawn
    source: Any = list(views)
    if order == "dict":
        source = {f"t{i}": v for i, v in enumerate(views)}
    elif order == "reversed":
        source = list(reversed(views))
    made = silent_copy(source)
    oracle = detaching_deepcopy(source)
    made_tensors = list(made.values()) if isinstance(made, dict) else made
    oracle_tensors = list(oracle.values()) if isinstance(oracle, dict) else oracle
    assert [layout(t) for t in made_tensors] == [layout(t) for t in oracle_tensors]
    assert sharing(made_tensors) == sharing(oracle_tensors)
    source_storages = {v.untyped_storage().data_ptr() for v in views}
    assert not source_storages & {t.untyped_storage().data_ptr() for t in made_tensors}
