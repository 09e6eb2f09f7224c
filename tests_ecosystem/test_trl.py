"""trl: ``create_reference_model`` deep-copies the policy inside trl.

The policy is a tiny GPT-2 whose blocks carry ``functools.partial(recorder.hook, name)`` forward
hooks that keep each block's output: after a forward with grad the recorder holds non-leaf
tensors, and trl's ``deepcopy(model)`` natively raises.  The paths go through the hook dict of
block 0 (the recorder is shared, so both outputs are first met there), keyed by the id of the
handle the test registered.  The warning must point at this file, not at trl.
"""

from __future__ import annotations

import functools

import pytest

pytest.importorskip("transformers")
pytest.importorskip("trl")

import torch
import transformers
from ecosystem_support import assert_independent_copy, assert_reports
from transformers import GPT2Config, GPT2LMHeadModel

try:
    from trl.experimental.utils import create_reference_model
except ImportError:  # trl < 1.0 kept it at the top level
    from trl import create_reference_model

transformers.logging.set_verbosity_error()

IDS = torch.randint(0, 100, (2, 8), generator=torch.Generator().manual_seed(0))


class Recorder:
    def __init__(self):
        self.outputs = {}

    def hook(self, name, module, inputs, output):
        self.outputs[name] = output


class Policy:
    """The policy, its recorder and the handles of its hooks."""

    def __init__(self):
        torch.manual_seed(0)
        config = GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=100, n_positions=64,
                            bos_token_id=1, eos_token_id=2,
                            resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
        self.model = GPT2LMHeadModel(config)
        self.recorder = Recorder()
        self.handles = [
            block.register_forward_hook(functools.partial(self.recorder.hook, f"block{i}"))
            for i, block in enumerate(self.model.transformer.h)
        ]
        out = self.model(input_ids=IDS, labels=IDS)  # grad enabled
        out.loss.backward()
        assert not self.recorder.outputs["block0"].is_leaf

    def expected_paths(self):
        hook = f"transformer.h[0]._forward_hooks[{self.handles[0].id}].func.__self__"
        return (f"{hook}.outputs['block0']", f"{hook}.outputs['block1']")


def test_create_reference_model_with_partial_hooks():
    reports = assert_reports(Policy, lambda p: create_reference_model(p.model), Policy.expected_paths,
                             root=lambda p: p.model, copied_root=lambda p, ref: ref)
    for mode in ("warn", "silent"):
        source, ref = reports.objects[mode], reports.results[mode]
        policy = source.model
        assert ref is not policy and type(ref) is type(policy)
        assert not ref.training and not any(p.requires_grad for p in ref.parameters())
        # The copied hooks are bound to one copied recorder, not the source's.
        first, second = (h.id for h in source.handles)
        copied_recorder = ref.transformer.h[0]._forward_hooks[first].func.__self__
        assert copied_recorder is not source.recorder
        assert ref.transformer.h[1]._forward_hooks[second].func.__self__ is copied_recorder
        # Running the copy records into the copied recorder only.
        recorded = dict(source.recorder.outputs)
        ref(input_ids=IDS)
        assert all(source.recorder.outputs[k] is v for k, v in recorded.items())
        assert all(copied_recorder.outputs[k] is not recorded[k] for k in recorded)
        assert_independent_copy(policy, ref, lambda m: m(input_ids=IDS).logits)


def test_create_reference_model_with_shared_layers_reports_the_same():
    """With ``num_shared_layers`` trl freezes the source's shared layers after the copy; the copy
    itself, and so the report, is the same."""
    reports = assert_reports(Policy, lambda p: create_reference_model(p.model, num_shared_layers=1),
                             Policy.expected_paths, root=lambda p: p.model)
    source, ref = reports.objects["warn"], reports.results["warn"]
    shared = ref.transformer.h[0].attn.c_attn.weight
    assert shared.data_ptr() == source.model.transformer.h[0].attn.c_attn.weight.data_ptr()
    assert not source.model.transformer.h[0].attn.c_attn.weight.requires_grad
