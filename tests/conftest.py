"""Fixtures only; helpers live in ``support``."""

from __future__ import annotations

import copy
from typing import Iterator

import pytest
import torch
from support.models import (
    ORIGINAL_DISPATCH,
    ORIGINAL_MODULE_ATTRS,
    ORIGINAL_SENDING,
    ORIGINAL_TENSOR_DEEPCOPY,
    CachedActivationsNet,
    cached_activations_net,
    module_attrs,
    sending_objects,
)

import deepcopy_shim
from deepcopy_shim import _patch, _record


@pytest.fixture(autouse=True)
def _shim_is_left_clean() -> Iterator[None]:
    """Every test starts and ends with the shim off, torch, copy and multiprocessing exactly as
    they were, and no copy left running in this thread."""
    yield
    deepcopy_shim.disable()
    assert _patch.state() in ("off", "inert"), _patch.state()
    assert vars(torch.Tensor)["__deepcopy__"] is ORIGINAL_TENSOR_DEEPCOPY
    assert module_attrs() == ORIGINAL_MODULE_ATTRS
    assert copy._deepcopy_dispatch is ORIGINAL_DISPATCH  # type: ignore[attr-defined]
    now = sending_objects()
    assert all(now["reducers"][cls] is reducer for cls, reducer in ORIGINAL_SENDING["reducers"].items())
    assert all(now[name] is ORIGINAL_SENDING[name] for name in ("dumps", "dump", "collate"))
    assert _record.current() is None


@pytest.fixture
def cached_net() -> CachedActivationsNet:
    """A fresh :class:`~support.models.CachedActivationsNet` holding three non-leaf tensors."""
    return cached_activations_net()
