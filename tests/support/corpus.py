"""The fidelity corpus: every torch.nn layer, and models with structure, hooks and custom protocols.

Every object here copies natively (no tensor has autograd history), so native deepcopy's copy
is the reference the shim's copy is compared with (``support.graphdiff``).
"""

from __future__ import annotations

import functools
import inspect
import warnings
import weakref
from collections import OrderedDict
from typing import Any, Callable, Dict, List

import torch
import torch.nn as nn

CHANNELS_LAST = torch.channels_last


def _uninitialized(tensor: torch.Tensor) -> bool:
    return isinstance(tensor, nn.parameter.UninitializedTensorMixin)



# Constructor arguments for the torch.nn classes that need some (small ones).
NN_ARGS: Dict[str, Callable[[], nn.Module]] = {
    "AdaptiveAvgPool1d": lambda: nn.AdaptiveAvgPool1d(2),
    "AdaptiveAvgPool2d": lambda: nn.AdaptiveAvgPool2d((2, None)),
    "AdaptiveAvgPool3d": lambda: nn.AdaptiveAvgPool3d(2),
    "AdaptiveLogSoftmaxWithLoss": lambda: nn.AdaptiveLogSoftmaxWithLoss(8, 10, [4, 8]),
    "AdaptiveMaxPool1d": lambda: nn.AdaptiveMaxPool1d(2, return_indices=True),
    "AdaptiveMaxPool2d": lambda: nn.AdaptiveMaxPool2d(2),
    "AdaptiveMaxPool3d": lambda: nn.AdaptiveMaxPool3d(2),
    "AvgPool1d": lambda: nn.AvgPool1d(3),
    "AvgPool2d": lambda: nn.AvgPool2d(3, stride=(2, 1)),
    "AvgPool3d": lambda: nn.AvgPool3d(3),
    "BatchNorm1d": lambda: nn.BatchNorm1d(4),
    "BatchNorm2d": lambda: nn.BatchNorm2d(4, affine=False),
    "BatchNorm3d": lambda: nn.BatchNorm3d(4, track_running_stats=False),
    "Bilinear": lambda: nn.Bilinear(3, 4, 5),
    "ChannelShuffle": lambda: nn.ChannelShuffle(2),
    "CircularPad1d": lambda: nn.CircularPad1d(1),
    "CircularPad2d": lambda: nn.CircularPad2d((1, 2, 0, 1)),
    "CircularPad3d": lambda: nn.CircularPad3d(1),
    "ConstantPad1d": lambda: nn.ConstantPad1d(1, 0.5),
    "ConstantPad2d": lambda: nn.ConstantPad2d(1, 0.5),
    "ConstantPad3d": lambda: nn.ConstantPad3d(1, float("nan")),
    "Conv1d": lambda: nn.Conv1d(2, 4, 3),
    "Conv2d": lambda: nn.Conv2d(2, 4, 3, padding="same", padding_mode="reflect"),
    "Conv3d": lambda: nn.Conv3d(2, 4, 2, groups=2, bias=False),
    "ConvTranspose1d": lambda: nn.ConvTranspose1d(2, 4, 3),
    "ConvTranspose2d": lambda: nn.ConvTranspose2d(2, 4, 3, output_padding=1, stride=2),
    "ConvTranspose3d": lambda: nn.ConvTranspose3d(2, 4, 2),
    "CrossMapLRN2d": lambda: nn.CrossMapLRN2d(3),
    "DataParallel": lambda: nn.DataParallel(nn.Linear(2, 2)),
    "Embedding": lambda: nn.Embedding(10, 4, padding_idx=0),
    "EmbeddingBag": lambda: nn.EmbeddingBag(10, 4, mode="max"),
    "Fold": lambda: nn.Fold((4, 5), (2, 2)),
    "FractionalMaxPool2d": lambda: nn.FractionalMaxPool2d(2, output_ratio=0.5),
    "FractionalMaxPool3d": lambda: nn.FractionalMaxPool3d(2, output_size=3),
    "GRU": lambda: nn.GRU(3, 4, num_layers=2, bidirectional=True),
    "GRUCell": lambda: nn.GRUCell(3, 4),
    "GroupNorm": lambda: nn.GroupNorm(2, 4),
    "InstanceNorm1d": lambda: nn.InstanceNorm1d(4, affine=True, track_running_stats=True),
    "InstanceNorm2d": lambda: nn.InstanceNorm2d(4),
    "InstanceNorm3d": lambda: nn.InstanceNorm3d(4),
    "LPPool1d": lambda: nn.LPPool1d(2, 3),
    "LPPool2d": lambda: nn.LPPool2d(2, 3),
    "LPPool3d": lambda: nn.LPPool3d(2, 3),
    "LSTM": lambda: nn.LSTM(3, 4, proj_size=2, batch_first=True),
    "LSTMCell": lambda: nn.LSTMCell(3, 4),
    "LayerNorm": lambda: nn.LayerNorm([3, 4]),
    "LazyConv1d": lambda: nn.LazyConv1d(4, 3),
    "LazyConv2d": lambda: nn.LazyConv2d(4, 3),
    "LazyConv3d": lambda: nn.LazyConv3d(4, 3),
    "LazyConvTranspose1d": lambda: nn.LazyConvTranspose1d(4, 3),
    "LazyConvTranspose2d": lambda: nn.LazyConvTranspose2d(4, 3),
    "LazyConvTranspose3d": lambda: nn.LazyConvTranspose3d(4, 3),
    "LazyLinear": lambda: nn.LazyLinear(3),
    "Linear": lambda: nn.Linear(3, 4),
    "LinearCrossEntropyLoss": lambda: nn.LinearCrossEntropyLoss(4, 5),
    "LocalResponseNorm": lambda: nn.LocalResponseNorm(2),
    "MaxPool1d": lambda: nn.MaxPool1d(2),
    "MaxPool2d": lambda: nn.MaxPool2d(2, return_indices=True),
    "MaxPool3d": lambda: nn.MaxPool3d(2),
    "MaxUnpool1d": lambda: nn.MaxUnpool1d(2),
    "MaxUnpool2d": lambda: nn.MaxUnpool2d(2),
    "MaxUnpool3d": lambda: nn.MaxUnpool3d(2),
    "MultiheadAttention": lambda: nn.MultiheadAttention(8, 2, kdim=4, vdim=6),
    "PixelShuffle": lambda: nn.PixelShuffle(2),
    "PixelUnshuffle": lambda: nn.PixelUnshuffle(2),
    "RMSNorm": lambda: nn.RMSNorm(4),
    "RNN": lambda: nn.RNN(3, 4, nonlinearity="relu"),
    "RNNBase": lambda: nn.RNNBase("LSTM", 3, 4),
    "RNNCell": lambda: nn.RNNCell(3, 4),
    "RNNCellBase": lambda: nn.RNNCellBase(3, 4, bias=True, num_chunks=2),
    "ReflectionPad1d": lambda: nn.ReflectionPad1d(1),
    "ReflectionPad2d": lambda: nn.ReflectionPad2d(1),
    "ReflectionPad3d": lambda: nn.ReflectionPad3d(1),
    "ReplicationPad1d": lambda: nn.ReplicationPad1d(1),
    "ReplicationPad2d": lambda: nn.ReplicationPad2d(1),
    "ReplicationPad3d": lambda: nn.ReplicationPad3d(1),
    "SyncBatchNorm": lambda: nn.SyncBatchNorm(4),
    "Threshold": lambda: nn.Threshold(0.1, 20.0),
    "Transformer": lambda: nn.Transformer(
        d_model=8, nhead=2, num_encoder_layers=2, num_decoder_layers=2, dim_feedforward=16
    ),
    "TransformerDecoder": lambda: nn.TransformerDecoder(
        nn.TransformerDecoderLayer(8, 2, dim_feedforward=16), 2, norm=nn.LayerNorm(8)
    ),
    "TransformerDecoderLayer": lambda: nn.TransformerDecoderLayer(8, 2, dim_feedforward=16),
    "TransformerEncoder": lambda: nn.TransformerEncoder(
        nn.TransformerEncoderLayer(8, 2, dim_feedforward=16, batch_first=True), 3,
        enable_nested_tensor=False,
    ),
    "TransformerEncoderLayer": lambda: nn.TransformerEncoderLayer(
        8, 2, dim_feedforward=16, activation="gelu", norm_first=True
    ),
    "Unflatten": lambda: nn.Unflatten(1, (2, 3)),
    "Unfold": lambda: nn.Unfold(2, padding=1),
    "Upsample": lambda: nn.Upsample(scale_factor=2.0, mode="bilinear"),
    "ZeroPad1d": lambda: nn.ZeroPad1d(1),
    "ZeroPad2d": lambda: nn.ZeroPad2d((1, 0, 2, 1)),
    "ZeroPad3d": lambda: nn.ZeroPad3d(1),
}

# torch.nn classes left out of the corpus, and why.  Every other torch.nn.Module subclass
# exported by torch.nn is in it: a new torch release adding one either builds with no
# arguments or makes test_every_nn_class_is_covered fail until it gets an entry above.
_UNINITIALIZED_BUFFER = (
    "native deepcopy raises on its UninitializedBuffer (ValueError from __torch_function__); "
    "test_shim_fails_like_native_where_native_fails checks the shim raises the same"
)
NN_SKIPPED: Dict[str, str] = {
    name: _UNINITIALIZED_BUFFER
    for name in ("LazyBatchNorm1d", "LazyBatchNorm2d", "LazyBatchNorm3d",
                 "LazyInstanceNorm1d", "LazyInstanceNorm2d", "LazyInstanceNorm3d")
}


# register_forward_hook(always_call=...) is new in torch 2.1.
_ALWAYS_CALL = (
    {"always_call": True}
    if "always_call" in inspect.signature(nn.Module.register_forward_hook).parameters
    else {}
)

# torch.nn classes NN_ARGS knows that torch 2.0 does not have yet.
NN_NEWER_THAN_2_0 = frozenset((
    "CircularPad1d", "CircularPad2d", "CircularPad3d", "LPPool3d", "LinearCrossEntropyLoss",
    "RMSNorm", "ZeroPad1d", "ZeroPad3d",
))


def nn_classes() -> List[str]:
    return sorted(
        name for name in dir(nn)
        if isinstance(getattr(nn, name), type) and issubclass(getattr(nn, name), nn.Module)
    )


def build_nn(name: str) -> nn.Module:
    factory = NN_ARGS.get(name, getattr(nn, name))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        module = factory()
    torch.manual_seed(0)
    for tensor in list(module.parameters()) + list(module.buffers()):
        if tensor.is_floating_point() and not _uninitialized(tensor):
            with torch.no_grad():
                tensor.normal_()  # values that differ from a fresh initialisation
    return module


# --- the corpus: structure, hooks, tensors of every shape ---------------------------------


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.norm = nn.LayerNorm(4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(self.fc(x)).relu()


class Recorder:
    """A plain object holding a reference back into the model."""

    def __init__(self, owner: nn.Module) -> None:
        self.owner = owner
        self.calls: List[int] = []

    def __call__(self, module: nn.Module, *args: Any) -> None:
        self.calls.append(len(args))


class Hooked(nn.Module):
    """One hook of every kind a module can hold, as bound methods, closures and objects."""

    def __init__(self) -> None:
        super().__init__()
        self.block = Block()
        self.other = nn.Linear(4, 2)
        self.recorder = Recorder(self)
        fc = self.block.fc
        self.handles = [
            fc.register_forward_pre_hook(self.pre),
            fc.register_forward_pre_hook(self.pre_kwargs, with_kwargs=True, prepend=True),
            fc.register_forward_hook(self.post),
            fc.register_forward_hook(self.post_kwargs, with_kwargs=True, **_ALWAYS_CALL),
            fc.register_full_backward_pre_hook(self.recorder),
            fc.register_full_backward_hook(functools.partial(_free_hook, self)),
            self.other.register_backward_hook(lambda m, gi, go: None),
            self.register_state_dict_pre_hook(_free_hook),
            # public since torch 2.1; torch 2.0 has only the private spelling
            getattr(self, "register_load_state_dict_pre_hook",
                    self._register_load_state_dict_pre_hook)(_free_hook),
            self.register_load_state_dict_post_hook(_free_hook),
            self.block.register_forward_hook(_free_hook),
        ]
        self.sd_handle = self._register_state_dict_hook(_free_hook)

    def pre(self, module: nn.Module, args: Any) -> None:
        pass

    def pre_kwargs(self, module: nn.Module, args: Any, kwargs: Any) -> None:
        pass

    def post(self, module: nn.Module, args: Any, out: Any) -> None:
        pass

    def post_kwargs(self, module: nn.Module, args: Any, kwargs: Any, out: Any) -> None:
        pass

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.other(self.block(x))


def _free_hook(*args: Any, **kwargs: Any) -> None:
    pass


class Tied(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(10, 4)
        self.decode = nn.Linear(4, 10, bias=False)
        self.decode.weight = self.embed.weight  # tied weights
        shared = Block()
        self.enc, self.dec = shared, shared  # one submodule under two names
        self.stack = nn.ModuleList([shared, nn.Linear(4, 4), shared])
        # cycles back to the model, shared objects in containers
        self.meta = {"owner": self, "blocks": [shared, shared], "pair": (self.embed, self)}
        self.back = weakref.ref(self)


class Tensors(nn.Module):
    """Parameters and buffers of every layout, dtype, flag and aliasing pattern."""

    def __init__(self) -> None:
        super().__init__()
        self.frozen = nn.Parameter(torch.randn(3, 4), requires_grad=False)
        self.transposed = nn.Parameter(torch.randn(4, 3).t())  # non-contiguous, dense
        self.strided = nn.Parameter(torch.randn(4, 6)[:, ::2])  # not dense
        self.offset = nn.Parameter(torch.randn(10)[2:6])  # storage offset, larger storage
        self.expanded = nn.Parameter(torch.randn(3).expand(2, 3))  # overlapping
        self.channels_last = nn.Parameter(torch.randn(2, 3, 4, 5).to(memory_format=CHANNELS_LAST))
        self.fp16 = nn.Parameter(torch.randn(5).half())
        self.bf16 = nn.Parameter(torch.randn(5).bfloat16())
        self.fp64 = nn.Parameter(torch.randn(2, 2).double())
        self.complex = nn.Parameter(torch.randn(3, dtype=torch.cfloat))
        self.empty = nn.Parameter(torch.empty(0, 4))
        self.scalar = nn.Parameter(torch.tensor(1.5))
        self.with_grad = nn.Parameter(torch.randn(3))
        self.with_grad.grad = torch.randn(3)
        self.nan = nn.Parameter(torch.tensor([float("nan"), 1.0, float("inf")]))
        self.register_parameter("none_param", None)
        base = torch.randn(4, 4)
        self.register_buffer("base", base)
        self.register_buffer("row", base[1])  # a view of another buffer
        self.register_buffer("col", base[:, 2])
        self.register_buffer("scratch", torch.zeros(2), persistent=False)
        self.register_buffer("counts", torch.arange(5))
        self.register_buffer("tail", torch.randn(10)[2:6])  # offset; native copies all 10
        self.register_buffer("mask", torch.tensor([True, False]))
        self.register_buffer("missing", None)
        self.register_buffer("stretched", torch.randn(3).expand(4, 3))
        self.register_buffer("cl_buffer", torch.randn(1, 2, 3, 3).to(memory_format=CHANNELS_LAST))
        self.register_buffer("conj", torch.randn(3, dtype=torch.cfloat).conj())
        leaf = torch.randn(3, requires_grad=True)
        leaf.grad = torch.ones(3)
        self.register_buffer("leaf_with_grad", leaf)
        self.plain_tensor = torch.randn(2)  # a tensor attribute that is neither
        self.view_of_param = self.transposed.data[0]  # a tensor sharing a parameter's storage


class Attributes(nn.Module):
    """Custom attributes of every ordinary kind."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(2, 2)
        self.number, self.ratio, self.name, self.flag = 3, 0.25, "attrs", None
        self.shape = torch.Size([2, 3])
        self.dtype_attr, self.device_attr = torch.float16, torch.device("cpu")
        self.tags = {"a", "b"}
        self.frozen_tags = frozenset({1, 2})
        self.history: List[Any] = [1, [2, 3], {"k": torch.ones(2)}]
        self.config = OrderedDict(depth=2, widths=(4, 4), act=nn.ReLU)
        self.fn = torch.relu
        self.lam = lambda x: x
        self.partial = functools.partial(torch.clamp, min=0.0)
        self.bound = self.fc.forward
        self.recorder = Recorder(self)
        self.tensors_by_param = {self.fc.weight: torch.zeros(2, 2)}
        self.nested = nn.Sequential(OrderedDict(inner=nn.Sequential(nn.Linear(2, 2), nn.Tanh())))


class Slotted(nn.Module):
    __slots__ = ("slot_value",)

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(2, 2)
        self.slot_value = 5


class CustomGetstate(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(2, 2)
        self.cache = torch.ones(2)

    def __getstate__(self) -> Dict[str, Any]:
        # not super().__getstate__(): neither nn.Module (torch 2.0) nor object (Python < 3.11)
        # has one everywhere
        state = dict(self.__dict__)
        state["cache"] = None
        return state


class CustomSetstate(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(2, 2)

    def __setstate__(self, state: Dict[str, Any]) -> None:
        super().__setstate__(state)
        self.restored = True


class CustomReduce(nn.Module):
    def __init__(self, width: int = 2) -> None:
        super().__init__()
        self.width = width
        self.fc = nn.Linear(width, width)

    def __reduce_ex__(self, protocol: Any) -> Any:
        return (CustomReduce, (self.width,), {"fc": self.fc, "note": "reduced"})

    def __setstate__(self, state: Dict[str, Any]) -> None:
        self.fc = state["fc"]
        self.note = state["note"]


class OwnDeepcopy(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(2, 2)

    def __deepcopy__(self, memo: Dict[int, Any]) -> OwnDeepcopy:
        new = OwnDeepcopy()
        new.load_state_dict(self.state_dict())
        new.custom = True
        memo[id(self)] = new
        return new


class DeepcopyMixin:
    def __deepcopy__(self, memo: Dict[int, Any]) -> Any:
        new = type(self)()
        new.load_state_dict(self.state_dict())  # type: ignore[attr-defined]
        new.via_mixin = True
        return new


class MixinAfterModule(nn.Module, DeepcopyMixin):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(2, 2)


class CustomParameter(nn.Parameter):
    pass


class WithCustomParameter(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.p = CustomParameter(torch.randn(2, 2))
        if hasattr(nn, "Buffer"):  # torch >= 2.5
            self.buf = nn.Buffer(torch.randn(2))
        else:
            self.register_buffer("buf", torch.randn(2))


class NoteDict(OrderedDict):  # type: ignore[type-arg]
    """An OrderedDict subclass, to check that only exact types take any fast path."""


def _containers_with_state() -> nn.Module:
    """Empty containers that still carry state: instance attributes, subclasses."""
    model = nn.Linear(2, 2)
    model._forward_hooks.note = "kept"  # type: ignore[attr-defined]
    model.empty_table = OrderedDict()
    model.empty_table.note = ["kept too"]  # type: ignore[attr-defined]
    model.sub_table = NoteDict()
    model.names = set()
    model.shape_like = (2, 2)
    return model


class Shape(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(2, 2)
        self.kernel = (3, 3)
        self.mixed = (3, [4])  # not all atoms: copied
        self.names = {"a", "b"}
        self.objects = {Shape.__name__, (1, 2)}  # a tuple member: the generic set copy


def _fast_path_edge_cases() -> nn.Module:
    """Each value here must leave the module copy's shortcuts for the generic deepcopy."""
    model = Shape()
    materialised = OrderedDict()
    assert materialised.__dict__ == {}  # now an existing, empty instance dict
    model.materialised = materialised
    own = nn.Parameter(torch.randn(2))
    own.__deepcopy__ = lambda memo: nn.Parameter(torch.zeros(2))  # type: ignore[method-assign]
    model.register_parameter("own_copier", own)
    tagged = nn.Parameter(torch.randn(2))
    tagged.tag = "kept by neither copy"  # Parameter.__deepcopy__ drops it natively
    model.register_parameter("tagged", tagged)
    model.register_parameter("subclassed", CustomParameter(torch.randn(2)))
    model.hooks_with_handle = model.fc.register_forward_hook(_free_hook)
    model.hooks_with_handle.remove()  # an empty hook dict that a live handle refers to
    return model


def _compiled() -> nn.Module:
    model = nn.Sequential(nn.Linear(2, 2))
    model.compile()  # adds _compiled_call_impl, which Module.__getstate__ drops
    return model


def _trained_with_optimizer() -> Dict[str, Any]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 1))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.StepLR(opt, 2)
    for _ in range(2):
        model(torch.randn(5, 4)).sum().backward()
        opt.step()
        sched.step()
    return {"model": model, "opt": opt, "sched": sched, "step": 2}


def _hook_based_spectral_norm() -> nn.Module:
    # Before any forward its weight is a leaf, so native deepcopy works.
    return torch.nn.utils.spectral_norm(nn.Linear(4, 3))


def _parametrized() -> nn.Module:
    from torch.nn.utils import parametrizations, parametrize

    model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4))
    parametrizations.weight_norm(model[0])
    parametrize.register_parametrization(model[1], "weight", nn.Identity())
    return model


CORPUS: Dict[str, Callable[[], Any]] = {
    "sequential_of_blocks": lambda: nn.Sequential(*[Block() for _ in range(5)]),
    "module_list_and_dict": lambda: nn.ModuleDict(
        {"list": nn.ModuleList([nn.Linear(2, 2), nn.ReLU()]), "block": Block()}
    ),
    "parameter_list_and_dict": lambda: nn.ModuleList(
        [nn.ParameterList([nn.Parameter(torch.randn(2)), torch.randn(3)]),
         nn.ParameterDict({"a": nn.Parameter(torch.randn(2)), "b": torch.randn(1)})]
    ),
    "lstm_after_forward": lambda: _after_forward(nn.LSTM(3, 4, num_layers=2), torch.randn(5, 2, 3)),
    "gru_flattened": lambda: _flattened(nn.GRU(3, 4)),
    "transformer_small": lambda: NN_ARGS["Transformer"](),
    "hooks_of_every_kind": Hooked,
    "tied_shared_cycles": Tied,
    "tensors_of_every_kind": Tensors,
    "custom_attributes": Attributes,
    "slots": Slotted,
    "custom_getstate": CustomGetstate,
    "custom_setstate": CustomSetstate,
    "custom_reduce_ex": CustomReduce,
    "own_deepcopy": OwnDeepcopy,
    "deepcopy_from_mixin_after_module": MixinAfterModule,
    "parameter_subclass_and_buffer_class": WithCustomParameter,
    "compiled": _compiled,
    "empty_containers_with_state": _containers_with_state,
    "fast_path_edge_cases": _fast_path_edge_cases,
    "channels_last_model": lambda: nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4)).to(
        memory_format=torch.channels_last
    ),
    "half_precision_model": lambda: Block().half(),
    "eval_mode_and_requires_grad_false": lambda: Block().eval().requires_grad_(False),
    "model_optimizer_scheduler": _trained_with_optimizer,
    "spectral_norm_before_forward": _hook_based_spectral_norm,
    "parametrized": _parametrized,
    "fx_graph_module": lambda: torch.fx.symbolic_trace(Block()),
    "list_of_models_sharing_a_layer": lambda: _sharing_list(),
    "bare_tensors": lambda: {"t": torch.randn(3), "view": None, "p": nn.Parameter(torch.randn(2))},
}


def _after_forward(module: nn.Module, x: torch.Tensor) -> nn.Module:
    with torch.no_grad():
        module(x)
    return module


def _flattened(module: nn.RNNBase) -> nn.Module:
    module.flatten_parameters()
    return module


def _sharing_list() -> List[nn.Module]:
    shared = nn.Linear(3, 3)
    return [nn.Sequential(shared, nn.ReLU()), nn.Sequential(nn.Tanh(), shared)]


# Corpus entries built from features older torch releases lack (feature-tested, not versioned).
CORPUS_NEEDS = {
    "compiled": (hasattr(nn.Module, "compile"), "nn.Module.compile() is new in torch 2.2"),
    "parametrized": (
        hasattr(torch.nn.utils.parametrizations, "weight_norm"),
        "torch.nn.utils.parametrizations.weight_norm is new in torch 2.1",
    ),
    # Without nn.Module.__getstate__ (torch 2.0) native deepcopy itself fails on a module with
    # slots (ValueError); test_module.py checks that the shim fails identically there.
    "slots": ("__getstate__" in vars(nn.Module), "native deepcopy of slotted modules fails on torch 2.0"),
}

