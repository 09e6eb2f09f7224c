"""torch.nn.utils: pruning, hook-based weight_norm / spectral_norm, and parametrizations.

The hook-based utilities keep the computed weight as a plain (non-leaf) module attribute,
recomputed by a forward pre-hook, so natively such modules cannot be deep-copied.  Parametrized
modules are re-classed to ``Parametrized<Cls>``, whose ``__getstate__`` raises; torch gives that
class its own ``__deepcopy__`` only if ``hasattr(cls, "__deepcopy__")`` is False, which must stay
so while the shim is installed (a module parametrized inside a scope must still copy, in the
scope and after it).
"""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
from ecosystem_support import assert_independent_copy, assert_like_native, assert_reports, resolve
from torch import nn
from torch.nn.utils import parametrizations, parametrize, prune

import deepcopy_shim

X = torch.randn(3, 4, generator=torch.Generator().manual_seed(0))


def pruned_linear():
    torch.manual_seed(0)
    lin = nn.Linear(4, 5)
    prune.l1_unstructured(lin, "weight", 0.5)
    lin(X)
    return lin


def globally_pruned_sequential():
    torch.manual_seed(0)
    seq = nn.Sequential(nn.Linear(4, 5), nn.ReLU(), nn.Linear(5, 2))
    prune.global_unstructured([(seq[0], "weight"), (seq[2], "weight")],
                              pruning_method=prune.L1Unstructured, amount=0.3)
    seq(X)
    return seq


def old_weight_norm():
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # deprecated in favour of parametrizations
        module = nn.utils.weight_norm(nn.Linear(4, 5))
    module(X)
    return module


def old_spectral_norm(forward=True):
    torch.manual_seed(0)
    module = nn.utils.spectral_norm(nn.Linear(4, 5))
    if forward:
        module(X)
    return module


@pytest.mark.parametrize(("make", "expected"), [
    (pruned_linear, ("weight",)),
    (globally_pruned_sequential, ("[0].weight", "[2].weight")),
    (old_weight_norm, ("weight",)),
    (old_spectral_norm, ("weight",)),
], ids=["l1_unstructured", "global_unstructured", "weight_norm", "spectral_norm"])
def test_hook_computed_weights(make, expected):
    reports = assert_reports(make, lambda m: copy.deepcopy(m), expected,
                             copied_root=lambda m, result: result)
    for mode in ("warn", "silent"):
        source, copied = reports.objects[mode], reports.results[mode]
        # The copy's own pre-hook recomputes its weight from its own parameters.
        assert_independent_copy(source, copied, (X,))
        for path in expected:
            weight = resolve(copied, path)
            assert not weight.is_leaf  # recomputed by the copy's forward in the step above


def test_pruning_removed_and_spectral_norm_before_forward_copy_natively():
    def removed():
        seq = globally_pruned_sequential()
        prune.remove(seq[0], "weight")
        prune.remove(seq[2], "weight")
        return seq

    for make in (removed, lambda: old_spectral_norm(forward=False)):
        reports = assert_reports(make, lambda m: copy.deepcopy(m), ())
        for mode in ("warn", "strict", "silent"):
            assert_like_native(reports.results[mode], reports.native[1])
            assert_independent_copy(reports.objects[mode], reports.results[mode], (X,))


PARAMETRIZE = {
    "weight_norm": parametrizations.weight_norm,
    "spectral_norm": parametrizations.spectral_norm,
    "orthogonal": lambda m: parametrizations.orthogonal(m),
}


@pytest.mark.parametrize("kind", sorted(PARAMETRIZE))
@pytest.mark.parametrize("scope_mode", ["warn", "strict", "silent"])
def test_module_parametrized_while_shim_enabled_still_copies(kind, scope_mode):
    """Parametrized inside a scope, copied in it, after it, and natively."""
    torch.manual_seed(0)
    with deepcopy_shim.enabled(scope_mode):
        module = PARAMETRIZE[kind](nn.Linear(4, 4))
        module(X)
        module.eval()  # spectral_norm's power iteration updates its buffers in train mode
        assert "__deepcopy__" in type(module).__dict__  # torch gave the class its own
        copied = copy.deepcopy(module)
        with parametrize.cached():
            module(X)
            in_cache = copy.deepcopy(module)
    assert type(copied) is type(module) is type(in_cache)
    after_scope = copy.deepcopy(module)
    for other in (copied, in_cache, after_scope):
        assert_independent_copy(module, other, (X,))


def test_parametrized_module_with_cached_output_reports_it():
    """A parametrized module, parametrized while the shim was installed, that keeps its output."""
    def make():
        torch.manual_seed(0)
        with deepcopy_shim.enabled("silent"):
            module = parametrizations.weight_norm(nn.Linear(4, 4))
        module.cache = module(X)
        return module

    reports = assert_reports(make, lambda m: copy.deepcopy(m), ("cache",),
                             copied_root=lambda m, result: result)
    for mode in ("warn", "silent"):
        source, copied = reports.objects[mode], reports.results[mode]
        assert type(copied) is type(source)
        assert_independent_copy(source, copied, (X,))
