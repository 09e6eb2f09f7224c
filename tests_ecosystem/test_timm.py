"""timm: ``ModelEmaV2``/``ModelEmaV3`` deep-copy the model in their constructor.

timm 1.0 imports torchvision at ``import timm``, and torchvision is not installed here (the
registry's torchvision does not load beside this CPU torch; see README.md).  The EMA classes live
in ``timm/utils/model_ema.py``, which needs only torch: it is loaded by file path.  ``test_vit``
goes through ``import timm`` with a torchvision stand-in, removed again after the test.
"""

from __future__ import annotations

import copy
import importlib.util

import pytest
import torch
from ecosystem_support import (
    assert_detached_twin,
    assert_independent_copy,
    assert_reports,
    load_timm_model_ema,
    stubbed_torchvision,
)

if importlib.util.find_spec("timm") is None:
    pytest.skip("timm is not installed", allow_module_level=True)

model_ema = load_timm_model_ema()
X = torch.randn(2, 4, generator=torch.Generator().manual_seed(0))


class Cached(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.GELU(), torch.nn.Linear(8, 3))

    def forward(self, x):
        hidden = self.net[:2](x)
        self.net[1].cache = hidden  # a non-leaf activation kept on a submodule
        return self.net[2](hidden)


def cached_model():
    torch.manual_seed(0)
    model = Cached()
    model(X)
    return model


@pytest.mark.parametrize("ema_class", ["ModelEmaV2", "ModelEmaV3"])
def test_model_ema_of_a_model_with_cached_activation(ema_class):
    cls = getattr(model_ema, ema_class)
    reports = assert_reports(cached_model, lambda m: cls(m), ("net[1].cache",),
                             copied_root=lambda m, ema: ema.module)
    for mode in ("warn", "silent"):
        model, ema = reports.objects[mode], reports.results[mode]
        assert type(ema.module) is Cached and not ema.module.training
        # The EMA holds a detached twin of the cached activation (update() only moves state_dict
        # entries, so it stays stale until the EMA module runs itself).
        assert_detached_twin(model.net[1].cache, ema.module.net[1].cache)
        assert_independent_copy(model, ema.module, (X,), step=False)
        before = [p.detach().clone() for p in ema.module.parameters()]
        # Train the source one step, then let the EMA follow: only its state_dict moves.
        optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
        model(X).pow(2).mean().backward()
        optimizer.step()
        ema.update(model)
        assert any(not torch.equal(p, b) for p, b in zip(ema.module.parameters(), before))
        for p, q in zip(ema.module.parameters(), model.parameters()):
            assert p.untyped_storage().data_ptr() != q.untyped_storage().data_ptr()


def test_deepcopy_of_an_ema_of_a_clean_model_is_native():
    with torch.no_grad():
        model = cached_model()
    reports = assert_reports(lambda: model_ema.ModelEmaV3(model), lambda ema: copy.deepcopy(ema), ())
    for mode in ("warn", "strict", "silent"):
        ema, copied = reports.objects[mode], reports.results[mode]
        assert_independent_copy(ema.module, copied.module, (X,))


def test_vit_with_hook_cached_block_output():
    with stubbed_torchvision():
        import timm

        def make():
            torch.manual_seed(0)
            model = timm.create_model("test_vit", pretrained=False, num_classes=4)
            model.blocks[0].register_forward_hook(lambda mod, inp, out: setattr(mod, "cached_out", out))
            model(torch.randn(1, 3, 160, 160))
            return model

        model = make()
    reports = assert_reports(lambda: model, lambda m: timm.utils.ModelEmaV3(m), ("blocks[0].cached_out",),
                             fresh=False, copied_root=lambda m, ema: ema.module)
    ema = reports.results["warn"]
    assert_detached_twin(model.blocks[0].cached_out, ema.module.blocks[0].cached_out)
    assert_independent_copy(model.eval(), ema.module, (torch.randn(1, 3, 160, 160),), step=False)
