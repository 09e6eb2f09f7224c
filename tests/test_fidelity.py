"""Fidelity guard: the shim's copy of a leaf-only object equals native ``copy.deepcopy``'s copy.

Native deepcopy works on every object in the corpus (``support.corpus``; no tensor has autograd
history), so its result is the reference, compared object by object by ``support.graphdiff``.
The tests at the end plant each kind of difference and check that the differ reports it.
"""

from __future__ import annotations

import copy
import copyreg
import gc
import types
import warnings
from collections import OrderedDict
from typing import Any, Callable, Dict, Optional, Tuple

import pytest
import torch
import torch.nn as nn
from support.corpus import (
    CORPUS,
    CORPUS_NEEDS,
    NN_ARGS,
    NN_NEWER_THAN_2_0,
    NN_SKIPPED,
    Block,
    CustomGetstate,
    CustomReduce,
    CustomSetstate,
    Hooked,
    MixinAfterModule,
    OwnDeepcopy,
    Shape,
    Tensors,
    Tied,
    build_nn,
    nn_classes,
)
from support.graphdiff import GraphDiff, Mismatch, assert_same_as_native, native_and_shim
from support.models import Name, reshuffled_set

import deepcopy_shim

pytestmark = [
    pytest.mark.filterwarnings("ignore::UserWarning"),
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
]


def test_every_nn_class_is_covered() -> None:
    for name in nn_classes():
        if name in NN_SKIPPED or name in NN_ARGS:
            continue
        try:
            build_nn(name)
        except TypeError as exc:  # pragma: no cover - only on a torch release with a new layer
            pytest.fail(f"torch.nn.{name} needs constructor arguments: add it to NN_ARGS ({exc})")
    unknown = set(NN_ARGS) - set(nn_classes()) - NN_NEWER_THAN_2_0
    assert not unknown, f"NN_ARGS names classes torch.nn lacks: {sorted(unknown)}"


@pytest.mark.parametrize("name", [n for n in nn_classes() if n not in NN_SKIPPED])
def test_nn_layer(name: str) -> None:
    module = build_nn(name)
    assert_same_as_native(module)
    assert_same_as_native(module.eval())


@pytest.mark.parametrize("name", sorted(NN_SKIPPED))
def test_shim_fails_like_native_where_native_fails(name: str) -> None:
    module = build_nn(name)
    with pytest.raises(Exception) as native:
        copy.deepcopy(module)
    with deepcopy_shim.enabled("silent"), pytest.raises(Exception) as shim:
        copy.deepcopy(module)
    assert type(shim.value) is type(native.value) and str(shim.value) == str(native.value)


@pytest.mark.parametrize("name", ["Linear", "LSTM", "TransformerEncoder", "BatchNorm1d"])
@pytest.mark.parametrize("mode", ["warn", "strict"])
def test_every_mode_copies_leaf_only_models_like_native(name: str, mode: str) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error", deepcopy_shim.DeepcopyShimWarning)
        assert_same_as_native(build_nn(name), mode)


@pytest.mark.parametrize(
    "name",
    [
        pytest.param(n, marks=pytest.mark.skipif(not CORPUS_NEEDS[n][0], reason=CORPUS_NEEDS[n][1]))
        if n in CORPUS_NEEDS else n
        for n in sorted(CORPUS)
    ],
)
def test_corpus(name: str) -> None:
    source = CORPUS[name]()
    if isinstance(source, dict) and "t" in source:
        source["view"] = source["t"][1:]
    diff = assert_same_as_native(source)
    assert diff.compared_tensors > 0


def test_copyreg_registrations_are_honoured() -> None:
    def reduce_ordered_dict(od: OrderedDict) -> Any:  # type: ignore[type-arg]
        return (OrderedDict, (), {"via_copyreg": True}, None, iter(od.items()))

    copyreg.pickle(OrderedDict, reduce_ordered_dict)
    try:
        diff = assert_same_as_native(nn.Sequential(Block(), Block()))
        assert diff.native[0]._forward_hooks.via_copyreg
    finally:
        del copyreg.dispatch_table[OrderedDict]


def test_set_registered_with_copyreg_is_honoured() -> None:
    copyreg.pickle(set, lambda value: (set, (["via copyreg"],)))
    try:
        diff = assert_same_as_native(Shape())
        assert diff.native.names == {"via copyreg"}
    finally:
        del copyreg.dispatch_table[set]


def test_copying_leaves_the_source_containers_untouched() -> None:
    """The shortcuts read nothing that would create state on the source (an instance dict).

    Only the empty OrderedDicts the shortcut handles are compared: a non-empty one goes through
    deepcopy's own reduction, which on Python 3.9 materialises an empty instance dict on it,
    natively just the same (torch 2.0 keeps _parameters/_buffers/_modules in OrderedDicts).
    """
    model = nn.Sequential(Block(), Shape())
    before = {id(d): gc.get_referents(d) for m in model.modules() for d in vars(m).values()
              if isinstance(d, OrderedDict) and not d}
    with deepcopy_shim.enabled("silent"):
        copy.deepcopy(model)
    after = {id(d): gc.get_referents(d) for m in model.modules() for d in vars(m).values()
             if isinstance(d, OrderedDict) and not d}
    assert after == before


def _instance_dicts(tensor: torch.Tensor) -> int:
    # Counted among its GC referents: asking for `__dict__` would make one.
    return sum(type(ref) is dict for ref in gc.get_referents(tensor))


@pytest.mark.parametrize("mode", [None, "silent", "warn", "strict"])
def test_copying_makes_no_instance_dict_on_a_source_parameter(mode: Optional[str]) -> None:
    """Native deepcopy finds `Parameter.__deepcopy__` without making the parameter an instance
    dict; neither does the shim's copy of a module's parameters, in any mode (found by the
    issue 18 profile: the shortcut once asked for `item.__dict__`)."""
    model = nn.Sequential(nn.Linear(3, 3), nn.LayerNorm(3), nn.ModuleDict({"x": nn.Linear(2, 2)}))
    params = list(model.parameters())
    assert [_instance_dicts(p) for p in params] == [0] * len(params)
    if mode is None:
        copied = copy.deepcopy(model)
    else:
        with deepcopy_shim.enabled(mode):
            copied = copy.deepcopy(model)
    assert [_instance_dicts(p) for p in params] == [0] * len(params)
    assert all(type(p) is nn.Parameter for p in copied.parameters())


def test_fidelity_covers_the_custom_protocol_classes_natively() -> None:
    """The corpus's custom classes really use their own protocols (in both copies)."""
    custom = [CustomGetstate(), CustomSetstate(), CustomReduce(), OwnDeepcopy(), MixinAfterModule()]
    native, shim = native_and_shim(nn.ModuleList(custom))
    for copied in (native, shim):
        assert copied[0].cache is None and copied[1].restored and copied[2].note == "reduced"
        assert copied[3].custom and copied[4].via_mixin


def test_hooks_in_the_copy_are_bound_to_the_copy() -> None:
    source = Hooked()
    _, shim = native_and_shim(source)
    hooks = list(shim.block.fc._forward_hooks.values())
    assert hooks and all(h.__self__ is shim for h in hooks if isinstance(h, types.MethodType))
    assert shim.recorder.owner is shim
    assert shim.handles[0].hooks_dict_ref() is shim.block.fc._forward_pre_hooks


# --- the differ really compares ------------------------------------------------------------


Plant = Callable[[Any, Any], None]  # (source, copy) -> None: changes the copy


def _planted(source: Any, plant: Plant) -> GraphDiff:
    """A GraphDiff between two native copies of ``source``, the second changed by ``plant``."""
    native, other = copy.deepcopy(source), copy.deepcopy(source)
    plant(source, other)
    return GraphDiff(source, native, other)


def _set(attr: str, make: Callable[[Any, Any], Any]) -> Plant:
    return lambda s, c: setattr(c, attr, make(s, c))


def _in_storage_of(tensor: torch.Tensor, size: int) -> torch.Tensor:
    """``tensor``'s values at its offset, in a storage of ``size`` elements."""
    out = torch.zeros(size, dtype=tensor.dtype)[tensor.storage_offset():][: tensor.numel()]
    out.copy_(tensor)
    return out


# name: (what the plant changes in a copy of Tensors(), the words the differ must say)
TENSOR_PLANTS: Dict[str, Tuple[Plant, str]] = {
    "value": (lambda s, c: c.base.data.__setitem__((0, 0), 99.0), "tensor values"),
    "nan_vs_number": (lambda s, c: c.nan.data.__setitem__(0, 0.0), "tensor values"),
    "stride": (_set("transposed", lambda s, c: nn.Parameter(c.transposed.contiguous())), "stride"),
    "dtype": (_set("counts", lambda s, c: c.counts.int()), "dtype"),
    "requires_grad": (lambda s, c: c.frozen.requires_grad_(True), "requires_grad"),
    "tensor_shared_with_source": (_set("plain_tensor", lambda s, c: s.plain_tensor), "the source"),
    "storage_shared_via_view": (_set("plain_tensor", lambda s, c: s.plain_tensor[:]), "shares"),
    "aliasing_lost": (_set("base", lambda s, c: c.base.clone()), "aliasing"),
    "aliasing_added": (_set("plain_tensor", lambda s, c: c.base[0, :2]), "aliasing"),
    "storage_offset": (_set("tail", lambda s, c: c.tail.clone()), "storage_offset"),
    "storage_size": (_set("tail", lambda s, c: _in_storage_of(c.tail, 12)), "storage size"),
    "grad": (lambda s, c: setattr(c.leaf_with_grad, "grad", None), "attributes"),
    "conj_bit": (_set("conj", lambda s, c: c.conj.conj()), "is_conj"),
}

# The same for a copy of Tied().
STRUCTURE_PLANTS: Dict[str, Tuple[Plant, str]] = {
    "tie_broken": (
        lambda s, c: setattr(c.decode, "weight", nn.Parameter(c.embed.weight.detach().clone())),
        "identity",
    ),
    "shared_submodule_split": (_set("dec", lambda s, c: copy.deepcopy(c.enc)), "identity"),
    "cycle_points_at_source": (lambda s, c: c.meta.__setitem__("owner", s), "identity"),
    "shares_a_source_submodule": (_set("stack", lambda s, c: s.stack), "with the source"),
    "extra_attribute": (_set("added", lambda s, c: 1), "attributes"),
    "attribute_order": (
        lambda s, c: c.__dict__.update(training=c.__dict__.pop("training")), "attributes"
    ),
    "type": (_set("enc", lambda s, c: nn.Identity()), "type"),
    "int_value": (lambda s, c: setattr(c.embed, "num_embeddings", 11), "with the source"),
    "float_value": (lambda s, c: setattr(c.embed, "max_norm", 1.0), "identity structure"),
    "split_objects": (lambda s, c: c.meta.__setitem__("blocks", [c.enc, c.stack[1]]), "identity"),
    "merged_objects": (lambda s, c: c.stack.__setitem__(1, c.enc), "reuses one object"),
}


@pytest.mark.parametrize("name", sorted(TENSOR_PLANTS))
def test_differ_catches_tensor_differences(name: str) -> None:
    plant, message = TENSOR_PLANTS[name]
    source = Tensors()
    GraphDiff(source, copy.deepcopy(source), copy.deepcopy(source)).check()  # no false alarm
    with pytest.raises(Mismatch, match=message):
        _planted(source, plant).check()


@pytest.mark.parametrize("name", sorted(STRUCTURE_PLANTS))
def test_differ_catches_structure_differences(name: str) -> None:
    plant, message = STRUCTURE_PLANTS[name]
    source = Tied()
    GraphDiff(source, copy.deepcopy(source), copy.deepcopy(source)).check()
    with pytest.raises(Mismatch, match=message):
        _planted(source, plant).check()


def test_differ_catches_hook_bound_to_the_source() -> None:
    source = Hooked()

    def plant(src: Any, c: Any) -> None:
        key = next(iter(c.block.fc._forward_hooks))
        c.block.fc._forward_hooks[key] = src.post

    with pytest.raises(Mismatch, match="identity structure"):
        _planted(source, plant).check()


def test_differ_catches_an_attribute_name_shared_with_the_source() -> None:
    """An instance-dict key that is not a plain str is compared as an object: a copy holding
    the source's own key object under the right name is caught."""
    source = Tied()
    setattr(source, Name("odd"), [1])
    GraphDiff(source, copy.deepcopy(source), copy.deepcopy(source)).check()

    def plant(src: Any, c: Any) -> None:
        value = vars(c).pop("odd")
        vars(c)[next(k for k in vars(src) if type(k) is Name)] = value  # the source's key

    with pytest.raises(Mismatch, match=r"<attribute key #.*the source"):
        _planted(source, plant).check()


def test_differ_catches_a_set_that_iterates_in_another_order() -> None:
    """Equal sets whose tables iterate differently are a difference: a copy of the source's
    table (`set.copy()`) is not what deepcopy makes (a new set filled in the source's order)."""
    source = Tied()
    source.names = reshuffled_set()
    GraphDiff(source, copy.deepcopy(source), copy.deepcopy(source)).check()
    with pytest.raises(Mismatch, match="set members' order"):
        _planted(source, lambda s, c: setattr(c, "names", s.names.copy())).check()


def test_differ_catches_a_missing_hook() -> None:
    source = Hooked()
    with pytest.raises(Mismatch, match="attributes/items"):
        _planted(source, lambda s, c: c.block.fc._forward_pre_hooks.popitem()).check()

