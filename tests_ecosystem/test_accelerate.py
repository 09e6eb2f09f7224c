"""accelerate: a prepared model and optimizer, copied together with the Accelerator.

``Accelerator.__deepcopy__`` returns the accelerator itself; the prepared optimizer
(``AcceleratedOptimizer``, with its own ``__getstate__``) must come out pointing at the copied
parameters, and only the user's cached logits are reported.
"""

from __future__ import annotations

import copy

import pytest

pytest.importorskip("transformers")
accelerate = pytest.importorskip("accelerate")

import torch  # noqa: E402
import transformers  # noqa: E402
from ecosystem_support import assert_independent_copy, assert_reports  # noqa: E402
from transformers import GPT2Config, GPT2LMHeadModel  # noqa: E402

transformers.logging.set_verbosity_error()

IDS = torch.randint(0, 100, (2, 8), generator=torch.Generator().manual_seed(0))


def training_state():
    torch.manual_seed(0)
    accelerator = accelerate.Accelerator(cpu=True)
    model = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=100, n_positions=64,
                                       bos_token_id=1, eos_token_id=2,
                                       resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model, optimizer = accelerator.prepare(model, optimizer)
    out = model(input_ids=IDS, labels=IDS)
    accelerator.backward(out.loss)
    optimizer.step()
    model.last_logits = out.logits  # the user's cache
    return {"accelerator": accelerator, "model": model, "optimizer": optimizer}


def logits(model):
    return model(input_ids=IDS).logits


def test_prepared_model_with_cached_logits():
    reports = assert_reports(lambda: training_state()["model"], lambda m: copy.deepcopy(m), ("last_logits",),
                             copied_root=lambda m, result: result)
    for mode in ("warn", "silent"):
        assert_independent_copy(reports.objects[mode], reports.results[mode], logits)


def test_accelerator_model_and_optimizer_copied_together():
    reports = assert_reports(training_state, lambda state: copy.deepcopy(state), ("['model'].last_logits",),
                             copied_root=lambda state, result: result)
    for mode in ("warn", "silent"):
        state, copied = reports.objects[mode], reports.results[mode]
        assert copied["accelerator"] is state["accelerator"]  # Accelerator.__deepcopy__ returns self
        optimizer = copied["optimizer"]
        assert type(optimizer) is type(state["optimizer"])
        params = list(copied["model"].parameters())
        inner = optimizer.optimizer
        assert all(p is q for p, q in zip(inner.param_groups[0]["params"], params))
        # The momentum buffers were copied and are keyed by the copied parameters.
        source_state = state["optimizer"].optimizer.state
        for p, q in zip(params, state["model"].parameters()):
            buffer, source_buffer = inner.state[p]["momentum_buffer"], source_state[q]["momentum_buffer"]
            assert torch.equal(buffer, source_buffer) and buffer is not source_buffer
        assert_independent_copy(state["model"], copied["model"], logits)
