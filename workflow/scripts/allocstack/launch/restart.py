"""A restart policy (config ``services.<name>.restart``, ``worker.restart``; Compose's ``restart:`` and
``deploy.restart_policy``) as pure functions: whether a program that ended is started again, and after how long.

The supervisor (allocstack/launch/supervise.py) asks :func:`restart_after` each time its child ends. The rule:

* a program ended by our own stop signal (the stack's normal stop, ``main`` ended) is never restarted;
* ``condition`` ``none``: never; ``on-failure``: when it ended otherwise than with exit 0 (a non-zero exit, or
  killed by a signal from outside: ``kill -9``, the OOM killer); ``any``: whenever it ended by itself;
* at most ``max_attempts`` restarts (None: no limit) within any ``window`` seconds (0: in all), as Compose's
  ``deploy.restart_policy`` counts them;
* each after ``delay`` seconds.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..common.cli import non_negative_float, positive_int

CONDITIONS = ("none", "on-failure", "any")


@dataclass(frozen=True)
class RestartPolicy:
    """When a program that ended by itself is started again (see the module's rule)."""

    condition: str = "none"
    delay: float = 0.0
    max_attempts: int | None = None
    window: float = 0.0

    def __post_init__(self) -> None:
        if self.condition not in CONDITIONS:
            raise ValueError(f"restart condition {self.condition!r} is not one of {', '.join(CONDITIONS)}")
        if self.delay < 0 or self.window < 0 or (self.max_attempts is not None and self.max_attempts < 1):
            raise ValueError("restart delay and window must be >= 0 and max_attempts >= 1")

    @classmethod
    def from_config(cls, spec: Mapping[str, Any] | None) -> RestartPolicy:
        """From a config ``restart`` block (the schema's keys; missing ones take their defaults)."""
        spec = spec or {}
        return cls(spec.get("condition", "none"), float(spec.get("delay", 0)), spec.get("max_attempts"),
                   float(spec.get("window", 0)))

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> RestartPolicy:
        """From the options :func:`add_arguments` adds."""
        return cls(args.restart, args.restart_delay, args.restart_max_attempts, args.restart_window)

    def options(self) -> list[tuple[str, Any]]:
        """The options that give this policy to a supervisor (none when it never restarts)."""
        if self.condition == "none":
            return []
        pairs: list[tuple[str, Any]] = [("--restart", self.condition), ("--restart-delay", self.delay),
                                        ("--restart-window", self.window)]
        if self.max_attempts is not None:
            pairs.append(("--restart-max-attempts", self.max_attempts))
        return pairs

    def describe(self) -> str:
        """``restart: on-failure, at most 2 restarts within 60 s, 1 s apart``."""
        if self.condition == "none":
            return "restart: none"
        limit = f"at most {self.max_attempts} restart{'s' if self.max_attempts != 1 else ''}" \
            if self.max_attempts is not None else "no limit on restarts"
        within = f" within {self.window:g} s" if self.window and self.max_attempts is not None else ""
        return f"restart: {self.condition}, {limit}{within}, {self.delay:g} s apart"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of a restart policy (config ``restart``: condition, delay, max_attempts, window)."""
    parser.add_argument("--restart", choices=CONDITIONS, default="none",
                        help="start the program again when it ended by itself: on-failure (not exit 0) or any")
    parser.add_argument("--restart-delay", type=non_negative_float, default=0.0, help="seconds before each restart")
    parser.add_argument("--restart-max-attempts", type=positive_int, default=None,
                        help="most restarts (within --restart-window); default: no limit")
    parser.add_argument("--restart-window", type=non_negative_float, default=0.0,
                        help="seconds a restart counts toward --restart-max-attempts (0 = always)")


def counted(policy: RestartPolicy, restarts: Sequence[float], now: float) -> int:
    """How many of the earlier ``restarts`` (their times) count toward ``max_attempts`` at ``now``: those of the
    last ``window`` seconds (window 0: every one)."""
    if not policy.window:
        return len(restarts)
    return sum(1 for when in restarts if now - when < policy.window)


def restart_after(policy: RestartPolicy, code: int, stopped: bool, restarts: Sequence[float],
                  now: float) -> float | None:
    """Seconds to wait before starting again a program that ended with return code ``code`` (negative: killed by
    that signal); None: it is not started again.

    :param stopped: we had asked it to stop (a stop signal passed on, or the stack's end): never restarted.
    :param restarts: when (on the same clock as ``now``) each earlier restart was made.
    """
    if stopped or policy.condition == "none" or (policy.condition == "on-failure" and code == 0):
        return None
    if policy.max_attempts is not None and counted(policy, restarts, now) >= policy.max_attempts:
        return None
    return policy.delay


def exhausted(policy: RestartPolicy, code: int, stopped: bool, restarts: int) -> str | None:
    """What to add to the line of a program that ended for good although its policy restarts it: the restarts
    made and why none follows (its max_attempts); None when the policy does not apply to this end."""
    if stopped or policy.condition == "none" or (policy.condition == "on-failure" and code == 0):
        return None
    times = f"{restarts} time{'s' if restarts != 1 else ''}"
    return f"restarted {times} ({policy.describe()}): not restarted again"
