"""``torch.compile(model, backend="eager")``: copies of an ``OptimizedModule``.

Natively an ``OptimizedModule`` is copied through its ``__reduce__`` (``(cls, (_orig_mod,
dynamo_ctx))``): a new ``OptimizedModule`` around a copy of ``_orig_mod``, whose ``forward`` runs
the copy.  ``OptimizedModule.__getattr__`` forwards unknown names to ``_orig_mod``, so natively
``copy.deepcopy`` also finds the inner module's own ``__deepcopy__`` when its class has one (a
parametrized module): then native returns the bare inner copy.  The shim's class-level
``nn.Module.__deepcopy__`` is found first; see the last two tests.
"""

from __future__ import annotations

import copy

import torch
from ecosystem_support import assert_independent_copy, assert_like_native, assert_reports, native_outcome
from torch import nn
from torch.nn.utils import parametrizations

import deepcopy_shim

OptimizedModule = torch._dynamo.eval_frame.OptimizedModule
X = torch.randn(2, 4, generator=torch.Generator().manual_seed(0))


class Cached(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        y = self.lin(x).tanh()
        self.cache = y  # set inside the compiled call: a non-leaf tensor on the inner module
        return y


def compiled(call=True):
    torch.manual_seed(0)
    model = torch.compile(Cached(), backend="eager")
    if call:
        model(X)
    return model


def assert_runs_its_own_copy(source, copied):
    """The copy's forward runs the copied inner module, not the source's."""
    assert type(copied) is OptimizedModule and copied._orig_mod is not source._orig_mod
    torch.testing.assert_close(copied(X), source(X).detach())
    with torch.no_grad():
        for p in copied._orig_mod.parameters():
            p.zero_()
    assert torch.equal(copied(X), torch.zeros(2, 4))
    assert not torch.equal(source(X), torch.zeros(2, 4))


def test_compiled_module_after_a_call():
    model = compiled()
    reports = assert_reports(lambda: model, lambda m: copy.deepcopy(m), ("_orig_mod.cache",), fresh=False,
                             copied_root=lambda m, result: result)
    assert_independent_copy(model, reports.results["warn"], (X,))
    assert_runs_its_own_copy(model, reports.results["silent"])


def test_compiled_module_before_any_call_copies_natively():
    model = compiled(call=False)
    reports = assert_reports(lambda: model, lambda m: copy.deepcopy(m), (), fresh=False)
    for mode in ("warn", "strict", "silent"):
        assert_like_native(reports.results[mode], reports.native[1])
    assert_runs_its_own_copy(model, reports.results["strict"])


def test_module_compiled_in_place():
    """``Module.compile()`` adds ``_compiled_call_impl``, which ``Module.__getstate__`` drops."""
    torch.manual_seed(0)
    model = Cached()
    model.compile(backend="eager")
    model(X)
    reports = assert_reports(lambda: model, lambda m: copy.deepcopy(m), ("cache",), fresh=False,
                             copied_root=lambda m, result: result)
    del model.cache
    native = native_outcome(lambda: copy.deepcopy(model))[1]
    for mode in ("warn", "silent"):
        copied = reports.results[mode]
        assert "_compiled_call_impl" in vars(model)
        assert "_compiled_call_impl" not in vars(copied) and "_compiled_call_impl" not in vars(native)
        assert_independent_copy(model, copied, (X,))


def test_compiled_parametrized_module_copies_as_native_does():
    """Natively, ``deepcopy(torch.compile(m))`` of a parametrized ``m`` goes through
    ``OptimizedModule.__getattr__`` to ``m``'s own ``__deepcopy__`` and returns a bare
    ``ParametrizedLinear`` (the compile wrapper is lost).  The shim's ``nn.Module.__deepcopy__``
    honours that forwarding, so every mode returns what native returns."""
    torch.manual_seed(0)
    inner = parametrizations.weight_norm(nn.Linear(4, 4))
    model = torch.compile(inner, backend="eager")
    model(X)
    native = native_outcome(lambda: copy.deepcopy(model))[1]
    assert type(native) is type(inner)
    for mode in ("warn", "strict", "silent"):
        copied = deepcopy_shim.deepcopy(model, mode)
        assert type(copied) is type(inner) and copied is not inner
        torch.testing.assert_close(copied(X), model(X).detach())


class OptsOut(nn.Linear):
    """A module that opts out of being copied, as gpytorch's prediction strategies do."""

    def __deepcopy__(self, memo):
        return None


def test_compiled_module_whose_inner_module_opts_out_of_copying():
    model = torch.compile(OptsOut(4, 4), backend="eager")
    assert native_outcome(lambda: copy.deepcopy(model)) == ("ok", None)
    assert deepcopy_shim.deepcopy(model, "strict") is None
