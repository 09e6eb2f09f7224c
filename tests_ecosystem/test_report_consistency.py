"""The property behind every scenario of this suite, over arbitrary compositions of their shapes.

For any object, ``find_nonleaf_tensors(obj)`` lists exactly the non-leaf tensors that native
``copy.deepcopy`` meets (by identity, in order: the oracle ``native_met``), native raises the
graph-leaves error iff that list is non-empty, strict refuses with exactly those paths and
tensors, warn emits one warning with exactly those paths, silent says nothing, and every
spellable path resolves to its tensor.  Tensors hidden behind a custom ``__deepcopy__`` (gpytorch's
prediction strategies) are never listed; tensors reached where no Python access leads (a custom
``__deepcopy__`` that copies them, a set, a dict keyed by a parameter) get a stable ``<why>``.
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import torch
from ecosystem_support import (
    CopiesUnreachable,
    assert_stable_path,
    native_met,
    native_outcome,
    resolve,
    spellable,
    split_path,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch import distributions as D
from torch import nn

import deepcopy_shim


class Hides:
    """Like gpytorch's DefaultPredictionStrategy: opts out of being copied (returns None)."""

    def __init__(self, tensor):
        self.cache = tensor

    def __deepcopy__(self, memo):
        return None


class Bag:
    """A plain object holding its members as attributes."""


ATOMS = ["nonleaf", "view", "leaf", "trainable_leaf", "cached_linear", "clean_linear", "normal",
         "categorical", "hides", "copies_unreachable", "set", "parameter_key"]


class Builder:
    """Builds one object from a recipe; ``("ref", i)`` reuses an earlier non-leaf tensor."""

    def __init__(self):
        self.nonleaf = []

    def new_nonleaf(self):
        tensor = torch.ones(3, requires_grad=True) * 2
        self.nonleaf.append(tensor)
        return tensor

    def build(self, recipe):
        kind, arg = recipe
        if kind == "atom":
            return getattr(self, "atom_" + arg)()
        if kind == "ref":
            return self.nonleaf[arg % len(self.nonleaf)] if self.nonleaf else self.new_nonleaf()
        children = [self.build(child) for child in arg]
        if kind == "list":
            return children
        if kind == "tuple":
            return tuple(children)
        if kind == "dict":
            return {f"k{i}": child for i, child in enumerate(children)}
        holder = nn.Module() if kind == "module" else Bag()
        for i, child in enumerate(children):
            setattr(holder, f"m{i}" if isinstance(child, nn.Module) else f"a{i}", child)
        return holder

    def atom_nonleaf(self):
        return self.new_nonleaf()

    def atom_view(self):
        return self.new_nonleaf()[1:]

    def atom_leaf(self):
        return torch.ones(3)

    def atom_trainable_leaf(self):
        return torch.ones(3, requires_grad=True)

    def atom_cached_linear(self):
        lin = nn.Linear(3, 3)
        lin.out = lin(torch.ones(1, 3))
        return lin

    def atom_clean_linear(self):
        lin = nn.Linear(3, 3)
        lin(torch.ones(1, 3))
        return lin

    def atom_normal(self):
        return D.Normal(self.new_nonleaf(), nn.functional.softplus(self.new_nonleaf()))

    def atom_categorical(self):
        dist = D.Categorical(logits=self.new_nonleaf())
        dist.probs  # noqa: B018 - stored lazily in __dict__
        return dist

    def atom_hides(self):
        return Hides(self.new_nonleaf())

    def atom_copies_unreachable(self):
        return CopiesUnreachable(self.new_nonleaf())

    def atom_set(self):
        return {self.new_nonleaf()}

    def atom_parameter_key(self):
        return {nn.Parameter(torch.ones(1)): self.new_nonleaf()}


recipes = st.recursive(
    st.one_of(st.sampled_from(ATOMS).map(lambda a: ("atom", a)), st.integers(0, 7).map(lambda i: ("ref", i))),
    lambda children: st.tuples(st.sampled_from(["list", "tuple", "dict", "object", "module"]),
                               st.lists(children, max_size=3)),
    max_leaves=8,
)


def check_consistency(obj):
    found = deepcopy_shim.find_nonleaf_tensors(obj)
    paths = tuple(p for p, _ in found)
    tensors = [t for _, t in found]
    native = native_outcome(lambda: copy.deepcopy(obj))
    _, met = native_met(lambda: copy.deepcopy(obj))
    # Exactly what native deepcopy meets, in its order: nothing hidden is listed, nothing missed.
    assert [id(t) for t in tensors] == [id(t) for t in met]
    assert native[0] == ("graph-leaves" if found else "ok")
    for path, tensor in found:
        assert_stable_path(path)
        if spellable(path):
            assert resolve(obj, path) is tensor, path
    for mode in ("warn", "strict", "silent"):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                deepcopy_shim.deepcopy(obj, mode)
                error = None
            except deepcopy_shim.NonLeafTensorError as exc:
                error = exc
        shim = [w for w in caught if issubclass(w.category, deepcopy_shim.DeepcopyShimWarning)]
        if mode == "strict" and found:
            assert error is not None and error.paths == paths
            assert [id(t) for t in error.tensors] == [id(t) for t in tensors]
        else:
            assert error is None
        if mode == "warn" and found:
            assert len(shim) == 1 and shim[0].message.paths == paths
            assert shim[0].filename == __file__
        else:
            assert shim == []
    return found


@settings(max_examples=150, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(recipes)
def test_find_strict_and_warn_agree_with_what_native_deepcopy_meets(recipe):
    check_consistency(Builder().build(recipe))


def test_the_copied_object_itself_is_the_empty_path():
    tensor = torch.ones(2, requires_grad=True) * 2
    assert [p for p, _ in check_consistency(tensor)] == [""]
    assert resolve(tensor, "") is tensor


def test_hidden_tensors_stay_hidden_and_shared_ones_are_met_once():
    builder = Builder()
    shared = builder.new_nonleaf()
    obj = {"hidden": Hides(shared), "model": nn.Linear(2, 2), "acts": [shared, shared[1:]]}
    found = check_consistency(obj)
    assert [p for p, _ in found] == ["['acts'][0]", "['acts'][1]"]


# The paths that no Python access spells: built the same way here and in a fresh interpreter.
UNSPELLABLE = textwrap.dedent("""
    import collections, torch
    from torch import nn
    import deepcopy_shim
    from ecosystem_support import CopiesUnreachable

    def scenarios():
        model = nn.Linear(2, 2)
        # Per-parameter state shaped like an optimizer's (a defaultdict keyed by the parameters),
        # holding a tensor computed with grad enabled.  (A real optimizer: see the test below; its
        # construction imports torch._dynamo, which would double this child's run time.)
        state = collections.defaultdict(dict)
        state[model.weight]["estimate"] = model(torch.ones(1, 2)) * 2
        out = torch.ones(2, requires_grad=True) * 3
        return {
            "parameter_state": {"model": model, "state": state},
            "custom_deepcopy": {"strategy": CopiesUnreachable(out)},
            "set_member": {"acts": {out}},
            "dict_key": {out: "activation"},
        }

    def paths():
        return {name: [p for p, _ in deepcopy_shim.find_nonleaf_tensors(obj)]
                for name, obj in scenarios().items()}
""")

EXPECTED_UNSPELLABLE = {
    "parameter_state": ["['state'] <under a key of this defaultdict that has no literal spelling "
                        "(Parameter)>"],
    "custom_deepcopy": ["['strategy'] <copied by CopiesUnreachable.__deepcopy__>"],
    "set_member": ["['acts'] <a member of this set (sets have no index)>"],
    "dict_key": ["<a key of this dict>"],
}


def test_unspellable_paths_say_why_and_are_stable_across_processes():
    namespace = {"__name__": "unspellable"}
    exec(UNSPELLABLE, namespace)
    here = namespace["paths"]()
    assert here == EXPECTED_UNSPELLABLE
    for name, obj in namespace["scenarios"]().items():
        found = check_consistency(obj)
        assert [p for p, _ in found] == EXPECTED_UNSPELLABLE[name]
        assert all(split_path(p)[1] is not None for p, _ in found)
    env = {k: v for k, v in os.environ.items() if k != "DEEPCOPY_SHIM"}
    env["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).parent), env.get("PYTHONPATH", "")])
    child = subprocess.run(
        [sys.executable, "-c", UNSPELLABLE + "\nimport json; print(json.dumps(paths()))"],
        capture_output=True, text=True, env=env, timeout=120)
    assert child.returncode == 0, child.stderr
    assert json.loads(child.stdout.strip().splitlines()[-1]) == here


def test_optimizer_state_holding_a_tensor_with_history():
    """A custom optimizer step run with grad enabled leaves a non-leaf tensor in the state, which is
    keyed by the parameters: the path stops at ``state`` and says why."""
    model = nn.Linear(2, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    optimizer.state[model.weight]["estimate"] = model(torch.ones(1, 2)) * 2
    found = check_consistency({"model": model, "optimizer": optimizer})
    assert [p for p, _ in found] == [
        "['optimizer'].state <under a key of this defaultdict that has no literal spelling (Parameter)>"]
    with deepcopy_shim.enabled("silent"):
        copied = copy.deepcopy({"model": model, "optimizer": optimizer})
    weight = copied["model"].weight
    assert copied["optimizer"].param_groups[0]["params"][0] is weight
    assert copied["optimizer"].state[weight]["estimate"].is_leaf


def test_alias_is_named_by_the_attribute_the_copy_took():
    model = nn.Linear(2, 2)
    out = model(torch.ones(1, 2))
    model.first = out
    model.second = out
    assert [p for p, _ in deepcopy_shim.find_nonleaf_tensors(model)] == ["first"]
