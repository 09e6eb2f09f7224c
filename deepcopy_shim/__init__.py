"""deepcopy-shim: `copy.deepcopy` for PyTorch models that hold tensors with autograd history.

`import deepcopy_shim; deepcopy_shim.enable()` and `copy.deepcopy(model)` no longer raises
"Only Tensors created explicitly by the user (graph leaves) support the deepcopy protocol": such
tensors are copied as detached leaves, modules are rebuilt from their own state.  Importing this
package does not import torch.

PYTEST_DONT_REWRITE (for pytest, which reads this docstring: `DEEPCOPY_SHIM` imports the
package at interpreter start-up, before pytest could rewrite it; it holds no assertions).
"""

from ._activation import current_mode, deepcopy, disable, enable, enabled, find_nonleaf_tensors, is_enabled
from ._errors import (
    DeepcopyShimWarning,
    DetachedCopyError,
    DetachedTensorsWarning,
    NonLeafTensorError,
    PatchConflictWarning,
    TorchCompatibilityWarning,
)
from ._modes import Mode, ModeSetting, ModeValueError, Source

__version__ = "0.3.0"

__all__ = [
    "DeepcopyShimWarning",
    "DetachedCopyError",
    "DetachedTensorsWarning",
    "Mode",
    "ModeSetting",
    "ModeValueError",
    "NonLeafTensorError",
    "PatchConflictWarning",
    "Source",
    "TorchCompatibilityWarning",
    "current_mode",
    "deepcopy",
    "disable",
    "enable",
    "enabled",
    "find_nonleaf_tensors",
    "is_enabled",
]
