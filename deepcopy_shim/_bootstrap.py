"""Start-up activation from the `DEEPCOPY_SHIM` environment variable.

The `deepcopy_shim.pth` file that the wheel puts in `site-packages` imports this module at
interpreter start-up, but only when `DEEPCOPY_SHIM` is set to a value that is not an off word;
with the variable unset nothing is imported at all.  `activate_from_environment()` then
enables the shim in the mode the variable names, with the mode vocabulary of every door (see
`_modes.parse_mode`).  torch is not imported here: the patch is applied by a post-import hook
when (and if) the program imports torch.

Nothing in this module may raise during start-up: a broken activation must never stop the
user's program from running.  A bad value, or a failure to enable, is one line on stderr.
"""

from __future__ import annotations

import os
from typing import Mapping, Optional

from ._modes import Mode, ModeSetting, ModeValueError, Source, parse_mode
from ._notices import print_notice

__all__ = ["ENV_VAR", "activate_from_environment", "environment_setting", "reported_at_startup",
           "startup_failure"]

ENV_VAR = "DEEPCOPY_SHIM"

# The invalid value of the variable that start-up activation reported in this process (None:
# it reported none).  The runner, which reads the same variable after it, then does not say it
# again: one complaint per process, from whichever door speaks first.
_reported: Optional[str] = None


def reported_at_startup(value: str) -> bool:
    """True if start-up activation in this process already said that `DEEPCOPY_SHIM=value` is
    invalid (on stderr)."""
    return _reported == value


def environment_setting(value: str) -> Optional[ModeSetting]:
    """The setting `DEEPCOPY_SHIM=value` makes (None: off; a blank value is unset, so off).

    Raises `ValueError` whose message names the variable, the bad value and the valid ones.
    """
    if not value.strip():  # as the .pth line reads it: `DEEPCOPY_SHIM=` is the variable unset
        return None
    mode = parse_mode(value, f"{ENV_VAR} value")
    if mode is None:
        return None
    return ModeSetting(mode, Source.ENVIRONMENT, f"{ENV_VAR}={value.strip()}", ENV_VAR + "={}")


def startup_failure(exc: BaseException, what: str) -> str:
    """The one line that reports a failed start-up `what` (decided by the exception's type:
    a bad mode value is the user's to fix and speaks for itself; anything else is a failure)."""
    if isinstance(exc, ModeValueError):
        return f"{exc}; {what} skipped"
    fix = ""
    missing = getattr(exc, "name", None) if isinstance(exc, ImportError) else None
    if missing in ("wrapt", "torch"):  # a requirement that cannot be imported: how to mend it
        from ._tested import reinstall_command

        fix = f"; to fix it: {reinstall_command(missing)}"
    return f"deepcopy_shim: {what} failed ({type(exc).__name__}: {exc}); the shim stays off{fix}"


def activate_from_environment(environ: Optional[Mapping[str, str]] = None) -> Optional[Mode]:
    """Enable the shim in the mode `DEEPCOPY_SHIM` names; return that mode (`None`: off).

    The patch itself is deferred to `import torch` if torch is not imported yet.  Never raises:
    a bad value or a failure to enable is reported as one line on stderr and the shim stays off.
    Explicit code wins: a later `deepcopy_shim.enable()`/`disable` overrides this.
    """
    global _reported
    value = None
    try:
        env = os.environ if environ is None else environ
        value = env.get(ENV_VAR, "")
        setting = environment_setting(value)
        if setting is not None:
            from ._activation import set_global

            set_global(setting)
            return setting.mode
        return None
    except Exception as exc:
        print_notice(startup_failure(exc, f"start-up activation by {ENV_VAR}"))
        if isinstance(exc, ModeValueError) and environ is None:  # this process's own variable
            _reported = value
        return None
