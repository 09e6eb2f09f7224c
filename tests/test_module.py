"""Copying modules: rebuilt from their state, for every kind of model that produces non-leaf tensors."""

from __future__ import annotations

import copy
import types
from collections import OrderedDict
from typing import Any, Dict, Iterator, List, Tuple

import pytest
import torch
import torch.nn as nn
from support.graphdiff import GraphDiff
from support.models import (
    CachedActivationsNet,
    cached_activations_net,
    native_refuses,
    needs_parametrizations_weight_norm,
)

import deepcopy_shim

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning:torch")


@pytest.fixture(autouse=True)
def silent() -> Iterator[None]:
    deepcopy_shim.enable("silent")
    yield


def snapshot(obj: Any) -> Dict[str, Any]:
    """Everything observable about a module's tensors and attributes, to prove it never changes."""
    out: Dict[str, Any] = {}
    for module_name, module in obj.named_modules(remove_duplicate=False):
        for key, value in vars(module).items():
            name = f"{module_name}:{key}"
            if isinstance(value, torch.Tensor):
                out[name] = (
                    id(value), value.is_leaf, value.grad_fn, value.requires_grad, value.detach().clone()
                )
            elif isinstance(value, dict):
                out[name] = (id(value), {k: id(v) for k, v in value.items()})
            else:
                out[name] = id(value)
        for pname, p in module.named_parameters(recurse=False):
            out[f"{module_name}:param:{pname}"] = (id(p), p.detach().clone(), p.grad)
    return out


def assert_same_snapshot(a: Dict[str, Any], b: Dict[str, Any]) -> None:
    assert a.keys() == b.keys()
    for key in a:
        x, y = a[key], b[key]
        if isinstance(x, tuple):
            assert len(x) == len(y), key
            for u, v in zip(x, y):
                if isinstance(u, torch.Tensor):
                    assert torch.equal(u, v), key
                else:
                    assert u is v or u == v, key
        else:
            assert x == y, key


def assert_independent_copy(src: nn.Module, dst: nn.Module) -> None:
    assert type(dst) is type(src)
    assert dst.state_dict().keys() == src.state_dict().keys()
    src_ptrs = {t.untyped_storage().data_ptr() for t in src.state_dict().values() if t.numel()}
    for name, value in dst.state_dict(keep_vars=True).items():
        assert torch.equal(value.detach(), src.state_dict()[name].detach()), name
        if value.numel():
            assert value.untyped_storage().data_ptr() not in src_ptrs, name
    for (n1, p1), (n2, p2) in zip(src.named_parameters(), dst.named_parameters()):
        assert n1 == n2 and p1 is not p2 and p2.requires_grad == p1.requires_grad


def test_cached_outputs_in_attributes_dicts_and_lists(cached_net: CachedActivationsNet) -> None:
    before = snapshot(cached_net)
    c = copy.deepcopy(cached_net)
    assert_same_snapshot(before, snapshot(cached_net))
    assert_independent_copy(cached_net, c)
    for src, dst in [
        (cached_net.head.last_out, c.head.last_out),
        (cached_net.cache["mid"], c.cache["mid"]),
        (cached_net.cache["list"][0], c.cache["list"][0]),
    ]:
        assert dst.is_leaf and dst.requires_grad and torch.equal(dst, src.detach())


def test_copy_trains_independently(cached_net: CachedActivationsNet) -> None:
    before = snapshot(cached_net)
    c = copy.deepcopy(cached_net)
    opt = torch.optim.SGD(c.parameters(), lr=0.5)
    c(torch.randn(3, 4)).sum().backward()
    c.head.last_out.sum()  # the cached copy is usable on its own
    opt.step()
    assert all(p.grad is None for p in cached_net.parameters())
    assert_same_snapshot(before, snapshot(cached_net))
    assert not torch.equal(c.fc.weight, cached_net.fc.weight)


def test_hook_based_weight_norm_before_any_forward() -> None:
    layer = torch.nn.utils.weight_norm(nn.Linear(5, 3))
    assert not layer.weight.is_leaf and native_refuses(layer)
    c = copy.deepcopy(layer)
    assert c.weight.is_leaf and torch.equal(c.weight, layer.weight.detach())
    x = torch.randn(2, 5)
    assert torch.allclose(c(x), layer(x))
    with torch.no_grad():
        c.weight_g.mul_(2)
    assert not torch.allclose(c(x), layer(x))  # the copy's hook uses the copy's parameters


@pytest.mark.parametrize("train", [True, False])
def test_hook_based_spectral_norm_after_forward(train: bool) -> None:
    torch.manual_seed(0)
    layer = torch.nn.utils.spectral_norm(nn.Linear(5, 4))
    layer.train(train)
    layer(torch.randn(3, 5))
    assert not layer.weight.is_leaf and native_refuses(layer)
    before = snapshot(layer)
    c = copy.deepcopy(layer)
    assert_same_snapshot(before, snapshot(layer))
    assert c.training is train
    assert torch.equal(c.weight_u, layer.weight_u) and c.weight_u is not layer.weight_u
    c.eval()
    layer.eval()
    x = torch.randn(2, 5)
    assert torch.allclose(c(x), layer(x))


@pytest.mark.parametrize(
    "first",
    [pytest.param("weight_norm", marks=needs_parametrizations_weight_norm), "spectral_norm"],
)
def test_parametrizations_weight_norm_and_orthogonal(first: str) -> None:
    from torch.nn.utils import parametrizations

    wn = getattr(parametrizations, first)(nn.Linear(4, 4))
    orth = parametrizations.orthogonal(nn.Linear(4, 4))
    model = nn.Sequential(wn, orth)
    model(torch.randn(2, 4))
    c = copy.deepcopy(model)
    x = torch.randn(3, 4)
    assert torch.allclose(c(x), model(x), atol=1e-6)
    assert c.state_dict().keys() == model.state_dict().keys()


@pytest.mark.parametrize("cls", [nn.LSTM, nn.GRU])
def test_rnns_with_flat_weights(cls: type) -> None:
    class Cached(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.rnn = cls(4, 6, num_layers=2, batch_first=True)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            out, self.state = self.rnn(x)
            return out

    model = Cached()
    x = torch.randn(2, 3, 4)
    model(x)
    assert native_refuses(model)
    c = copy.deepcopy(model)
    assert torch.allclose(c(x), model(x))
    for p_src, p_dst in zip(model.rnn._flat_weights, c.rnn._flat_weights):
        assert p_dst is not p_src and torch.equal(p_dst, p_src)
    assert {id(p) for p in c.rnn._flat_weights} == {id(p) for p in c.rnn.parameters()}


def test_transformer_encoder_clones_a_layer_with_a_cache() -> None:
    layer = nn.TransformerEncoderLayer(d_model=8, nhead=2, dim_feedforward=16, batch_first=True)
    layer.cached = layer.linear1(torch.randn(2, 8))  # a layer that cached an activation
    assert native_refuses(layer)
    encoder = nn.TransformerEncoder(layer, num_layers=3, enable_nested_tensor=False)
    assert len(encoder.layers) == 3
    assert all(m.cached.is_leaf for m in encoder.layers)
    ptrs = {m.linear1.weight.data_ptr() for m in encoder.layers}
    assert len(ptrs) == 3 and layer.linear1.weight.data_ptr() not in ptrs
    encoder.eval()
    layer.eval()
    x = torch.randn(2, 5, 8)
    out = x
    for _ in range(3):
        out = layer(out)
    assert torch.allclose(encoder(x), out, atol=1e-5)


def test_lazy_modules_uninitialized_and_initialized() -> None:
    lazy = nn.LazyLinear(3)
    c = copy.deepcopy(lazy)
    assert isinstance(c.weight, nn.parameter.UninitializedParameter)
    c(torch.randn(2, 5))
    assert c.weight.shape == (3, 5) and isinstance(lazy.weight, nn.parameter.UninitializedParameter)
    lazy(torch.randn(2, 7))
    lazy.out = lazy(torch.randn(1, 7))
    c2 = copy.deepcopy(lazy)
    assert c2.weight.shape == (3, 7) and c2.out.is_leaf


def test_fx_graph_module_keeps_its_own_deepcopy() -> None:
    gm = torch.fx.symbolic_trace(nn.Sequential(nn.Linear(3, 3), nn.ReLU()))
    linear = gm.get_submodule("0")
    linear.cached = linear(torch.randn(2, 3))
    assert native_refuses(gm)
    c = copy.deepcopy(gm)
    assert isinstance(c, torch.fx.GraphModule)
    assert c.get_submodule("0").cached.is_leaf
    x = torch.randn(2, 3)
    assert torch.allclose(c(x), gm(x))


def test_scripted_module_keeps_its_own_deepcopy() -> None:
    scripted = torch.jit.script(nn.Linear(3, 2))
    c = copy.deepcopy(scripted)
    x = torch.randn(4, 3)
    assert torch.allclose(c(x), scripted(x))
    assert c.weight.data_ptr() != scripted.weight.data_ptr()


def test_model_and_optimizer_copied_together(cached_net: CachedActivationsNet) -> None:
    opt = torch.optim.Adam(cached_net.parameters(), lr=1e-2)
    cached_net(torch.randn(3, 4)).sum().backward()
    opt.step()
    cached_net(torch.randn(3, 4))  # re-cache activations after the step
    bundle = copy.deepcopy({"model": cached_net, "opt": opt})
    model, new_opt = bundle["model"], bundle["opt"]
    copied_params = {id(p) for p in model.parameters()}
    assert {id(p) for g in new_opt.param_groups for p in g["params"]} == copied_params
    assert set(map(id, new_opt.state.keys())) == copied_params
    for p_src, p_dst in zip(cached_net.parameters(), model.parameters()):
        assert torch.equal(new_opt.state[p_dst]["exp_avg"], opt.state[p_src]["exp_avg"])
    model(torch.randn(3, 4)).sum().backward()
    new_opt.step()


def test_hooks_are_rebound_to_the_copy() -> None:
    seen: List[str] = []

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(2, 2)
            self.fc.register_forward_hook(self.remember)
            self.handle = self.fc.register_forward_pre_hook(lambda m, i: seen.append("pre"))

        def remember(self, module: nn.Module, inp: Any, out: torch.Tensor) -> None:
            self.last = out

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.fc(x)

    net = Net()
    net(torch.randn(1, 2))
    c = copy.deepcopy(net)
    c(torch.randn(1, 2))
    assert c.last is not net.last and c.last.grad_fn is not None
    (hook,) = c.fc._forward_hooks.values()
    assert hook.__self__ is c
    c.handle.remove()
    assert not c.fc._forward_pre_hooks and len(net.fc._forward_pre_hooks) == 1


def test_tied_weights_shared_submodules_and_cycles() -> None:
    class Tied(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Embedding(10, 4)
            self.out = nn.Linear(4, 10, bias=False)
            self.out.weight = self.embed.weight
            shared = nn.Linear(4, 4)
            self.a, self.b = shared, shared
            self.meta = {"owner": self}

    model = Tied()
    model.act = model.embed(torch.tensor([1, 2]))
    c = copy.deepcopy(model)
    assert c.out.weight is c.embed.weight
    assert c.a is c.b
    assert c.meta["owner"] is c
    assert c.state_dict().keys() == model.state_dict().keys()


def test_buffers_persistent_and_not_and_training_flag() -> None:
    class Buffers(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.bn = nn.BatchNorm1d(3)
            self.register_buffer("scratch", torch.zeros(2), persistent=False)
            self.register_buffer("computed", torch.ones(2, requires_grad=True) * 2)

    model = Buffers().eval()
    assert native_refuses(model)
    c = copy.deepcopy(model)
    assert not c.training and not c.bn.training
    assert c._non_persistent_buffers_set == {"scratch"}
    assert c.computed.is_leaf and torch.equal(c.computed, torch.full((2,), 2.0))
    assert dict(c.named_buffers()).keys() == dict(model.named_buffers()).keys()


def test_custom_getstate_module_uses_the_faithful_path() -> None:
    class Custom(nn.Linear):
        def __getstate__(self) -> Dict[str, Any]:
            # nn.Module.__getstate__ is new in torch 2.1 and object.__getstate__ in Python 3.11:
            # on torch 2.0 with Python < 3.11 there is no __getstate__ to call.
            if hasattr(super(), "__getstate__"):
                state = super().__getstate__()
            else:
                state = dict(self.__dict__)
            state["restored_by_getstate"] = True
            return state

    m = Custom(2, 2)
    m.out = m(torch.randn(1, 2))
    c = copy.deepcopy(m)
    assert c.restored_by_getstate and c.out.is_leaf


def test_slots_module_uses_the_faithful_path() -> None:
    class Slotted(nn.Linear):
        __slots__ = ("extra",)

    m = Slotted(2, 2)
    m.extra = torch.ones(2)
    deepcopy_shim.disable()
    if "__getstate__" not in vars(nn.Module):
        # torch 2.0's nn.Module has no __getstate__: object.__getstate__ gives (dict, slots) and
        # Module.__setstate__ fails on it, natively. The faithful path must fail the same way.
        with pytest.raises(ValueError) as native_error:
            copy.deepcopy(m)
        deepcopy_shim.enable("silent")
        with pytest.raises(ValueError) as shim_error:
            copy.deepcopy(m)
        assert str(shim_error.value) == str(native_error.value)
        return
    native = copy.deepcopy(m)
    deepcopy_shim.enable("silent")
    c = copy.deepcopy(m)
    # nn.Module.__getstate__ returns only __dict__, so native deepcopy drops slots: so do we.
    assert hasattr(c, "extra") == hasattr(native, "extra")
    assert vars(c).keys() == vars(native).keys()


def test_averaged_model_swa() -> None:
    from torch.optim.swa_utils import AveragedModel

    net = cached_activations_net()
    assert native_refuses(net)
    swa = AveragedModel(net)
    swa.update_parameters(net)
    assert torch.equal(swa.module.fc.weight, net.fc.weight)


def test_quantize_dynamic_not_inplace() -> None:
    from torch.ao.quantization import quantize_dynamic

    net = cached_activations_net().eval()
    q = quantize_dynamic(net, {nn.Linear}, dtype=torch.qint8, inplace=False)
    assert type(net.fc) is nn.Linear and type(q.fc) is not nn.Linear
    x = torch.randn(2, 4)
    assert torch.allclose(q(x), net(x), atol=0.1)


def test_native_path_when_patch_installed_but_no_mode_active(cached_net: CachedActivationsNet) -> None:
    deepcopy_shim.disable()
    with deepcopy_shim.enabled("silent"):
        plain = nn.Sequential(nn.Linear(2, 2))
        copied_inside = copy.deepcopy(plain)
    assert isinstance(copied_inside, nn.Sequential)
    assert native_refuses(cached_net)


def test_pre_and_post_copy_results_equal_native_for_leaf_only_models() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 3), nn.LayerNorm(3), nn.ReLU())
    deepcopy_shim.disable()
    native = copy.deepcopy(model)
    deepcopy_shim.enable("silent")
    shim = copy.deepcopy(model)
    x = torch.randn(2, 3)
    assert torch.equal(native(x), shim(x))
    pairs: List[Tuple[nn.Module, nn.Module]] = list(zip(native.modules(), shim.modules()))
    for a, b in pairs:
        assert type(a) is type(b) and vars(a).keys() == vars(b).keys()


# --- the fast path and its faithful fallback: observed, not only their results ---------------


class OwnState(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(2, 2)
        self.restored = False

    def __getstate__(self) -> Dict[str, Any]:
        return dict(self.__dict__)

    def __setstate__(self, state: Dict[str, Any]) -> None:
        super().__setstate__(state)
        self.restored = True


def test_a_class_with_its_own_state_protocol_is_rebuilt_from_the_state_it_gives(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The fast path copies whatever state dict the reduction gives (a `__getstate__` of the
    class's own) exactly as deepcopy copies it, and gives it to the class's own `__setstate__`,
    as `copy._reconstruct` does; a reduction that is not object's own shape goes through
    `copy._reconstruct` itself."""
    rebuilt: List[type] = []
    original = copy._reconstruct  # type: ignore[attr-defined]

    def spy(x: Any, memo: Dict[int, Any], *rv: Any) -> Any:
        if isinstance(x, nn.Module):  # torch 2.0's OrderedDict `_modules` come here too, natively
            rebuilt.append(type(x))
        return original(x, memo, *rv)

    model = nn.Sequential(OwnState(), nn.Linear(2, 2), OwnReduction())
    native = copy.deepcopy(model)
    monkeypatch.setattr(copy, "_reconstruct", spy)
    copied = copy.deepcopy(model)
    assert rebuilt == [OwnReduction]  # copy._reconstruct for it; the fast path for the other modules
    assert copied[0].restored and not model[0].restored
    GraphDiff(model, native, copied).check()


class OwnReduction(nn.Module):
    """Reduces itself to its class and a state of its own making (not object's shape)."""

    def __reduce_ex__(self, protocol: Any) -> Any:
        return (OwnReduction, (), {"training": self.training, "_parameters": {}, "_buffers": {},
                                   "_modules": {}, "made": "here"})


def test_a_subclass_tensors_dict_is_copied_as_torch_copies_a_leafs_and_the_source_keeps_its_own() -> None:
    class Tagged(torch.Tensor):
        def new_empty(self, *args: Any, **kwargs: Any) -> torch.Tensor:
            return super().new_empty(*args, **kwargs).as_subclass(Tagged)

    capsule = object()
    state = {"_sym_sizes_capsule": capsule, "_sym_strides_capsule_len": 1, "note": "kept"}
    leaf = torch.ones(2).as_subclass(Tagged)
    leaf.__dict__.update(state)
    expected = copy.deepcopy(leaf).__dict__  # torch 2.13 drops its size caches; 2.0 keeps them
    t = (torch.ones(2, requires_grad=True) * 2).as_subclass(Tagged)
    t.__dict__.update(state)
    c = copy.deepcopy(t)
    assert c.__dict__.keys() == expected.keys() and c.__dict__["note"] == "kept"
    assert t.__dict__["_sym_sizes_capsule"] is capsule  # the source keeps its own, in every torch


class Tag:
    def __init__(self, name: str) -> None:
        self.name = name


def test_a_set_of_objects_is_copied_as_native_copies_it() -> None:
    model = nn.Linear(2, 2)
    model.tags = {Tag("a"), Tag("b")}
    model.names = {"a", "b"}
    native = _native_copy(model)
    copied = copy.deepcopy(model)
    assert sorted(t.name for t in copied.tags) == ["a", "b"]
    assert not {id(t) for t in copied.tags} & {id(t) for t in model.tags}  # members are copies
    assert len(native.tags) == len(copied.tags) and copied.names == {"a", "b"}
    assert copied.names is not model.names


def test_tied_parameters_stay_tied_when_parameter_deepcopy_does_not_memoise(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def forgetful(self: nn.Parameter, memo: Dict[int, Any]) -> nn.Parameter:
        return nn.Parameter(self.data.clone(), self.requires_grad)  # no memo entry

    monkeypatch.setattr(nn.Parameter, "__deepcopy__", forgetful)
    model = nn.Sequential(nn.Linear(3, 3), nn.Linear(3, 3))
    model[1].weight = model[0].weight
    copied = copy.deepcopy(model)
    assert copied[1].weight is copied[0].weight and copied[0].weight is not model[0].weight


def _native_copy(obj: Any) -> Any:
    with deepcopy_shim.enabled("off"):
        return copy.deepcopy(obj)


class Forwarding(nn.Module):
    """Forwards unknown attributes to the module it wraps, as torch.compile's OptimizedModule does."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def __getattr__(self, name: str) -> Any:
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(self.inner, name)


class OptsOut(nn.Linear):
    def __deepcopy__(self, memo: Dict[int, Any]) -> None:
        return None


def test_a_deepcopy_forwarded_by_getattr_is_used_as_natively() -> None:
    wrapped = Forwarding(OptsOut(2, 2))
    assert _native_copy(wrapped) is None  # native lookup ends in __getattr__, which forwards
    for mode in ("silent", "strict"):
        assert deepcopy_shim.deepcopy(wrapped, mode) is None
    plain = Forwarding(nn.Linear(2, 2))  # the inner module's __deepcopy__ is the shim's: not forwarded
    copied = deepcopy_shim.deepcopy(plain, "strict")
    assert type(copied) is Forwarding and copied.inner is not plain.inner


# --- hook dicts that hold hooks --------------------------------------------------------------


def _hook(module: nn.Module, args: Any, output: Any) -> None:
    pass


def test_a_hook_dict_of_functions_is_copied_as_native_copies_it() -> None:
    model = nn.Linear(2, 2)
    model.handle = model.register_forward_hook(_hook)  # refers to the hook dict, copied after it
    native = _native_copy(model)
    copied = copy.deepcopy(model)
    for made in (native, copied):
        assert made._forward_hooks is not model._forward_hooks
        assert list(made._forward_hooks.items()) == list(model._forward_hooks.items())
        assert made.handle.hooks_dict_ref() is made._forward_hooks  # memoised once
        assert vars(made).keys() == vars(model).keys()


def test_only_empty_hook_dicts_take_no_generic_copy(monkeypatch: pytest.MonkeyPatch) -> None:
    """An empty hook dict is made and memoised as deepcopy's reduction makes it, without its
    detour; one holding hooks, or instance state, is copied by deepcopy itself."""
    from deepcopy_shim import _module

    generic: List[int] = []
    original = _module._deepcopy

    def spy(value: Any, memo: Any = None) -> Any:
        generic.append(id(value))
        return original(value, memo)

    monkeypatch.setattr(_module, "_deepcopy", spy)
    model = nn.Sequential(nn.Linear(2, 2))
    model[0].register_forward_hook(_hook)
    model[0].register_forward_pre_hook(_hook)
    # torch 2.0 keeps _parameters and _modules in OrderedDicts too: those are copied
    # generically; the hook dicts are the ones asked about.
    hook_dicts = {id(value): value for value in vars(model[0]).values()
                  if type(value) is OrderedDict and value is not model[0]._parameters
                  and value is not model[0]._buffers and value is not model[0]._modules}
    with deepcopy_shim.enabled("silent"):
        copied = copy.deepcopy(model)
    assert len(hook_dicts) >= 10
    assert {i for i in generic if i in hook_dicts} == {i for i, d in hook_dicts.items() if d}
    assert list(copied[0]._forward_hooks.values()) == [_hook]
    model[0]._backward_hooks.note = "kept"  # type: ignore[attr-defined]
    generic.clear()
    with deepcopy_shim.enabled("silent"):
        copy.deepcopy(model)
    # instance state: the generic copy, which keeps it
    assert id(model[0]._backward_hooks) in generic


def test_a_hook_dict_with_instance_state_keeps_it() -> None:
    model = nn.Linear(2, 2)
    model.register_forward_hook(_hook)
    model._forward_hooks.note = ["kept"]  # type: ignore[attr-defined]
    copied = copy.deepcopy(model)
    assert copied._forward_hooks.note == ["kept"]  # type: ignore[attr-defined]
    assert copied._forward_hooks.note is not model._forward_hooks.note  # type: ignore[attr-defined]
    assert list(copied._forward_hooks.values()) == [_hook]


def test_deepcopy_dispatch_entries_are_honoured(monkeypatch: pytest.MonkeyPatch) -> None:
    """A copier registered in copy's own dispatch table replaces the shortcuts for its type."""
    seen: Dict[str, List[Any]] = {"function": [], "odict": []}

    def copy_function(value: Any, memo: Dict[int, Any]) -> Any:
        seen["function"].append(value)
        return value

    def copy_odict(value: Any, memo: Dict[int, Any]) -> Any:
        seen["odict"].append(value)
        made: Any = OrderedDict((k, copy.deepcopy(v, memo)) for k, v in value.items())
        memo[id(value)] = made
        return made

    monkeypatch.setitem(copy._deepcopy_dispatch, types.FunctionType, copy_function)  # type: ignore[attr-defined]
    model = nn.Linear(2, 2)
    model.register_forward_hook(_hook)
    copy.deepcopy(model)
    assert seen["function"] == [_hook]
    monkeypatch.setitem(copy._deepcopy_dispatch, OrderedDict, copy_odict)  # type: ignore[attr-defined]
    seen["function"].clear()
    native = _native_copy(model)
    natively = len(seen["odict"])
    seen["odict"].clear()
    copied = copy.deepcopy(model)
    assert len(seen["odict"]) == natively > 0 and seen["function"] == [_hook, _hook]
    assert vars(copied).keys() == vars(native).keys()


class RegistersAHook:
    """Registers a forward hook on `owner` when deep-copied: code the copy runs that changes a
    hook dict the copy has not reached yet."""

    def __init__(self, owner: nn.Module) -> None:
        self.owner = owner

    def __deepcopy__(self, memo: Dict[int, Any]) -> Any:
        self.owner.register_forward_hook(_hook)
        return RegistersAHook.__new__(RegistersAHook)


def _hook_dict_after_a_registrar() -> nn.Module:
    model = nn.Linear(2, 2)
    hooks = model.__dict__.pop("_forward_hooks")
    model.registrar = RegistersAHook(model)
    model.__dict__["_forward_hooks"] = hooks  # now after the registrar in the state's order
    return model


def test_a_hook_dict_changed_during_the_copy_is_copied_as_it_is_then() -> None:
    """The hook dicts are checked together before the first is copied, and again after each
    value whose copy runs other code: here the registrar's copy registers a hook on the model,
    in a hook dict that comes later, and natively that dict is copied with the hook in it."""
    native = _native_copy(_hook_dict_after_a_registrar())
    copied = copy.deepcopy(_hook_dict_after_a_registrar())
    assert list(native._forward_hooks.values()) == [_hook]
    assert list(copied._forward_hooks.values()) == [_hook]
    assert list(vars(copied)) == list(vars(native))


def test_a_module_missing_a_hook_dict_is_copied_as_native_copies_it() -> None:
    model = nn.Linear(2, 2)
    # as a module pickled by a torch before 2.0 (Module.__setstate__ adds it back, in every torch)
    del model.__dict__["_forward_hooks_with_kwargs"]
    model.__dict__["extra_hooks"] = OrderedDictWithNote()
    native = _native_copy(model)
    copied = copy.deepcopy(model)
    assert list(vars(copied)) == list(vars(native))  # Module.__setstate__ adds it back, at the end
    assert type(copied.extra_hooks) is OrderedDictWithNote and copied.extra_hooks.note == "kept"


class OrderedDictWithNote(OrderedDict):  # type: ignore[type-arg]
    def __init__(self) -> None:
        super().__init__()
        self.note = "kept"
