"""Start-up activation from the ``DEEPCOPY_SHIM`` environment variable.

The ``deepcopy_shim.pth`` file that the wheel puts in ``site-packages`` imports this module at
interpreter start-up, but only when ``DEEPCOPY_SHIM`` is set to a non-blank value; with the
variable unset nothing is imported at all.  :func:`activate_from_environment` then calls
:func:`deepcopy_shim.enable` in the mode the variable names.  torch is not imported here: the
patch is applied by a post-import hook when (and if) the program imports torch.

Vocabulary (case-insensitive, surrounding whitespace ignored):

* a mode name (``warn``, ``strict``, ``silent``, as :meth:`Mode.parse` accepts) → that mode;
* ``1``, ``true``, ``on``, ``yes`` → ``warn``;
* ``0``, ``false``, ``off``, ``no`` or empty → off.

Anything else leaves the shim off and prints one line on stderr.  Nothing in this module may
raise during start-up: a broken activation must never stop the user's program from running.
"""

from __future__ import annotations

import os
import sys
from typing import Mapping, Optional

from ._modes import Mode

__all__ = ["ENV_VAR", "ON_VALUES", "OFF_VALUES", "valid_values", "parse_env_value",
           "activate_from_environment", "report_failure"]

ENV_VAR = "DEEPCOPY_SHIM"
ON_VALUES = ("1", "true", "on", "yes")
OFF_VALUES = ("", "0", "false", "off", "no")


def valid_values() -> str:
    """The accepted values, in words, for messages."""
    modes = ", ".join(m.value for m in Mode)
    on, off = ", ".join(ON_VALUES), ", ".join(OFF_VALUES[1:])
    return f"{modes} (or {on} for warn; {off} or empty for off)"


def parse_env_value(value: str) -> Optional[Mode]:
    """Return the mode an environment value names, or ``None`` for "off".

    Raises ``ValueError`` naming the bad value and the valid ones; never anything else.
    """
    word = value.strip().lower()
    if word in OFF_VALUES:
        return None
    if word in ON_VALUES:
        return Mode.WARN
    try:
        return Mode.parse(word)
    except ValueError:
        raise ValueError(
            f"deepcopy_shim: invalid {ENV_VAR}={value!r}; valid values are {valid_values()}; "
            f"the shim stays off (unset {ENV_VAR} to silence this)"
        ) from None


def report_failure(message: str) -> None:
    """Print ``message`` as one line on stderr, whatever state stderr is in; never raises."""
    try:
        line = " ".join(str(message).split())
        stream = sys.stderr
        if stream is not None:
            stream.write(line + "\n")
            stream.flush()
    except Exception:  # stderr closed or unencodable: start-up goes on regardless
        pass


def activate_from_environment(environ: Optional[Mapping[str, str]] = None) -> Optional[Mode]:
    """Enable the shim in the mode ``DEEPCOPY_SHIM`` names; return that mode (``None``: off).

    The patch itself is deferred to ``import torch`` if torch is not imported yet.  Never raises:
    a bad value or a failure to enable is reported as one line on stderr and the shim stays off.
    Explicit code wins: a later :func:`deepcopy_shim.enable`/``disable`` overrides this.
    """
    try:
        env = os.environ if environ is None else environ
        mode = parse_env_value(env.get(ENV_VAR, ""))
        if mode is not None:
            from ._activation import enable

            enable(mode)
        return mode
    except Exception as exc:
        text = str(exc)
        if not text.startswith("deepcopy_shim"):
            text = (f"deepcopy_shim: {ENV_VAR} activation failed ({type(exc).__name__}: {exc}); "
                    f"the shim stays off (unset {ENV_VAR} to silence this)")
        report_failure(text)
        return None
