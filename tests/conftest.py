"""Fixtures only; helpers live in ``support``."""

from __future__ import annotations

from typing import Iterator

import pytest
import torch
from support.models import (
    ORIGINAL_MODULE_ATTRS,
    ORIGINAL_TENSOR_DEEPCOPY,
    CachedActivationsNet,
    cached_activations_net,
    module_attrs,
)

import deepcopy_shim
from deepcopy_shim import _patch


@pytest.fixture(autouse=True)
def _shim_is_left_clean() -> Iterator[None]:
    """Every test starts and ends with the shim off and torch exactly as it was."""
    yield
    deepcopy_shim.disable()
    assert not _patch.is_installed()
    assert vars(torch.Tensor)["__deepcopy__"] is ORIGINAL_TENSOR_DEEPCOPY
    assert module_attrs() == ORIGINAL_MODULE_ATTRS


@pytest.fixture
def cached_net() -> CachedActivationsNet:
    """A fresh :class:`~support.models.CachedActivationsNet` holding three non-leaf tensors."""
    return cached_activations_net()
