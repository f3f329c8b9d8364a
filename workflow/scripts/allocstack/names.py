"""The names allocstack derives from yours: a service's and a volume's variables.

Standard library only: the rules load this file by its path (common.smk), the scripts import it.
"""

from __future__ import annotations

import re

#: Your own service names (config ``services``, Compose service names).
SERVICE_NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")
VOLUME_PREFIX = "ALLOCSTACK_VOLUME_"


def upper_name(name: str) -> str:
    """A name as a part of a variable name: upper-cased, every character but letters and digits as ``_``."""
    return re.sub(r"[^A-Z0-9]", "_", name.upper())


def variable_prefix(service: str) -> str:
    """``ALLOCSTACK_<NAME>_``: the prefix of the variables that tell a program where ``service`` listens."""
    return f"ALLOCSTACK_{upper_name(service)}_"


def volume_variable(volume: str) -> str:
    """``ALLOCSTACK_VOLUME_<NAME>``: the variable naming a named volume's directory."""
    return VOLUME_PREFIX + upper_name(volume)
