"""The detaching oracle (``support.graphdiff.detaching_deepcopy``), the reference of
``tests/test_cuda.py`` wherever native deepcopy refuses the source, checked here on the CPU."""

from __future__ import annotations

import copy

import torch
import torch.nn as nn
from support.corpus import Tensors
from support.graphdiff import GraphDiff, assert_same_as_oracle, detaching_deepcopy
from support.models import cached_activations_net, native_refuses


def test_where_native_copies_the_oracle_copies_as_native() -> None:
    source = Tensors()
    GraphDiff(source, copy.deepcopy(source), detaching_deepcopy(source)).check()


def test_the_oracle_copies_a_tensor_with_history_as_a_leaf_and_keeps_views_views() -> None:
    base = torch.ones(4, requires_grad=True) * 2
    source = {"base": base, "view": base[1:], "leaf": torch.ones(2, requires_grad=True)}
    made = detaching_deepcopy(source)
    assert made["base"].is_leaf and made["base"].requires_grad
    assert torch.equal(made["base"], base.detach())
    assert made["view"]._base is None  # a leaf on the same storage, as torch copies views
    assert made["view"].untyped_storage().data_ptr() == made["base"].untyped_storage().data_ptr()
    assert made["base"].untyped_storage().data_ptr() != base.untyped_storage().data_ptr()


def test_the_shim_copies_cached_activations_as_the_oracle() -> None:
    net = cached_activations_net()
    assert native_refuses(net)
    assert_same_as_oracle(net)


def test_a_module_moved_with_a_buffer_that_requires_grad() -> None:
    """The CPU twin of `model.cuda()` in tests/test_cuda.py: `Module.to()` moves buffers with
    autograd recording, so a buffer that requires grad gets history and native deepcopy refuses
    the module."""
    model = nn.Linear(2, 2)
    model.register_buffer("scale", torch.ones(2, requires_grad=True))
    model.double()
    assert model.scale.grad_fn is not None
    assert native_refuses(model)
    copied = assert_same_as_oracle(model).shim
    assert copied.scale.is_leaf and copied.scale.requires_grad and copied.scale.dtype == torch.float64
