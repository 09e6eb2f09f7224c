"""Sending to another process, in this process: what torch's multiprocessing pickler makes of a
tensor with history in each mode, and that the patch comes and goes exactly.

Everything multiprocessing sends is pickled by ``ForkingPickler``; loading the bytes in the same
process runs torch's own rebuild (shared memory included), so what arrives here is what a
receiver gets.  ``test_sending_processes.py`` sends to real processes.
"""

from __future__ import annotations

import gc
import io
import os
import pickle
import textwrap
import threading
import traceback
import warnings
import weakref
from multiprocessing import context as mp_context
from multiprocessing import reduction
from multiprocessing.reduction import ForkingPickler
from typing import Any, Iterator, List, Tuple

import pytest
import torch
import torch.nn as nn
from support.lines import marked_line
from support.models import ORIGINAL_SENDING, CachedActivationsNet, sending_objects
from support.processes import in_a_thread
from torch.multiprocessing import reductions
from torch.utils.data._utils import collate

import deepcopy_shim
from deepcopy_shim import (
    DetachedTensorsWarning,
    NonLeafTensorError,
    PatchConflictWarning,
    _send_survey,
    _sending,
)

pytestmark = pytest.mark.filterwarnings("default::deepcopy_shim.DeepcopyShimWarning")

MODES = ("warn", "strict", "silent")
TORCH_WORDS = "Cowardly refusing to serialize non-leaf tensor which requires_grad"


def history(*shape: int) -> torch.Tensor:
    with torch.enable_grad():
        return torch.ones(*(shape or (3,)), requires_grad=True) * 2


def sent(obj: Any) -> Any:
    """What a receiver gets: `obj` pickled as multiprocessing sends it, then loaded."""
    return ForkingPickler.loads(ForkingPickler.dumps(obj))


def warned(call: Any) -> Tuple[Any, List[warnings.WarningMessage]]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = call()
    return result, caught


def raised_in_torchs_reducer(error: BaseException) -> bool:
    """True if `error` was raised by torch's own `reduce_tensor` frame (its traceback ends there)."""
    frames = traceback.extract_tb(error.__traceback__)
    return frames[-1].name == "reduce_tensor" and frames[-1].filename == reductions.__file__


def assert_arrived_as_a_leaf(arrived: torch.Tensor, source: torch.Tensor) -> None:
    assert arrived.is_leaf and arrived.grad_fn is None
    assert arrived.requires_grad == source.requires_grad
    assert (arrived.dtype, arrived.shape, arrived.device, arrived.stride()) == (
        source.dtype, source.shape, source.device, source.stride())
    assert torch.equal(arrived.detach(), source.detach())
    assert arrived.untyped_storage().data_ptr() != source.untyped_storage().data_ptr()


# --- the premise: torch refuses, and the shim is not there without a mode -------------------


def test_native_multiprocessing_refuses_a_tensor_with_history_and_the_shim_is_absent() -> None:
    assert sending_objects()["dumps"] is ORIGINAL_SENDING["dumps"]  # nothing installed
    with pytest.raises(RuntimeError, match=TORCH_WORDS) as info:
        ForkingPickler.dumps(history())
    assert type(info.value) is RuntimeError and raised_in_torchs_reducer(info.value)
    assert torch.equal(sent(torch.ones(2)), torch.ones(2))  # a leaf goes


def test_where_no_mode_applies_while_installed_the_error_is_torchs_own() -> None:
    """A scope of another thread installs the patch; here no mode applies: torch's error, raised by
    torch's frame, its words unchanged, and nothing in the source changed."""
    entered, leave = threading.Event(), threading.Event()

    def other_thread() -> None:
        with deepcopy_shim.enabled("silent"):
            entered.set()
            leave.wait(20)

    thread = threading.Thread(target=other_thread, daemon=True)
    thread.start()
    try:
        assert entered.wait(20)
        assert sending_objects()["dumps"] is not ORIGINAL_SENDING["dumps"]  # installed
        source = history()
        with pytest.raises(RuntimeError, match=TORCH_WORDS) as info:
            ForkingPickler.dumps({"x": source})
        assert type(info.value) is RuntimeError and raised_in_torchs_reducer(info.value)
        assert str(info.value).startswith(TORCH_WORDS)
        assert not source.is_leaf and not source.is_shared()
    finally:
        leave.set()
        thread.join(20)


def test_a_scope_does_not_reach_another_thread() -> None:
    with deepcopy_shim.enabled("silent"):
        error = in_a_thread(lambda: _error_of(lambda: ForkingPickler.dumps(history())))
    assert type(error) is RuntimeError and TORCH_WORDS in str(error)


def _error_of(call: Any) -> Any:
    try:
        call()
    except Exception as exc:
        return exc
    return None


# --- silent and warn: a leaf that shares no memory with the sender ---------------------------


@pytest.mark.parametrize("mode", ["silent", "warn"])
def test_a_tensor_with_history_arrives_as_a_leaf_of_its_own(mode: str) -> None:
    source = history(2, 3)
    with deepcopy_shim.enabled(mode), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        arrived = sent(source)
    assert_arrived_as_a_leaf(arrived, source)
    with torch.no_grad():
        arrived.add_(10)  # a write in the receiver
    assert torch.equal(source.detach(), torch.full((2, 3), 2.0))
    assert not source.is_leaf and not source.is_shared()  # the source is never touched


def test_a_write_in_the_receiver_leaves_the_senders_gradients_alone() -> None:
    with torch.enable_grad():
        w = torch.ones(3, requires_grad=True)
        y = w * 2
    with deepcopy_shim.enabled("silent"):
        arrived = sent(y)
    with torch.no_grad():
        arrived.mul_(0)
    y.sum().backward()
    assert torch.equal(w.grad, torch.full((3,), 2.0)) and torch.equal(y.detach(), torch.full((3,), 2.0))


def test_silent_says_nothing_and_enable_is_a_door_as_a_scope_is() -> None:
    deepcopy_shim.enable("silent")
    arrived, caught = warned(lambda: sent({"a": history()}))
    assert caught == [] and arrived["a"].is_leaf


def test_views_with_history_of_one_storage_share_one_storage_on_arrival() -> None:
    base = history(4, 3)
    views = (base[1], base[2:], base.t())  # offsets 3 and 6, a transposed stride
    with deepcopy_shim.enabled("silent"):
        arrived = sent(views)
    storages = {view.untyped_storage().data_ptr() for view in arrived}
    assert len(storages) == 1 and storages != {base.untyped_storage().data_ptr()}
    for got, view in zip(arrived, views):
        assert (got.storage_offset(), got.stride(), got.shape) == (
            view.storage_offset(), view.stride(), view.shape)
        assert torch.equal(got.detach(), view.detach()) and got.is_leaf
    with torch.no_grad():
        arrived[0].fill_(7)  # one storage: the transposed view sees the write
    assert torch.equal(arrived[2].detach()[:, 1], torch.full((3,), 7.0))


def test_a_tensor_torch_copies_its_own_way_arrives_as_a_leaf_too() -> None:
    """A conjugate view (like a subclass, quantized or nested tensor) is copied by torch's own
    `Tensor.__deepcopy__` of its detached view; plain tensors by the same steps, without it."""
    with torch.enable_grad():
        w = torch.ones(3, dtype=torch.cfloat, requires_grad=True)
        plain = w * (1 + 2j)
        conjugate = plain.conj()
    assert conjugate.is_conj() and not conjugate.is_leaf
    with deepcopy_shim.enabled("silent"):
        got_plain, got_conjugate = sent((plain, conjugate))
    assert_arrived_as_a_leaf(got_plain, plain)
    assert got_conjugate.is_leaf and got_conjugate.requires_grad
    assert torch.equal(got_conjugate.detach().resolve_conj(), conjugate.detach().resolve_conj())


@pytest.mark.parametrize("mode", MODES)
def test_leaves_and_parameters_are_sent_as_torch_sends_them(mode: str) -> None:
    """Shared memory, in place, as without the shim: the received tensor is the sender's memory."""
    leaf, parameter = torch.zeros(3), nn.Parameter(torch.zeros(2))
    frozen = torch.zeros(2, requires_grad=True)
    with deepcopy_shim.enabled(mode):
        arrived = sent((leaf, parameter, frozen))
    assert leaf.is_shared() and parameter.is_shared() and frozen.is_shared()
    assert type(arrived[1]) is nn.Parameter and arrived[1].requires_grad and arrived[2].requires_grad
    for got, source in zip(arrived, (leaf, parameter, frozen)):
        assert got.data_ptr() == source.data_ptr()  # the same memory (in this process, the same storage)


# --- warn: one warning per send, naming the paths within the object sent ---------------------


def test_warn_names_every_tensor_detached_once_at_the_senders_line(cached_net: CachedActivationsNet) -> None:
    deepcopy_shim.enable("warn")
    data, caught = warned(lambda: ForkingPickler.dumps(cached_net))  # line: warn-send
    arrived = ForkingPickler.loads(data)
    assert len(caught) == 1
    w = caught[0]
    assert w.category is DetachedTensorsWarning
    assert (w.filename, w.lineno) == (__file__, marked_line(__file__, "warn-send"))
    assert w.message.paths == CachedActivationsNet.PATHS
    assert w.message.tensors == (
        cached_net.head.last_out, cached_net.cache["mid"], cached_net.cache["list"][0])
    assert str(w.message) == (
        "deepcopy_shim: sending a CachedActivationsNet to another process detached 3 tensors with "
        "autograd history:\n") + textwrap.dedent("""\
          head.last_out: grad_fn=AddmmBackward0, shape=(3, 2), dtype=torch.float32
          cache['mid']: grad_fn=ReluBackward0, shape=(3, 8), dtype=torch.float32
          cache['list'][0]: grad_fn=MulBackward0, shape=(3, 8), dtype=torch.float32
        Each arrives as a leaf with the same values and requires_grad, without the graph, in
        memory of its own: a copy, not shared with this process. Mode 'warn' is set by
        deepcopy_shim.enable('warn'): deepcopy_shim.enable('silent') sends without this warning,
        deepcopy_shim.enable('strict') refuses such sends; or detach these tensors before
        sending.""")
    assert arrived.head.last_out.is_leaf and arrived.cache["list"][0].is_leaf


def test_warn_names_a_tensor_sent_alone_as_the_object_itself() -> None:
    with deepcopy_shim.enabled("warn"):
        _, caught = warned(lambda: sent(history()))
    assert [w.message.paths for w in caught] == [("",)]
    assert "  <the object sent itself>: grad_fn=MulBackward0, shape=(3,)" in str(caught[0].message)
    assert "Mode 'warn' is set by deepcopy_shim.enabled('warn')" in " ".join(str(caught[0].message).split())


def test_a_send_without_tensors_with_history_says_nothing_and_surveys_nothing(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_sending, "survey", lambda *args: pytest.fail("surveyed"))
    with deepcopy_shim.enabled("warn"):
        _, caught = warned(lambda: sent({"leaf": torch.ones(2), "model": nn.Linear(2, 2)}))
    assert caught == []


def test_a_pickler_used_directly_is_a_send_of_its_own_for_each_tensor() -> None:
    source = history()
    with deepcopy_shim.enabled("warn"):
        buffer = io.BytesIO()
        _, caught = warned(lambda: ForkingPickler(buffer).dump([source]))
    assert [w.message.paths for w in caught] == [("",)]
    assert ForkingPickler.loads(buffer.getbuffer())[0].is_leaf
    with deepcopy_shim.enabled("strict"), pytest.raises(NonLeafTensorError) as info:
        ForkingPickler(io.BytesIO()).dump([source])
    assert info.value.paths == ("",) and type(info.value.__cause__) is RuntimeError


class SendsItsOwn:
    """Reduces to the bytes of a send of its own (`ForkingPickler.dumps` inside a send)."""

    def __init__(self, inner: Any, scope: str = "") -> None:
        self.inner, self.scope = inner, scope

    def __reduce__(self) -> Any:
        if self.scope:
            with deepcopy_shim.enabled(self.scope):
                return (bytes, (bytes(ForkingPickler.dumps(self.inner)),))
        return (bytes, (bytes(ForkingPickler.dumps(self.inner)),))


def test_a_send_inside_a_send_is_a_send_of_its_own() -> None:
    inner = {"h": history()}
    with deepcopy_shim.enabled("warn"):
        _, caught = warned(lambda: ForkingPickler.dumps({"outer": SendsItsOwn(inner), "h": history()}))
    assert sorted(w.message.paths for w in caught) == [("['h']",), ("['h']",)]
    assert sorted(str(w.message).split(" to ")[0] for w in caught) == [
        "deepcopy_shim: sending a dict", "deepcopy_shim: sending a dict"]
    # A send inside, in a scope without the shim, is torch's: the outer send is not its mode.
    with deepcopy_shim.enabled("silent"), pytest.raises(RuntimeError, match=TORCH_WORDS) as info:
        ForkingPickler.dumps([SendsItsOwn(inner["h"], scope="off")])
    assert type(info.value) is RuntimeError and raised_in_torchs_reducer(info.value)


class ReducedOnce:
    """Reduces to its tensor the first time, and raises after: a survey cannot follow it."""

    def __init__(self, tensor: torch.Tensor) -> None:
        self.tensor, self.calls = tensor, 0

    def __reduce__(self) -> Any:
        self.calls += 1
        if self.calls > 1:
            raise ValueError("reduced once only")
        return (list, ([self.tensor],))


def test_a_send_the_survey_cannot_follow_names_its_tensors_without_a_path() -> None:
    source = history()
    with deepcopy_shim.enabled("warn"):
        _, caught = warned(lambda: sent([ReducedOnce(source)]))
    assert [w.message.paths for w in caught] == [("<not located: ValueError: reduced once only>",)]
    assert caught[0].message.tensors == (source,)
    with deepcopy_shim.enabled("strict"), pytest.raises(NonLeafTensorError) as info:
        sent([ReducedOnce(source)])
    assert info.value.paths == ("<not located: ValueError: reduced once only>",)
    assert "The list may be incomplete: the rest of the send could not be followed (ValueError: " \
           "reduced once only)." in " ".join(str(info.value).split())


# --- strict: refused where torch refuses, naming every path ----------------------------------


def test_strict_refuses_where_torch_does_naming_every_tensor(cached_net: CachedActivationsNet) -> None:
    deepcopy_shim.enable("strict")
    with pytest.raises(NonLeafTensorError) as info:
        ForkingPickler.dumps(cached_net)
    error = info.value
    assert isinstance(error, RuntimeError) and error.paths == CachedActivationsNet.PATHS
    assert error.tensors == (cached_net.head.last_out, cached_net.cache["mid"], cached_net.cache["list"][0])
    cause = error.__cause__
    assert type(cause) is RuntimeError and raised_in_torchs_reducer(cause) and TORCH_WORDS in str(cause)
    assert str(error) == (
        "deepcopy_shim: refused to send a CachedActivationsNet holding 3 tensors with autograd "
        "history to another process:\n") + textwrap.dedent(f"""\
          head.last_out: grad_fn=AddmmBackward0, shape=(3, 2), dtype=torch.float32
          cache['mid']: grad_fn=ReluBackward0, shape=(3, 8), dtype=torch.float32
          cache['list'][0]: grad_fn=MulBackward0, shape=(3, 8), dtype=torch.float32
        Mode 'strict' is set by deepcopy_shim.enable('strict'). Nothing was sent; nothing in the
        source was detached. deepcopy_shim.enable('warn') or deepcopy_shim.enable('silent')
        sends these tensors as detached leaves (copies, not shared memory); or detach or drop
        them before sending, e.g. (obj is the object sent):
            obj.head.last_out = obj.head.last_out.detach()
            del obj.head.last_out
        torch's refusal: {" ".join(str(cause).split())}""")
    assert not cached_net.head.last_out.is_leaf  # nothing detached


def test_the_survey_shares_no_memory_copies_no_data_and_duplicates_no_descriptor() -> None:
    import multiprocessing

    leaf, parameter, source = torch.ones(4), nn.Parameter(torch.ones(2)), history()
    reader, writer = multiprocessing.Pipe()
    try:
        gc.collect()  # what earlier tests left for the collector closes no descriptor meanwhile
        descriptors = len(os.listdir("/proc/self/fd")) if os.path.isdir("/proc/self/fd") else None
        met, failed = _send_survey.survey({"leaf": leaf, "p": parameter, "pipe": reader, "h": [source]},
                                          None, ForkingPickler._extra_reducers)  # type: ignore[attr-defined]
        assert failed is None and [tensor for tensor, _ in met] == [source]
        assert not (leaf.is_shared() or parameter.is_shared() or source.is_shared())
        if descriptors is not None:
            assert len(os.listdir("/proc/self/fd")) == descriptors
    finally:
        reader.close()
        writer.close()


# --- lifetime: copies live while a spawning child starts, and not longer ---------------------


class FakeSpawningPopen:
    """What a spawn Popen offers torch while it pickles the child's process object."""

    def __init__(self) -> None:
        self.fds: List[int] = []

    def duplicate_for_child(self, fd: int) -> int:
        self.fds.append(fd)
        return fd

    class DupFd:
        def __init__(self, fd: int) -> None:
            self.fd = fd


def test_copies_stay_alive_as_long_as_the_child_being_started_and_not_longer() -> None:
    source = history(5)
    popen = FakeSpawningPopen()
    mp_context.set_spawning_popen(popen)
    try:
        with deepcopy_shim.enabled("silent"):
            ForkingPickler.dumps(source)
    finally:
        mp_context.set_spawning_popen(None)
    (kept,) = _sending._kept[popen]
    assert kept.is_leaf and kept.is_shared() and len(popen.fds) == 1  # the descriptor handed over
    assert kept.untyped_storage().data_ptr() != source.untyped_storage().data_ptr()
    alive = weakref.ref(kept)
    del kept, popen
    gc.collect()
    assert alive() is None and len(_sending._kept) == 0


def test_a_queue_or_connection_send_keeps_no_copy(monkeypatch: pytest.MonkeyPatch) -> None:
    source = history(5)
    made: List[Any] = []
    original = _sending.Send.end

    def end(self: _sending.Send) -> None:
        made.extend(weakref.ref(copy) for copy in self.copies)
        original(self)

    monkeypatch.setattr(_sending.Send, "end", end)
    with deepcopy_shim.enabled("silent"):
        data = ForkingPickler.dumps(source)
    gc.collect()
    assert len(made) == 1 and made[0]() is None and len(_sending._kept) == 0
    assert torch.equal(ForkingPickler.loads(data).detach(), source.detach())  # the descriptor was duplicated


# --- installing and removing ----------------------------------------------------------------


def test_installing_wraps_what_exists_and_removing_restores_the_very_same_objects() -> None:
    deepcopy_shim.enable("warn")
    now = sending_objects()
    patched = now["reducers"]
    wrappers = set(map(id, patched.values()))
    assert len(wrappers) == 1 and len(patched) == len(ORIGINAL_SENDING["reducers"]) > 3
    reducer = patched[torch.Tensor]
    assert reducer.__wrapped__ is reductions.reduce_tensor and reducer.__name__ == "reduce_tensor"
    assert patched[nn.Parameter] is reducer
    assert vars(ForkingPickler)["dumps"] is not ORIGINAL_SENDING["dumps"]
    assert reduction.dump is not ORIGINAL_SENDING["dump"]
    assert now["collate"].__wrapped__ is collate.collate_tensor_fn
    assert ForkingPickler(io.BytesIO()).dispatch_table[torch.Tensor] is reducer  # picklers made now
    deepcopy_shim.disable()
    restored = sending_objects()
    assert all(restored["reducers"][cls] is reductions.reduce_tensor for cls in ORIGINAL_SENDING["reducers"])
    for name in ("dumps", "dump", "collate"):
        assert restored[name] is ORIGINAL_SENDING[name], name


def test_an_installation_removed_is_freed_without_the_garbage_collector() -> None:
    """Nothing of the sending patch refers back to itself: installing and removing it (each
    `deepcopy_shim.deepcopy()` call does) leaves no cycle for the collector."""
    with deepcopy_shim.enabled("warn"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        sent(history())  # warm: first-use caches are not garbage
    gc.collect()
    gc.disable()
    try:
        with deepcopy_shim.enabled("silent"):
            sent(history())  # loaded: the descriptors it handed out are taken
    finally:
        gc.enable()
    assert gc.collect() == 0


def test_scopes_count_and_the_last_one_out_removes_the_patch() -> None:
    with deepcopy_shim.enabled("warn"):
        with deepcopy_shim.enabled("silent"):
            assert sending_objects()["dumps"] is not ORIGINAL_SENDING["dumps"]
        assert sending_objects()["dumps"] is not ORIGINAL_SENDING["dumps"]
    assert sending_objects()["dumps"] is ORIGINAL_SENDING["dumps"]


@pytest.fixture
def put_back() -> Iterator[None]:
    """Puts multiprocessing's and torch's objects back after a test that replaced them."""
    yield
    for cls in ORIGINAL_SENDING["reducers"]:
        ForkingPickler._extra_reducers[cls] = reductions.reduce_tensor  # type: ignore[attr-defined]
    ForkingPickler.dumps = ORIGINAL_SENDING["dumps"]  # type: ignore[method-assign]
    reduction.dump = ORIGINAL_SENDING["dump"]
    collate.default_collate_fn_map[torch.Tensor] = ORIGINAL_SENDING["collate"]


def _theirs(obj: Any) -> Any:
    return reductions.reduce_tensor(obj)


@pytest.mark.usefixtures("put_back")
@pytest.mark.parametrize(("name", "replace", "read"), [
    ("multiprocessing.reduction.ForkingPickler._extra_reducers[torch.Tensor]",
     lambda: ForkingPickler._extra_reducers.__setitem__(torch.Tensor, _theirs),  # type: ignore[attr-defined]
     lambda: ForkingPickler._extra_reducers[torch.Tensor]),  # type: ignore[attr-defined]
    ("multiprocessing.reduction.ForkingPickler.dumps",
     lambda: setattr(ForkingPickler, "dumps", classmethod(_theirs)), lambda: vars(ForkingPickler)["dumps"]),
    ("multiprocessing.reduction.dump", lambda: setattr(reduction, "dump", _theirs), lambda: reduction.dump),
    ("torch.utils.data._utils.collate.default_collate_fn_map[torch.Tensor]",
     lambda: collate.default_collate_fn_map.__setitem__(torch.Tensor, _theirs),
     lambda: collate.default_collate_fn_map[torch.Tensor]),
])
def test_someone_replacing_what_the_shim_patched_is_left_in_place_with_a_warning(
        name: str, replace: Any, read: Any) -> None:
    deepcopy_shim.enable()
    replace()
    theirs = read()
    with pytest.warns(PatchConflictWarning) as caught:
        deepcopy_shim.disable()  # line: disable-over-theirs
    assert [str(w.message) for w in caught] == [
        f"deepcopy_shim: {name} was replaced by someone else after deepcopy_shim patched it; their "
        "patch is left in place and deepcopy_shim's, beneath it, is now inert."]
    assert (caught[0].filename, caught[0].lineno) == (__file__, marked_line(__file__, "disable-over-theirs"))
    assert read() is theirs


def test_torch_registering_its_reducer_again_is_no_conflict() -> None:
    deepcopy_shim.enable()
    reductions.init_reductions()  # what `import torch.multiprocessing` did: torch's own entries again
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        deepcopy_shim.disable()
    assert sending_objects()["reducers"] == ORIGINAL_SENDING["reducers"]


# --- the shim's errors and warnings travel back from a worker -------------------------------


def test_a_refusal_and_a_warning_pickle_as_what_they_say() -> None:
    with deepcopy_shim.enabled("strict"), pytest.raises(NonLeafTensorError) as info:
        ForkingPickler.dumps({"h": history()})
    for dumps, loads in ((ForkingPickler.dumps, ForkingPickler.loads), (pickle.dumps, pickle.loads)):
        back = loads(dumps(info.value))
        assert type(back) is NonLeafTensorError and str(back) == str(info.value)
        assert back.paths == ("['h']",) and back.mode is deepcopy_shim.Mode.STRICT
    with deepcopy_shim.enabled("warn"):
        _, caught = warned(lambda: ForkingPickler.dumps({"h": history()}))
    warning = caught[0].message
    back = pickle.loads(ForkingPickler.dumps(warning))
    assert type(back) is DetachedTensorsWarning and str(back) == str(warning)
    assert back.paths == ("['h']",) and back.tensors == (None,)  # the tensors stay behind: absent


# --- a DataLoader worker's default collate --------------------------------------------------


@pytest.fixture
def in_a_worker(monkeypatch: pytest.MonkeyPatch) -> None:
    """This process as a DataLoader worker sees itself (`get_worker_info()` is not None)."""
    from torch.utils.data._utils import worker

    monkeypatch.setattr(worker, "_worker_info", object())


def samples() -> List[torch.Tensor]:
    with torch.enable_grad():
        w = torch.ones(3, requires_grad=True)
        return [w * 1, torch.full((3,), 5.0), w * 2]


def test_native_collate_in_a_worker_refuses_samples_with_history(in_a_worker: None) -> None:
    with pytest.raises(RuntimeError, match="don't support automatic differentiation") as info:
        torch.utils.data.default_collate(samples())
    assert type(info.value) is RuntimeError
    with deepcopy_shim.enabled("off"), pytest.raises(RuntimeError, match="don't support automatic"):
        torch.utils.data.default_collate(samples())


@pytest.mark.parametrize("mode", ["silent", "warn"])
def test_a_worker_collates_samples_with_history_as_their_detached_copies(
        in_a_worker: None, mode: str) -> None:
    batch_samples = samples()
    with deepcopy_shim.enabled(mode):
        batch, caught = warned(lambda: torch.utils.data.default_collate(batch_samples))  # line: collate
    expected = torch.stack([sample.detach() for sample in batch_samples])
    assert batch.is_leaf and batch.requires_grad and batch.is_shared()
    assert torch.equal(batch.detach(), expected)
    assert not batch_samples[0].is_leaf  # the samples are never touched
    if mode == "silent":
        assert caught == []
        return
    assert len(caught) == 1 and caught[0].category is DetachedTensorsWarning
    assert (caught[0].filename, caught[0].lineno) == (__file__, marked_line(__file__, "collate"))
    assert caught[0].message.paths == ("[0]", "[2]")
    assert str(caught[0].message).splitlines()[:3] == [
        "deepcopy_shim: a DataLoader worker's default collate detached 2 tensors with autograd history "
        "(one per sample, by its place in the batch):",
        "  [0]: grad_fn=MulBackward0, shape=(3,), dtype=torch.float32",
        "  [2]: grad_fn=MulBackward0, shape=(3,), dtype=torch.float32",
    ]
    assert "(requires_grad=True, as stacking them gives)" in " ".join(str(caught[0].message).split())


def test_a_worker_collates_with_requires_grad_as_stacking_gives_it(in_a_worker: None) -> None:
    with deepcopy_shim.enabled("silent"), torch.no_grad():
        batch = torch.utils.data.default_collate(samples())
    assert batch.is_leaf and not batch.requires_grad


def test_strict_refuses_the_batch_where_torch_does(in_a_worker: None) -> None:
    with deepcopy_shim.enabled("strict"), pytest.raises(NonLeafTensorError) as info:
        torch.utils.data.default_collate(samples())
    assert info.value.paths == ("[0]", "[2]")
    assert type(info.value.__cause__) is RuntimeError
    assert "don't support automatic differentiation" in str(info.value.__cause__)
    assert str(info.value).startswith(
        "deepcopy_shim: refused to collate 2 tensors with autograd history in a DataLoader worker")


@pytest.mark.parametrize("mode", MODES)
def test_the_main_process_collates_as_torch_does(mode: str) -> None:
    with deepcopy_shim.enabled(mode), warnings.catch_warnings():
        warnings.simplefilter("error")
        batch = torch.utils.data.default_collate(samples())
    assert type(batch.grad_fn).__name__ == "StackBackward0"  # history kept: nothing crosses


def test_a_collate_entry_of_someone_elses_is_left_alone(put_back: None) -> None:
    collate.default_collate_fn_map[torch.Tensor] = _theirs
    deepcopy_shim.enable()
    assert collate.default_collate_fn_map[torch.Tensor] is _theirs
    deepcopy_shim.disable()
    assert collate.default_collate_fn_map[torch.Tensor] is _theirs


# --- the words: a send says what a copy says, with "send" for "copy" --------------------------


@pytest.mark.parametrize("door", ["code", "environment", "scope"])
def test_a_sends_messages_are_a_copys_in_the_words_of_a_send(door: str) -> None:
    """Warn and strict for a send and for a copy of the same object in the same setting: the same
    tensor lines, the same mode sentence naming where the mode came from and how to write the
    others there, the same advice, the same way of quoting torch."""
    from deepcopy_shim import _report
    from deepcopy_shim._access import Entry
    from deepcopy_shim._modes import Mode, ModeSetting, Source

    how = {"code": (Source.CODE, "deepcopy_shim.enable('{}')"),
           "environment": (Source.ENVIRONMENT, "DEEPCOPY_SHIM={}"),
           "scope": (Source.SCOPE, "deepcopy_shim.enabled('{}')")}[door]
    root = nn.Linear(2, 2)
    entries = [Entry(history(), ".last_out", None), Entry(history(2, 2), ".cache['mid']", None)]

    def flat(text: str) -> str:
        return " ".join(text.split())

    warn = ModeSetting(Mode.WARN, how[0], how[1])
    copied = _report.detached_warning(root, warn, entries)
    sent_words = _report.send_detached_warning(root, warn, entries)
    assert copied.splitlines()[0].endswith("detached 2 tensors with autograd history:")
    assert sent_words.splitlines()[0] == ("deepcopy_shim: sending a Linear to another process "
                                          "detached 2 tensors with autograd history:")
    assert copied.splitlines()[1:3] == sent_words.splitlines()[1:3]  # the tensors, one a line
    for words in (copied, sent_words):
        assert "a leaf with the same values and requires_grad, without the graph" in flat(words)
    assert (f"Mode 'warn' is set by {warn.spelled()}: {warn.spelled('silent')} copies without this "
            f"warning, {warn.spelled('strict')} refuses such copies; or detach these tensors before "
            "copying.") in flat(copied)
    assert (f"Mode 'warn' is set by {warn.spelled()}: {warn.spelled('silent')} sends without this "
            f"warning, {warn.spelled('strict')} refuses such sends; or detach these tensors before "
            "sending.") in flat(sent_words)

    strict = ModeSetting(Mode.STRICT, how[0], how[1])
    torch_words = "Cowardly refusing to serialize non-leaf tensor which requires_grad, since ..."
    copied = _report.strict_refusal(root, strict, entries, None, torch_words)
    sent_words = _report.send_refusal(root, strict, entries, None, torch_words)
    assert copied.splitlines()[0] == ("deepcopy_shim: refused to copy a Linear holding 2 tensors "
                                      "with autograd history:")
    assert sent_words.splitlines()[0] == ("deepcopy_shim: refused to send a Linear holding 2 tensors "
                                          "with autograd history to another process:")
    assert copied.splitlines()[1:3] == sent_words.splitlines()[1:3]
    for words, verb in ((copied, "copies"), (sent_words, "sends")):
        assert (f"Mode 'strict' is set by {strict.spelled()}." in flat(words)
                and "nothing in the source was detached." in flat(words))
        assert (f"{strict.spelled('warn')} or {strict.spelled('silent')} {verb} these tensors as "
                "detached leaves") in flat(words)
        assert "or detach or drop them before" in flat(words)
        assert words.splitlines()[-3:] == ["    obj.last_out = obj.last_out.detach()",
                                           "    del obj.last_out",
                                           "torch's refusal: " + torch_words]
