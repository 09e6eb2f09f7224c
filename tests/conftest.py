from __future__ import annotations

import copy
from typing import Any, Dict, Iterator

import pytest
import torch
import torch.nn as nn

import deepcopy_shim
from deepcopy_shim import _modes, _patch

# (major, minor) of the torch under test, for tests of features that older releases lack.
TORCH_VERSION = tuple(int(part) for part in torch.__version__.split("+")[0].split(".")[:2])

# torch.nn.utils.parametrizations.weight_norm appeared in torch 2.1 (2.0 has only orthogonal and
# spectral_norm there; the hook-based torch.nn.utils.weight_norm exists everywhere).
needs_parametrizations_weight_norm = pytest.mark.skipif(
    TORCH_VERSION < (2, 1), reason="torch.nn.utils.parametrizations.weight_norm is new in torch 2.1"
)

ORIGINAL_TENSOR_DEEPCOPY = vars(torch.Tensor)["__deepcopy__"]


def module_attrs() -> Dict[str, Any]:
    """nn.Module's own attributes, less ``__slotnames__``: copyreg caches that on any class whose
    instances it reduces (native deepcopy of a bare ``nn.Module()`` writes it), so it is not ours."""
    return {k: v for k, v in vars(nn.Module).items() if k != "__slotnames__"}


ORIGINAL_MODULE_ATTRS = module_attrs()


@pytest.fixture(autouse=True)
def _shim_is_left_clean() -> Iterator[None]:
    """Every test starts and ends with the shim off and torch exactly as it was."""
    yield
    deepcopy_shim.disable()
    assert not _patch.is_installed()
    assert vars(torch.Tensor)["__deepcopy__"] is ORIGINAL_TENSOR_DEEPCOPY
    assert module_attrs() == ORIGINAL_MODULE_ATTRS


class CachingNet(nn.Module):
    """A model that keeps its activations: the classic source of the 'graph leaves' error."""

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


@pytest.fixture
def caching_net() -> CachingNet:
    torch.manual_seed(0)
    net = CachingNet()
    net(torch.randn(3, 4))
    return net


def native_refuses(obj: Any) -> bool:
    """True if torch's own deepcopy (no shim) raises the 'graph leaves' error on obj.

    A global mode set by the calling test is switched off for the check and restored after.
    """
    mode = _modes.global_mode()
    deepcopy_shim.disable()
    try:
        copy.deepcopy(obj)
    except RuntimeError as exc:
        return "graph leaves" in str(exc)
    finally:
        if mode is not None:
            deepcopy_shim.enable(mode)
    return False
