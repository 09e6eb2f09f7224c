"""Copying tensors: leaves untouched, non-leaf tensors as faithful detached leaves."""

from __future__ import annotations

import copy
import gc
import inspect
import warnings
from typing import Any, ClassVar, Dict, Iterator

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from support.models import ORIGINAL_TENSOR_DEEPCOPY

import deepcopy_shim


@pytest.fixture(autouse=True)
def silent() -> Iterator[None]:
    deepcopy_shim.enable("silent")
    yield


def as_nonleaf(t: torch.Tensor) -> torch.Tensor:
    """A non-leaf tensor with ``t``'s values (and layout, where ``t`` is a view)."""
    out = t.detach().clone().requires_grad_(True) * 1
    assert not out.is_leaf
    return out


def assert_detached_twin(src: torch.Tensor, dst: torch.Tensor) -> None:
    """``dst`` is ``src`` copied as torch copies its detached alias (``copy.deepcopy(
    src.detach())``, a leaf): same values, layout (strides, storage offset, storage size) and
    bits as that copy, ``src``'s requires_grad, and a storage of its own."""
    assert dst.is_leaf and dst.grad_fn is None
    assert type(dst) is type(src)
    assert dst.requires_grad == src.requires_grad
    alias = copy.deepcopy(src.detach())  # a leaf: torch's own copy, whatever the mode
    assert (dst.dtype, dst.device, dst.shape) == (alias.dtype, alias.device, alias.shape)
    if src.layout == torch.strided:
        assert (dst.stride(), dst.storage_offset()) == (alias.stride(), alias.storage_offset())
        assert dst.untyped_storage().nbytes() == alias.untyped_storage().nbytes()
    assert (dst.is_conj(), dst.is_neg()) == (alias.is_conj(), alias.is_neg())
    assert torch.equal(dst.detach().resolve_conj().resolve_neg(), src.detach().resolve_conj().resolve_neg())
    if src.layout == torch.strided and src.numel():
        assert dst.untyped_storage().data_ptr() != src.untyped_storage().data_ptr()


def test_nonleaf_becomes_detached_leaf_with_requires_grad() -> None:
    x = torch.randn(3, 4, requires_grad=True)
    y = x * 2
    c = copy.deepcopy(y)
    assert_detached_twin(y, c)
    assert c.requires_grad
    c.sum().backward()
    assert x.grad is None  # nothing flows back into the source graph
    assert c.grad is not None


def test_leaf_tensors_go_to_torch_untouched() -> None:
    leaf = torch.randn(2, 3, requires_grad=True)
    leaf.grad = torch.ones(2, 3)
    c = copy.deepcopy(leaf)
    assert c.requires_grad and torch.equal(c.grad, leaf.grad)
    assert c.grad is not leaf.grad


@pytest.mark.parametrize(
    "dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.complex64]
)
def test_dtypes(dtype: torch.dtype) -> None:
    y = as_nonleaf(torch.randn(4, 5).to(dtype))
    assert_detached_twin(y, copy.deepcopy(y))


def test_strides_offset_and_memory_format() -> None:
    base = as_nonleaf(torch.randn(2, 3, 4, 5))
    cl = base.contiguous(memory_format=torch.channels_last)
    assert_detached_twin(cl, copy.deepcopy(cl))
    assert copy.deepcopy(cl).is_contiguous(memory_format=torch.channels_last)
    for view in (base.transpose(1, 3), base[:, 1:, ::2], base[1], base.expand(3, 2, 3, 4, 5)):
        assert_detached_twin(view, copy.deepcopy(view))


def test_conj_and_neg_bits() -> None:
    z = as_nonleaf(torch.randn(3, dtype=torch.complex64))
    conj = z.conj()
    assert conj.is_conj()
    assert_detached_twin(conj, copy.deepcopy(conj))
    neg = torch._neg_view(as_nonleaf(torch.randn(3)))
    assert neg.is_neg()
    assert_detached_twin(neg, copy.deepcopy(neg))


def test_sparse_nonleaf() -> None:
    dense = torch.randn(4, 4)
    dense[dense < 0.5] = 0
    y = dense.to_sparse().requires_grad_(True) * 2
    assert not y.is_leaf
    c = copy.deepcopy(y)
    assert c.is_sparse and c.is_leaf and c.requires_grad
    assert torch.equal(c.detach().to_dense(), y.detach().to_dense())


def test_view_and_base_share_storage_in_the_copy() -> None:
    base = as_nonleaf(torch.arange(12.0))
    view = base[2:8].view(2, 3)
    leaf_view = base.detach()[::3]  # a leaf that aliases the same storage
    c_base, c_view, c_leaf = copy.deepcopy((base, view, leaf_view))
    assert c_view.untyped_storage().data_ptr() == c_base.untyped_storage().data_ptr()
    assert c_leaf.untyped_storage().data_ptr() == c_base.untyped_storage().data_ptr()
    assert c_view.storage_offset() == 2 and c_view.stride() == (3, 1)
    with torch.no_grad():
        c_base[3] = 100.0
    assert c_view[0, 1].item() == 100.0
    assert base[3].item() == 3.0


def test_same_nonleaf_reached_twice_gives_one_copy() -> None:
    y = as_nonleaf(torch.randn(3))
    a, b = copy.deepcopy([y, {"again": y}])
    assert a is b["again"]


def test_retained_grad_is_copied_without_torch_warning() -> None:
    x = torch.randn(3, requires_grad=True)
    y = x * 2
    y.retain_grad()
    (y * 3).sum().backward()
    z = x * 5  # not retained: reading its .grad would warn
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        cy, cz = copy.deepcopy((y, z))
    assert torch.equal(cy.grad, y.grad) and cy.grad is not y.grad
    assert cz.grad is None


def test_nonleaf_grad_of_leaf_from_create_graph() -> None:
    x = torch.randn(3, requires_grad=True)
    (x ** 3).sum().backward(create_graph=True)
    assert not x.grad.is_leaf
    c = copy.deepcopy(x)
    assert c.grad.is_leaf and torch.equal(c.grad, x.grad.detach())


def test_a_nonleaf_grad_copied_before_its_leaf_stays_one_object() -> None:
    """torch copies a leaf's .grad by calling grad.__deepcopy__(memo) itself, past deepcopy's
    memo check: a grad the copy has already made is a memo hit there too, not a second copy."""
    x = torch.randn(3, requires_grad=True)
    (x ** 3).sum().backward(create_graph=True)
    c = copy.deepcopy({"grad": x.grad, "x": x})
    assert c["x"].grad is c["grad"]


def test_temporaries_stay_alive_for_the_whole_copy() -> None:
    """Many non-leaf tensors and their grads in one copy: a freed detach() alias whose id() got
    reused would hand one tensor another's copy (torch: "can't assign Variable as its own grad")."""
    xs = [torch.randn(5, requires_grad=True) for _ in range(50)]
    ys = [x * (i + 1) for i, x in enumerate(xs)]
    for y in ys:
        y.retain_grad()
    sum(y.sum() for y in ys).backward()
    gc.disable()  # ids are reused most eagerly without the cyclic collector in between
    try:
        copies = copy.deepcopy(ys)
    finally:
        gc.enable()
    for y, c in zip(ys, copies):
        assert torch.equal(c.detach(), y.detach()) and torch.equal(c.grad, y.grad)


class Tagged(torch.Tensor):
    """A plain Python subclass that copies natively (new_empty keeps the type)."""

    def new_empty(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        return super().new_empty(*args, **kwargs).as_subclass(Tagged)


def test_subclass_type_and_dict_are_kept() -> None:
    y = as_nonleaf(torch.randn(3)).as_subclass(Tagged)
    y.label = {"name": "act"}
    assert not y.is_leaf
    c = copy.deepcopy(y)
    assert type(c) is Tagged and c.is_leaf and c.requires_grad
    assert c.label == {"name": "act"} and c.label is not y.label


class Bare(torch.Tensor):
    """A subclass torch cannot deep-copy even as a leaf (no ``new_empty`` of its own)."""


def test_subclass_torch_cannot_copy_fails_with_one_clear_error() -> None:
    leaf = torch.randn(2).as_subclass(Bare)
    with pytest.raises(RuntimeError) as native:
        copy.deepcopy(leaf)
    holder = {"acts": [as_nonleaf(torch.randn(2)).as_subclass(Bare)]}
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing is announced for a copy that then fails
        with deepcopy_shim.enabled("strict"), pytest.raises(deepcopy_shim.NonLeafTensorError) as refused:
            copy.deepcopy(holder)  # strict refuses where torch does, before any copy is tried
        assert refused.value.paths == ("['acts'][0]",)
        for mode in ("silent", "warn"):
            with deepcopy_shim.enabled(mode), pytest.raises(deepcopy_shim.DetachedCopyError) as shim:
                copy.deepcopy(holder)
            error = shim.value
            assert isinstance(error, RuntimeError) and error.path == "['acts'][0]"
            assert str(error).splitlines()[0] == (
                "deepcopy_shim: cannot deep-copy ['acts'][0], a tensor with autograd history:"
            )
            assert f"{type(native.value).__name__}: {native.value}" in " ".join(str(error).split())
            # torch's own error is the cause, not hidden under the "graph leaves" refusal
            assert type(error.__cause__) is type(native.value)
            assert str(error.__cause__) == str(native.value) and error.__suppress_context__


def test_parameter_keeps_its_own_deepcopy() -> None:
    p = torch.nn.Parameter(torch.randn(3))
    c = copy.deepcopy(p)
    assert type(c) is torch.nn.Parameter and torch.equal(c, p)


def test_patched_attribute_has_stable_identity() -> None:
    assert torch.Tensor.__deepcopy__ is torch.Tensor.__deepcopy__
    assert torch.Tensor.__deepcopy__.__wrapped__ is ORIGINAL_TENSOR_DEEPCOPY
    # a wrapt proxy: equal to and hashed like the original, so sets built before patching match
    assert torch.Tensor.__deepcopy__ == ORIGINAL_TENSOR_DEEPCOPY
    assert torch.Tensor.__deepcopy__ in {ORIGINAL_TENSOR_DEEPCOPY}
    assert torch.Tensor.__deepcopy__.__name__ == "__deepcopy__"
    overrides = torch.overrides.get_testing_overrides()
    assert torch.Tensor.__deepcopy__ in overrides  # used as a dict key inside torch


def _bound_facts(tensor: torch.Tensor) -> Dict[str, Any]:
    """What introspection and misuse of `tensor.__deepcopy__` show."""
    bound = tensor.__deepcopy__
    facts: Dict[str, Any] = {
        "qualname": bound.__qualname__, "name": bound.__name__, "doc": bound.__doc__,
        "module": bound.__module__, "signature": str(inspect.signature(bound)),
        "repr": repr(bound).split(" of ")[0], "unwrapped": inspect.unwrap(bound.__func__),
        "self": bound.__self__ is tensor, "by keyword": type(bound(memo={})),
    }
    for name, call in (("no memo", lambda: bound()), ("two memos", lambda: bound({}, {}))):
        with pytest.raises(TypeError) as raised:
            call()
        facts[name] = str(raised.value)
    return facts


@pytest.mark.parametrize("requires_grad", [False, True])
def test_a_tensors_bound_deepcopy_reads_and_fails_as_torchs(requires_grad: bool) -> None:
    """Instance access binds the shim's plain function of torch's signature (the fast path
    deepcopy takes for every tensor): named, documented and signed as torch's, unwrapping to
    it, bound to the tensor, failing on a bad call with torch's words; only its `__func__` is
    not `Tensor.__deepcopy__` (the class attribute, which keeps one identity)."""
    tensor = torch.randn(3, requires_grad=requires_grad)
    deepcopy_shim.disable()
    native = _bound_facts(tensor)
    deepcopy_shim.enable("silent")
    assert _bound_facts(tensor) == native
    assert native["unwrapped"] is ORIGINAL_TENSOR_DEEPCOPY
    assert tensor.__deepcopy__.__func__ is not torch.Tensor.__deepcopy__
    assert tensor.__deepcopy__.__func__ is vars(torch.Tensor)["__deepcopy__"]._self_bound


def test_a_bound_deepcopy_by_keyword_copies_a_tensor_with_history() -> None:
    """`t.__deepcopy__(memo=m)`, torch's signature by keyword, detaches as deepcopy does."""
    tensor = as_nonleaf(torch.randn(3, requires_grad=True))
    memo: Dict[int, Any] = {}
    copied = tensor.__deepcopy__(memo=memo)
    assert_detached_twin(tensor, copied)
    assert memo[id(tensor)] is copied


def test_fake_tensor_copy_mode_compares_identity() -> None:
    fake_tensor = pytest.importorskip("torch._subclasses.fake_tensor")
    with fake_tensor.FakeTensorMode() as mode:
        fake = mode.from_tensor(torch.randn(2, 3))
        copied = copy.deepcopy(fake)
    assert isinstance(copied, fake_tensor.FakeTensor)
    assert copied.shape == (2, 3)


class Logged(torch.Tensor):
    """A __torch_function__ subclass: deepcopy reaches the patch through the redispatch path."""

    calls: ClassVar[Dict[str, int]] = {}

    @classmethod
    def __torch_function__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        name = getattr(func, "__name__", str(func))
        cls.calls[name] = cls.calls.get(name, 0) + 1
        return super().__torch_function__(func, types, args, kwargs or {})

    def new_empty(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        return super().new_empty(*args, **kwargs).as_subclass(Logged)


def test_torch_function_subclass_goes_through_redispatch() -> None:
    y = (torch.randn(3, requires_grad=True) * 2).as_subclass(Logged)
    assert not y.is_leaf
    Logged.calls.clear()
    c = copy.deepcopy(y)
    assert type(c) is Logged and c.is_leaf and c.requires_grad
    assert Logged.calls.get("__deepcopy__") == 1


def test_torch_deepcopy_behaviours_stay_green() -> None:
    """What torch's own deepcopy tests check, with the shim on (our own rendition)."""
    a = torch.randn(5, 5)
    b = torch.randn(5, 5)
    c = a.view(25)
    q = [a, [a.untyped_storage()], b, c]
    w = copy.deepcopy(q)
    assert torch.equal(w[0], q[0]) and torch.equal(w[2], q[2])
    assert w[1][0].data_ptr() == w[0].untyped_storage().data_ptr()  # storage memo kept
    assert w[3].untyped_storage().data_ptr() == w[0].untyped_storage().data_ptr()
    scalar = torch.tensor(5.0)
    assert copy.deepcopy(scalar).shape == scalar.shape and copy.deepcopy(scalar).item() == 5.0
    state = torch.nn.Linear(10, 1).state_dict(keep_vars=True)
    assert all(type(v) is torch.nn.Parameter for v in copy.deepcopy(state).values())
    qt = torch.quantize_per_tensor(torch.randn(4), 0.1, 2, torch.quint8)
    assert torch.equal(copy.deepcopy(qt).int_repr(), qt.int_repr())
    nested = torch.randn(3, requires_grad=True)
    nested.grad = torch.randn(3)
    assert torch.equal(copy.deepcopy(nested).grad, nested.grad)
    meta = torch.empty(2, 3, device="meta")
    assert copy.deepcopy(meta).device.type == "meta"


def test_native_error_when_no_mode_is_active() -> None:
    deepcopy_shim.disable()
    with deepcopy_shim.enabled("silent"):
        pass
    with pytest.raises(RuntimeError, match="graph leaves"):
        copy.deepcopy(as_nonleaf(torch.randn(2)))


def test_source_is_never_modified() -> None:
    x = torch.randn(4, requires_grad=True)
    y = x * 2
    y.retain_grad()
    grad_fn = y.grad_fn
    before = (y.detach().clone(), y.requires_grad, y.is_leaf, y.untyped_storage().data_ptr())
    copy.deepcopy(y)
    assert y.grad_fn is grad_fn
    after = (y.detach().clone(), y.requires_grad, y.is_leaf, y.untyped_storage().data_ptr())
    assert torch.equal(before[0], after[0]) and before[1:] == after[1:]


_DTYPES = st.sampled_from([torch.float32, torch.float64, torch.complex64])


@st.composite
def views(draw: Any) -> Any:
    shape = draw(st.lists(st.integers(1, 5), min_size=1, max_size=4))
    base = torch.randn(*shape).to(draw(_DTYPES))
    y = base.requires_grad_(True) * 1.5
    view = y
    for _ in range(draw(st.integers(0, 3))):
        op = draw(st.sampled_from(["t", "slice", "select", "expand", "conj", "unsqueeze"]))
        if op == "t" and view.dim() >= 2:
            view = view.transpose(0, view.dim() - 1)
        elif op == "slice" and view.shape[0] > 1:
            view = view[draw(st.integers(0, view.shape[0] - 1)):: draw(st.integers(1, 2))]
        elif op == "select" and view.dim() > 1:
            view = view[draw(st.integers(0, view.shape[0] - 1))]
        elif op == "expand":
            view = view.unsqueeze(0).expand(2, *view.shape)
        elif op == "conj" and view.is_complex():
            view = view.conj()
        elif op == "unsqueeze":
            view = view.unsqueeze(-1)
    return y, view


@settings(max_examples=60, deadline=None)
@given(views())
def test_property_copy_equals_detach_and_keeps_aliasing(pair: Any) -> None:
    base, view = pair
    c_base, c_view = copy.deepcopy((base, view))
    assert_detached_twin(base, c_base)
    assert_detached_twin(view, c_view)
    a_base, a_view = copy.deepcopy((base.detach(), view.detach()))  # the aliases, one memo
    shared = a_view.untyped_storage().data_ptr() == a_base.untyped_storage().data_ptr()
    assert (c_view.untyped_storage().data_ptr() == c_base.untyped_storage().data_ptr()) == shared
    assert torch.equal(c_view.detach().resolve_conj(), view.detach().resolve_conj())


# --- what mutation testing of the tensor copier found unpinned --------------------------------


@pytest.mark.parametrize("bit", ["conj", "neg"])
def test_a_lazy_conj_or_neg_tensor_keeps_its_retained_grad(bit: str) -> None:
    x = torch.randn(3, dtype=torch.complex64, requires_grad=True)
    y = (x * 2).conj() if bit == "conj" else torch._neg_view(x * 2)
    y.retain_grad()
    (y.abs() ** 2).sum().backward()
    with deepcopy_shim.enabled("silent"):
        made = copy.deepcopy(y)
    alias = copy.deepcopy(y.detach())  # torch resolves the bit on a leaf's copy
    assert (made.is_conj(), made.is_neg()) == (alias.is_conj(), alias.is_neg())
    assert made.grad is not None and made.grad is not y.grad and torch.equal(made.grad, y.grad)


class Labelled(torch.Tensor):
    """A subclass with slots (one set, one left unset) that torch can deep-copy as a leaf."""

    __slots__ = ("label", "unset")

    def new_empty(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        return super().new_empty(*args, **kwargs).as_subclass(Labelled)


def test_a_subclass_with_history_keeps_its_slots_as_torch_keeps_a_leafs() -> None:
    leaf = torch.ones(2).as_subclass(Labelled)
    leaf.label = {"name": "leaf"}
    native = copy.deepcopy(leaf)
    assert native.label == leaf.label and not hasattr(native, "unset")
    t = as_nonleaf(torch.ones(2)).as_subclass(Labelled)
    t.label = {"name": "act"}
    with deepcopy_shim.enabled("silent"):
        made = copy.deepcopy(t)
    assert type(made) is Labelled and made.label == {"name": "act"} and made.label is not t.label
    assert not hasattr(made, "unset")


class Unbuildable(torch.Tensor):  # torch cannot deep-copy it even as a leaf (no new_empty)
    pass


@pytest.mark.parametrize("mode", ["warn", "silent"])
def test_a_tensor_whose_detached_copy_fails_leaves_the_memo_plain_at_once(mode: str) -> None:
    t = as_nonleaf(torch.ones(3)).as_subclass(Unbuildable)
    memo: Dict[Any, Any] = {}
    with deepcopy_shim.enabled(mode):
        with pytest.raises(deepcopy_shim.DetachedCopyError):
            copy.deepcopy(t, memo)
        assert type(dict.get(memo, id(memo), [])) is list  # before the scope ends
