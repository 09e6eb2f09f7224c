"""peft: LoRA models with cached activations, and ``modules_to_save``, which peft deep-copies.

``get_peft_model(..., modules_to_save=["ln_f"])`` wraps ``ln_f`` in a ``ModulesToSaveWrapper``,
whose ``update`` makes ``copy.deepcopy(self.original_module)``: with an output cached on
``ln_f`` that copy natively fails inside peft.  The copy's root is ``ln_f`` itself.
"""

from __future__ import annotations

import copy

import pytest

pytest.importorskip("transformers")
peft = pytest.importorskip("peft")

import torch  # noqa: E402
import transformers  # noqa: E402
from ecosystem_support import assert_independent_copy, assert_like_native, assert_reports  # noqa: E402
from peft import LoraConfig, get_peft_model  # noqa: E402
from transformers import GPT2Config, GPT2LMHeadModel  # noqa: E402

transformers.logging.set_verbosity_error()
# get_peft_model asks transformers for is_gradient_checkpointing, deprecated in transformers 5.2x.
pytestmark = pytest.mark.filterwarnings("ignore:`is_gradient_checkpointing` is deprecated:FutureWarning")

IDS = torch.randint(0, 100, (2, 8), generator=torch.Generator().manual_seed(0))


def tiny_gpt2():
    torch.manual_seed(0)
    return GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=100, n_positions=64,
                                      bos_token_id=1, eos_token_id=2,
                                      resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0))


def lora_config(**extra):
    return LoraConfig(r=4, lora_alpha=8, target_modules=["c_attn"], fan_in_fan_out=True,
                      lora_dropout=0.0, **extra)


def trained_lora_model():
    model = get_peft_model(tiny_gpt2(), lora_config())
    out = model(input_ids=IDS, labels=IDS)
    out.loss.backward()
    return model, out


def logits(model):
    return model(input_ids=IDS).logits


def test_lora_model_after_forward_and_backward_copies_natively():
    reports = assert_reports(lambda: trained_lora_model()[0], lambda m: copy.deepcopy(m), ())
    for mode in ("warn", "strict", "silent"):
        model, copied = reports.objects[mode], reports.results[mode]
        assert_like_native(copied, reports.native[1])
        assert copied.peft_config == model.peft_config
        assert_independent_copy(model, copied, logits)


def test_lora_model_with_cached_activation_in_a_lora_layer():
    def make():
        model, out = trained_lora_model()
        model.base_model.model.transformer.h[0].attn.c_attn.cached = out.logits
        return model

    reports = assert_reports(make, lambda m: copy.deepcopy(m),
                             ("base_model.model.transformer.h[0].attn.c_attn.cached",),
                             copied_root=lambda m, result: result)
    for mode in ("warn", "silent"):
        model, copied = reports.objects[mode], reports.results[mode]
        layer = copied.base_model.model.transformer.h[0].attn.c_attn
        assert type(layer).__name__ == "Linear" and "default" in layer.lora_A
        assert_independent_copy(model, copied, logits)


def test_modules_to_save_copy_made_inside_peft():
    def make():
        model = tiny_gpt2()
        model.transformer.ln_f.register_forward_hook(lambda m, i, out: setattr(m, "cached_out", out))
        model(input_ids=IDS)
        return model

    reports = assert_reports(
        make, lambda m: get_peft_model(m, lora_config(modules_to_save=["ln_f"])), ("cached_out",),
        root=lambda m: m.transformer.ln_f,  # peft copies the original ln_f
        copied_root=lambda m, peft: peft.base_model.model.transformer.ln_f.modules_to_save["default"])
    hidden = torch.randn(2, 8, 32)
    for mode in ("warn", "silent"):
        peft_model = reports.results[mode]
        wrapper = peft_model.base_model.model.transformer.ln_f
        assert type(wrapper).__name__ == "ModulesToSaveWrapper"
        saved = wrapper.modules_to_save["default"]
        assert saved is not wrapper.original_module
        assert_independent_copy(wrapper.original_module, saved, (hidden,))
        assert saved.weight.requires_grad and not wrapper.original_module.weight.requires_grad
