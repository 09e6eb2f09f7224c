"""Models and tensors that make copies interesting, and the state of torch to compare against."""

from __future__ import annotations

import copy
import ctypes
from multiprocessing import reduction
from multiprocessing.reduction import ForkingPickler
from typing import Any, Dict, Set

import pytest
import torch
import torch.nn as nn
from torch.multiprocessing.reductions import reduce_tensor
from torch.utils.data._utils import collate

import deepcopy_shim
from deepcopy_shim import _modes

# (major, minor) of the torch under test, for tests of features that older releases lack.
TORCH_VERSION = tuple(int(part) for part in torch.__version__.split("+")[0].split(".")[:2])

# torch.nn.utils.parametrizations.weight_norm appeared in torch 2.1 (2.0 has only orthogonal and
# spectral_norm there; the hook-based torch.nn.utils.weight_norm exists everywhere).
needs_parametrizations_weight_norm = pytest.mark.skipif(
    TORCH_VERSION < (2, 1), reason="torch.nn.utils.parametrizations.weight_norm is new in torch 2.1"
)

ORIGINAL_TENSOR_DEEPCOPY = vars(torch.Tensor)["__deepcopy__"]
ORIGINAL_DISPATCH = copy._deepcopy_dispatch  # type: ignore[attr-defined]


def module_attrs() -> Dict[str, Any]:
    """nn.Module's own attributes, less ``__slotnames__``: copyreg caches that on any class whose
    instances it reduces (native deepcopy of a bare ``nn.Module()`` writes it), so it is not ours."""
    return {k: v for k, v in vars(nn.Module).items() if k != "__slotnames__"}


ORIGINAL_MODULE_ATTRS = module_attrs()

# The keys of multiprocessing's pickler table whose value is torch's tensor reducer.
_TENSOR_KEYS = [cls for cls, reducer in ForkingPickler._extra_reducers.items()  # type: ignore[attr-defined]
                if reducer is reduce_tensor]


def sending_objects() -> Dict[str, Any]:
    """What the shim replaces while installed for sending to another process, as it is now: the
    table entries that held torch's tensor reducer, ``ForkingPickler.dumps`` (the classmethod
    object in the class dict), ``multiprocessing.reduction.dump`` and the default collate's entry
    for tensors."""
    return {
        "reducers": {cls: ForkingPickler._extra_reducers.get(cls) for cls in _TENSOR_KEYS},  # type: ignore[attr-defined]
        "dumps": vars(ForkingPickler)["dumps"],
        "dump": reduction.dump,
        "collate": collate.default_collate_fn_map.get(torch.Tensor),
    }


ORIGINAL_SENDING = sending_objects()


def with_history(*shape: int) -> torch.Tensor:
    """A fresh non-leaf tensor (it has a grad_fn) of ``shape`` (default ``(2,)``), valued 2."""
    return torch.ones(*(shape or (2,)), requires_grad=True) * 2


class CachedActivationsNet(nn.Module):
    """A model that keeps its activations: the classic source of the 'graph leaves' error.

    After one forward with grad enabled it holds three non-leaf tensors, met by a copy in this
    order: ``head.last_out``, ``cache['mid']``, ``cache['list'][0]``.
    """

    PATHS = ("head.last_out", "cache['mid']", "cache['list'][0]")

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 8)
        self.head = nn.Linear(8, 2)
        self.cache: Dict[str, Any] = {}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = self.fc(x)
        self.cache["mid"] = hidden.relu()
        self.cache["list"] = [hidden * 2]
        out = self.head(hidden)
        self.head.last_out = out
        return out


def cached_activations_net(seed: int = 0) -> CachedActivationsNet:
    """A :class:`CachedActivationsNet` after one forward with grad enabled."""
    torch.manual_seed(seed)
    net = CachedActivationsNet()
    net(torch.randn(3, 4))
    return net


def native_refuses(obj: Any) -> bool:
    """True if torch's own deepcopy (no shim) raises the 'graph leaves' error on obj.

    A global mode set by the calling test is switched off for the check and restored after.
    """
    setting = _modes.global_setting()
    deepcopy_shim.disable()
    try:
        copy.deepcopy(obj)
    except RuntimeError as exc:
        return "graph leaves" in str(exc)
    finally:
        if setting is not None:
            deepcopy_shim.enable(setting.mode)
    return False


class ObjectIdMemo(dict):  # type: ignore[type-arg]
    """pyro's `detach()` memo: `get` treats every missing key as an object id (a ctypes cast)
    and hands out detached aliases of tensors, so the copy never meets a non-leaf tensor itself."""

    def get(self, key: Any, default: Any = None) -> Any:
        result = super().get(key, default)
        if result is default:
            old = ctypes.cast(key, ctypes.py_object).value
            if isinstance(old, torch.Tensor):
                self[key] = result = old.detach()
        return result


def resolve(root: Any, path: str) -> Any:
    """The object a reported path names, by Python access from ``root`` (the copied object)."""
    if not path:
        return root
    return eval("root" + ("" if path.startswith("[") else ".") + path, {"root": root})


class Name(str):
    """A str subclass: deepcopy copies one (it is no atom) instead of keeping it, as a key or
    an attribute's name too."""


def reshuffled_set() -> Set[int]:
    """A set of ints whose table, after removals and later additions, iterates in an order that
    a set made again from its items (what deepcopy makes) does not keep."""
    names = set(range(0, 4000, 37))
    names -= set(range(0, 4000, 74))
    names |= {5, 1029, 3001, 17}
    assert list(names) != list(set(list(names)))  # else the tests using it would test nothing
    return names
