"""CUDA: on the device the shim copies as native deepcopy copies, or as the detaching oracle does.

Skipped without a CUDA device.  A test here asserts only what native ``copy.deepcopy`` implies
or, where native deepcopy refuses the source (it holds tensors with autograd history), what the
detaching oracle implies (``support.graphdiff.detaching_deepcopy``: native deepcopy, each such
tensor ``t`` copied as torch copies ``t.detach()``, then given ``t.requires_grad``).  Two facts
of native deepcopy on a GPU machine that the tests hold the shim to: the copy of a pinned tensor
is not pinned, and ``Module.cuda()`` turns a buffer that requires grad into a tensor with history
(``Module._apply`` moves buffers with autograd recording), which native deepcopy refuses.

``benchmarks/gpu_check.sh`` runs this file and ``benchmarks/bench_copy.py --device cuda``.
"""

from __future__ import annotations

import copy
import warnings
from typing import Any, Callable, Iterator, List, Tuple

import pytest
import torch
import torch.nn as nn
from support.corpus import CORPUS, CORPUS_NEEDS, NN_SKIPPED, Block, build_nn, nn_classes
from support.graphdiff import GraphDiff, assert_same_as_native, assert_same_as_oracle, detaching_deepcopy
from support.models import native_refuses

import deepcopy_shim

pytestmark = [
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
    pytest.mark.filterwarnings("ignore::UserWarning"),
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
]

MiB = 1 << 20


@pytest.fixture(autouse=True)
def _sync() -> Iterator[None]:
    yield
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def shim_copy(source: Any) -> Any:
    with deepcopy_shim.enabled("silent"):
        return copy.deepcopy(source)


class Cached(nn.Module):
    """A block that keeps its last output: a tensor with history after a forward with grad."""

    def __init__(self) -> None:
        super().__init__()
        self.block = Block()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.last = self.block(x)
        return self.last


def _cache_output(module: nn.Module, args: Any, output: torch.Tensor) -> None:
    module.cached = output


def encoder(dtype: torch.dtype = torch.float32) -> nn.Module:
    """A small TransformerEncoder on the GPU in ``dtype``, with hook-based weight_norm on its
    feed-forward layers, caching the last output of each layer and of each first feed-forward
    layer: after a forward with grad enabled, all of those and weight_norm's weights have history."""
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(32, 4, dim_feedforward=64, batch_first=True)
    model = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # hook-based weight_norm is deprecated
        for block in model.layers:
            torch.nn.utils.weight_norm(block.linear1)
            torch.nn.utils.weight_norm(block.linear2)
            block.register_forward_hook(_cache_output)
            block.linear1.register_forward_hook(_cache_output)
    return model.to("cuda", dtype)


def inputs(dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.randn(2, 8, 32, device="cuda", dtype=dtype)


# --- where the copies go, and what they cost the device -------------------------------------


def test_copies_stay_on_their_device_and_are_not_pinned_as_natively() -> None:
    model = Cached().cuda()
    model(torch.randn(3, 4, device="cuda"))
    model.register_buffer("pinned_host", torch.randn(4).pin_memory())
    # pin_memory is differentiable: pinning a tensor that requires grad gives one with history
    model.pinned_nonleaf = torch.randn(4, requires_grad=True).pin_memory()
    assert not model.last.is_leaf and not model.pinned_nonleaf.is_leaf
    assert model.pinned_host.is_pinned() and model.pinned_nonleaf.is_pinned()
    oracle = detaching_deepcopy(model)
    shim = shim_copy(model)
    GraphDiff(model, oracle, shim).check()  # devices, values, leaves, nothing shared with the source
    # Native deepcopy copies a pinned tensor into pageable memory (the oracle copies a leaf as
    # native does): the shim's copies are pinned exactly where the oracle's are.
    for name in ("pinned_host", "pinned_nonleaf"):
        assert getattr(shim, name).is_pinned() == getattr(oracle, name).is_pinned(), name


def _device_to_host(make_copy: Callable[[], Any]) -> List[str]:
    """The device-to-host transfers in a profiler trace of one call of ``make_copy``, made after
    one call to warm up."""
    from torch.profiler import ProfilerActivity, profile

    make_copy()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        make_copy()
        torch.cuda.synchronize()
    names = [event.name for event in prof.events()]
    return [n for n in names if "DtoH" in n or "aten::_to_cpu" in n or n == "aten::cpu"]


def test_a_copy_moves_no_more_to_the_host_than_the_oracle() -> None:
    model = Cached().cuda()
    model(torch.randn(3, 4, device="cuda"))
    oracle = _device_to_host(lambda: detaching_deepcopy(model))
    shim = _device_to_host(lambda: shim_copy(model))
    assert len(shim) <= len(oracle), (shim, oracle)


def test_a_copy_made_on_a_side_stream_is_right_on_the_default_stream() -> None:
    model = Cached().cuda()
    model(torch.randn(64, 4, device="cuda"))
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())  # the source is complete before the copies
    with torch.cuda.stream(side):
        shim = shim_copy(model)
        oracle = detaching_deepcopy(model)
    torch.cuda.current_stream().wait_stream(side)  # and the copies before they are used here
    GraphDiff(model, oracle, shim).check()
    x = torch.randn(8, 4, device="cuda")
    assert torch.equal(shim(x), oracle(x))


def _copy_and_peak(make_copy: Callable[[], Any]) -> Tuple[Any, int]:
    """What ``make_copy()`` returns, and the most GPU memory it had allocated on top of what
    was allocated before it."""
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    made = make_copy()
    torch.cuda.synchronize()
    return made, torch.cuda.max_memory_allocated() - before


def test_big_model_on_the_gpu() -> None:
    """The benchmark's model (b): native's copy, at native's peak memory (within 1 MiB, less than
    any weight here: no transient second copy of any tensor)."""
    model = nn.Sequential(*[nn.Linear(2048, 2048, device="cuda") for _ in range(24)])
    native, native_peak = _copy_and_peak(lambda: copy.deepcopy(model))
    shim, shim_peak = _copy_and_peak(lambda: shim_copy(model))
    assert shim_peak <= native_peak + MiB, (shim_peak, native_peak)
    GraphDiff(model, native, shim).check()


# --- the fidelity corpus on the device ------------------------------------------------------

# Corpus entries that `.cuda()` leaves holding a tensor with history, so that native deepcopy
# refuses them: Tensors' buffer `leaf_with_grad` requires grad and becomes a non-leaf when moved.
REFUSED_NATIVELY_ON_CUDA = frozenset({"tensors_of_every_kind"})


def on_cuda(source: Any) -> Any:
    """``source`` with every module in it (itself, or an item of a list or dict) moved in place
    by ``.cuda()``, as users move models; tensors outside modules stay where they are."""
    if isinstance(source, nn.Module):
        source.cuda()
    elif isinstance(source, (list, dict)):
        for item in source.values() if isinstance(source, dict) else source:
            on_cuda(item)
    return source


@pytest.mark.parametrize(
    "name",
    [
        pytest.param(n, marks=pytest.mark.skipif(not CORPUS_NEEDS[n][0], reason=CORPUS_NEEDS[n][1]))
        if n in CORPUS_NEEDS else n
        for n in sorted(CORPUS)
    ],
)
def test_fidelity_on_cuda(name: str) -> None:
    source = on_cuda(CORPUS[name]())
    if name in REFUSED_NATIVELY_ON_CUDA:
        assert native_refuses(source)
        assert_same_as_oracle(source)
    else:
        assert_same_as_native(source)


def test_every_nn_layer_on_cuda() -> None:
    """Every torch.nn layer the CPU's fidelity tests copy, moved by ``.cuda()``: one test, as
    their number changes with torch's release; a failure names every layer that differs."""
    differ = {}
    for name in nn_classes():
        if name in NN_SKIPPED:
            continue
        try:
            assert_same_as_native(build_nn(name).cuda())
        except Exception as exc:  # a mismatch, or any failure: each layer is reported
            differ[name] = f"{type(exc).__name__}: {exc}"
    assert not differ, differ


# --- models users copy on the device ----------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_an_encoder_with_weight_norm_and_cached_activations(dtype: torch.dtype) -> None:
    model = encoder(dtype)
    model(inputs(dtype))
    assert native_refuses(model)
    assert_same_as_oracle(model)


def test_activations_cached_under_autocast() -> None:
    model = encoder()
    with torch.autocast("cuda", dtype=torch.bfloat16):
        model(inputs())
    assert model.layers[0].linear1.cached.dtype == torch.bfloat16  # autocast ran the Linear in bf16
    assert native_refuses(model)
    assert_same_as_oracle(model)


def test_model_cuda_on_a_buffer_that_requires_grad() -> None:
    """`model.cuda()` makes a buffer that requires grad a tensor with history: native deepcopy
    refuses the model; the shim's copy holds it as a leaf that requires grad, values equal."""

    class ScaledLinear(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(4, 4)
            self.register_buffer("scale", torch.ones(4, requires_grad=True))

    model = ScaledLinear().cuda()
    assert model.scale.grad_fn is not None and model.scale.requires_grad
    assert native_refuses(model)
    copied = assert_same_as_oracle(model).shim
    assert copied.scale.is_leaf and copied.scale.requires_grad
    assert copied.scale.device == model.scale.device
    assert torch.equal(copied.scale, model.scale.detach())


def test_a_copy_trains_independently_of_its_source() -> None:
    model = encoder()
    model(inputs())
    before = {name: t.clone() for name, t in model.state_dict().items()}
    copied = shim_copy(model)
    stale = copied.layers[-1].cached  # the copy of a cached activation: a leaf that requires grad
    assert stale.is_leaf and stale.requires_grad
    optimizer = torch.optim.SGD(copied.parameters(), lr=0.1)
    (copied(inputs()).square().mean() + stale.sum()).backward()
    optimizer.step()
    assert stale.grad is not None
    assert all(p.grad is None for p in model.parameters())  # no gradient flowed into the source
    after = model.state_dict()
    assert all(torch.equal(before[name], after[name]) for name in before)
    assert not all(torch.equal(a, b) for a, b in zip(copied.parameters(), model.parameters()))


def test_the_ema_idiom() -> None:
    """A moving average of the weights kept in a deep copy of the model (timm's ModelEma,
    Lightning's EMA callbacks): it follows the training as the oracle's copy does."""
    model = encoder()
    model(inputs())
    ema = shim_copy(model).requires_grad_(False)
    oracle = detaching_deepcopy(model).requires_grad_(False)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(3):
        optimizer.zero_grad()
        model(inputs()).square().mean().backward()
        optimizer.step()
        with torch.no_grad():
            for average in (ema, oracle):
                for kept, live in zip(average.parameters(), model.parameters()):
                    kept.lerp_(live, 0.1)
    GraphDiff(model, oracle, ema).check()


def test_a_tensor_with_history_sent_through_a_spawn_queue_arrives_as_a_leaf_on_the_device() -> None:
    """Sending to another process (a spawn child, as CUDA needs): each of 1,000 sends arrives as a
    leaf on the device with the tensor's values and requires_grad, and the sender's device memory
    returns to where it was once the child has let go of them (torch keeps each sent block until
    the receiver releases it: the shim keeps no copy of its own)."""
    import gc
    import threading

    import torch.multiprocessing as tmp
    from support.sending_programs import cuda_receive

    count = 1000
    with torch.enable_grad():
        source = torch.ones(256, device="cuda", requires_grad=True) * 2
    torch.cuda.synchronize()
    baseline = torch.cuda.memory_allocated()
    ctx = tmp.get_context("spawn")
    inbox, outbox = ctx.SimpleQueue(), ctx.Queue()
    child = ctx.Process(target=cuda_receive, args=(inbox, outbox, count), daemon=True)
    child.start()
    answer: List[Any] = []

    def send_all() -> None:
        with deepcopy_shim.enabled("silent"):
            for _ in range(count):
                inbox.put(source)  # SimpleQueue pickles in this thread, in the scope
        answer.append(outbox.get(timeout=300))

    # A hard limit: a put blocks for good once the pipe is full and the child has stopped
    # reading, so the sends run in a thread that the test stops waiting for.
    sender = threading.Thread(target=send_all, daemon=True)
    sender.start()
    try:
        sender.join(420)
        assert not sender.is_alive(), "hung: the sends or the child's answer took over 420 s"
        assert answer == [None], answer  # the child's answer: what was wrong, or None
    finally:
        child.join(120)
        if child.is_alive():
            child.kill()
            child.join(30)
    assert child.exitcode == 0
    gc.collect()
    torch.cuda.ipc_collect()
    torch.cuda.synchronize()
    assert torch.cuda.memory_allocated() == baseline
    assert not source.is_leaf  # the source is never touched
