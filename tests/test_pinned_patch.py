"""What installing and removing the patch does that mutation testing of `deepcopy_shim._patch`
found unpinned (issue 20).

Each test is a behaviour seen through `enable()`/`disable()`, the scopes, `import torch`, the
warnings and torch's attributes.  Tests of what happens at `import torch` run in a child
interpreter (torch is imported once per process); the child inherits PYTHONPATH, so it imports
the tree under test.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.filterwarnings("default::deepcopy_shim.DeepcopyShimWarning")


def run_child(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, timeout=120)


def explain(proc: subprocess.CompletedProcess[str]) -> str:
    return f"rc={proc.returncode}\n--- stdout\n{proc.stdout}\n--- stderr\n{proc.stderr}"


# --- the deferred install: one post-import hook per process ------------------------------------


def test_a_deferred_install_that_fails_says_so_once_however_many_users_waited() -> None:
    """Users that wait for `import torch` (enable(), scopes entered and left, enable() again)
    share one post-import hook: an install that fails there is reported once, not once per
    user."""
    proc = run_child(
        """
        import warnings, wrapt
        import deepcopy_shim
        def other_patch(torch):  # runs first: post-import hooks fire in registration order
            torch.nn.Module.__deepcopy__ = lambda self, memo: self
        wrapt.register_post_import_hook(other_patch, "torch")
        deepcopy_shim.enable()
        for _ in range(3):
            with deepcopy_shim.enabled("strict"):
                pass
        deepcopy_shim.enable("silent")
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            import torch
        print(len(caught), [type(w.message).__name__ for w in caught])
        print(all("not installed at `import torch`" in str(w.message) for w in caught))
        """
    )
    assert proc.returncode == 0, explain(proc)
    assert proc.stdout.splitlines() == ["1 ['PatchConflictWarning']", "True"], explain(proc)
