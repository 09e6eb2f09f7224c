"""CUDA: copies stay on their device, pinned host memory stays pinned, no host round trip.

Skipped without a CUDA device.  The benchmark's big model on the GPU is
``python benchmarks/bench_copy.py --device cuda``; its copy is checked here for fidelity and
peak memory.
"""

from __future__ import annotations

import copy
from typing import Iterator

import pytest
import torch
import torch.nn as nn
from support.corpus import CORPUS, Block
from support.graphdiff import GraphDiff, assert_same_as_native

import deepcopy_shim

pytestmark = [
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
    pytest.mark.filterwarnings("ignore::UserWarning"),
]


@pytest.fixture(autouse=True)
def _sync() -> Iterator[None]:
    yield
    if torch.cuda.is_available():
        torch.cuda.synchronize()


class Cached(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.block = Block()
        self.register_buffer("pinned_host", torch.randn(4).pin_memory())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.last = self.block(x)
        return self.last


def test_non_leaf_copies_stay_on_their_device_and_pinned_memory_stays_pinned() -> None:
    model = Cached().cuda()
    model.pinned_host = model.pinned_host.cpu().pin_memory()
    model(torch.randn(3, 4, device="cuda"))
    # _pin_memory is differentiable: pinning a tensor that requires grad gives a non-leaf
    model.pinned_nonleaf = torch.randn(4, requires_grad=True).pin_memory()
    assert not model.last.is_leaf and not model.pinned_nonleaf.is_leaf
    with deepcopy_shim.enabled("silent"):
        c = copy.deepcopy(model)
    assert c.last.is_leaf and c.last.device == model.last.device
    assert torch.equal(c.last, model.last.detach())
    assert c.pinned_host.is_pinned() and c.pinned_nonleaf.is_pinned()
    assert c.pinned_host.data_ptr() != model.pinned_host.data_ptr()
    for p_src, p_dst in zip(model.parameters(), c.parameters()):
        assert p_dst.device == p_src.device and p_dst.data_ptr() != p_src.data_ptr()


def test_no_host_round_trip() -> None:
    from torch.profiler import ProfilerActivity, profile

    model = Cached().cuda()
    model(torch.randn(3, 4, device="cuda"))
    with deepcopy_shim.enabled("silent"):
        copy.deepcopy(model)  # warm up
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            copy.deepcopy(model)
            torch.cuda.synchronize()
    names = [event.name for event in prof.events()]
    assert not [n for n in names if "DtoH" in n or "aten::_to_cpu" in n or n == "aten::cpu"], names


def test_a_copy_made_on_a_side_stream_is_right_on_the_default_stream() -> None:
    model = Cached().cuda()
    model(torch.randn(64, 4, device="cuda"))
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())  # the source is complete before the copy
    with torch.cuda.stream(side), deepcopy_shim.enabled("silent"):
        copied = copy.deepcopy(model)
    torch.cuda.current_stream().wait_stream(side)  # and the copy before it is used here
    assert torch.equal(copied.last, model.last.detach())
    for p_src, p_dst in zip(model.parameters(), copied.parameters()):
        assert torch.equal(p_dst, p_src)
    x = torch.randn(8, 4, device="cuda")
    assert torch.equal(copied(x), model(x))


@pytest.mark.parametrize("name", ["tensors_of_every_kind", "tied_shared_cycles",
                                  "hooks_of_every_kind", "lstm_after_forward", "transformer_small"])
def test_fidelity_on_cuda(name: str) -> None:
    source = CORPUS[name]()
    source = source.cuda() if isinstance(source, nn.Module) else source
    assert_same_as_native(source)


def test_big_model_on_the_gpu() -> None:
    """The benchmark's model (b): same copy as native, and no transient second copy."""
    model = nn.Sequential(*[nn.Linear(2048, 2048) for _ in range(24)]).cuda()
    model_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    native = copy.deepcopy(model)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    with deepcopy_shim.enabled("silent"):
        shim = copy.deepcopy(model)
    torch.cuda.synchronize()
    assert torch.cuda.max_memory_allocated() - before <= 1.1 * model_bytes
    GraphDiff(model, native, shim).check()
