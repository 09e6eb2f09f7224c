"""transformers: tiny BERT / GPT-2 with cached outputs, ``ModelOutput`` and ``DynamicCache``.

A forward alone leaves a ``PreTrainedModel`` deep-copyable; user caches of its outputs do not:
hidden states, a ``ModelOutput`` (an OrderedDict dataclass with its own ``__reduce__``) and the
``DynamicCache`` of ``past_key_values`` hold non-leaf tensors.
"""

from __future__ import annotations

import copy
import inspect

import pytest

transformers = pytest.importorskip("transformers")

import torch  # noqa: E402
from ecosystem_support import assert_independent_copy, assert_like_native, assert_reports  # noqa: E402
from transformers import BertConfig, BertModel, GPT2Config, GPT2LMHeadModel  # noqa: E402

transformers.logging.set_verbosity_error()

IDS = torch.randint(0, 100, (2, 8), generator=torch.Generator().manual_seed(0))
NO_DROPOUT = dict(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)


def tiny_bert():
    torch.manual_seed(0)
    return BertModel(BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                intermediate_size=64, max_position_embeddings=64, **NO_DROPOUT))


def tiny_gpt2():
    torch.manual_seed(0)
    return GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=100, n_positions=64,
                                      bos_token_id=1, eos_token_id=2,
                                      resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0))


def bert_hidden(model):
    return model(input_ids=IDS).last_hidden_state


def test_bert_after_forward_copies_natively():
    def make():
        bert = tiny_bert()
        bert(input_ids=IDS, output_hidden_states=True)
        return bert

    reports = assert_reports(make, lambda m: copy.deepcopy(m), ())
    for mode in ("warn", "strict", "silent"):
        assert_like_native(reports.results[mode], reports.native[1])
        assert_independent_copy(reports.objects[mode], reports.results[mode], bert_hidden)


def test_bert_with_cached_hidden_states_and_model_output():
    def make():
        bert = tiny_bert()
        out = bert(input_ids=IDS, output_hidden_states=True)
        bert.cached_hidden_states = out.hidden_states
        bert.cached_output = out
        assert out.last_hidden_state is out.hidden_states[-1]  # met once, under hidden states
        return bert

    expected = ("cached_hidden_states[0]", "cached_hidden_states[1]", "cached_hidden_states[2]",
                "cached_output.pooler_output")
    reports = assert_reports(make, lambda m: copy.deepcopy(m), expected,
                             copied_root=lambda m, result: result)
    for mode in ("warn", "silent"):
        bert, copied = reports.objects[mode], reports.results[mode]
        # Identity inside the copy is kept: the copied output's last state is the copied tuple's.
        assert copied.cached_output.last_hidden_state is copied.cached_hidden_states[2]
        assert type(copied.cached_output) is type(bert.cached_output)
        assert copied.cached_output["pooler_output"] is copied.cached_output.pooler_output
        assert_independent_copy(bert, copied, bert_hidden)


def test_model_output_alone():
    def make():
        return tiny_bert()(input_ids=IDS, output_hidden_states=True)

    expected = ("last_hidden_state", "pooler_output", "hidden_states[0]", "hidden_states[1]")
    reports = assert_reports(make, lambda out: copy.deepcopy(out), expected,
                             copied_root=lambda out, result: result)
    out, copied = reports.objects["warn"], reports.results["warn"]
    assert list(copied.keys()) == list(out.keys())
    assert copied.hidden_states[2] is copied.last_hidden_state


def test_gpt2_with_cached_hidden_states_and_dynamic_cache():
    def make():
        gpt2 = tiny_gpt2()
        out = gpt2(input_ids=IDS, output_hidden_states=True, use_cache=True)
        gpt2.last_hidden_states = out.hidden_states
        gpt2.last_past = out.past_key_values
        return gpt2

    def expected(gpt2):
        layers = range(len(gpt2.last_past.layers))
        return (*(f"last_hidden_states[{i}]" for i in range(len(gpt2.last_hidden_states))),
                *(f"last_past.layers[{i}].{kv}" for i in layers for kv in ("keys", "values")))

    assert len(expected(make())) == 3 + 2 * 2
    reports = assert_reports(make, lambda m: copy.deepcopy(m), expected,
                             copied_root=lambda m, result: result)
    for mode in ("warn", "silent"):
        gpt2, copied = reports.objects[mode], reports.results[mode]
        assert type(copied.last_past) is type(gpt2.last_past)
        assert copied.last_past.get_seq_length() == gpt2.last_past.get_seq_length() == IDS.shape[1]
        assert_independent_copy(gpt2, copied, lambda m: m(input_ids=IDS).logits)


def test_dynamic_cache_alone_can_continue_generation_in_the_copy():
    def make():
        return tiny_gpt2()(input_ids=IDS, use_cache=True).past_key_values

    def expected(cache):
        return tuple(f"layers[{i}].{kv}" for i in range(len(cache.layers)) for kv in ("keys", "values"))

    reports = assert_reports(make, lambda c: copy.deepcopy(c), expected,
                             copied_root=lambda c, result: result)
    cache, copied = reports.objects["silent"], reports.results["silent"]
    model = tiny_gpt2()
    next_ids = IDS[:, -1:]
    # transformers 5.2x renamed the argument (``past_key_values`` is deprecated, with a warning).
    name = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
    with torch.no_grad():
        from_copy = model(input_ids=next_ids, use_cache=True, **{name: copied}).logits
        from_source = model(input_ids=next_ids, use_cache=True, **{name: cache}).logits
    torch.testing.assert_close(from_copy, from_source)
    assert copied.get_seq_length() == cache.get_seq_length() == IDS.shape[1] + 1
