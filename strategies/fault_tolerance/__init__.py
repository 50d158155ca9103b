"""In-place fault tolerance on torchft (the `fault-tolerance` extra): replica groups that keep training when
one of them fails, and a failed group that rejoins from a live peer. ``DDPStrategy(fault_tolerance=...)`` and
``FSDPStrategy(fault_tolerance=...)`` (HSDP: sharded inside a group, averaged across groups); docs/fault-tolerance.md.

Nothing here imports torchft until a strategy with the option joins its first quorum.
"""

from __future__ import annotations

from typing import Any

from strategies.fault_tolerance.options import FaultTolerance

__all__ = ["FaultTolerance", "join_replicas"]


def join_replicas(strategy: Any, live: Any) -> None:
    """At the start of fit, after a checkpoint was restored: a strategy with fault tolerance (its `replicas`
    attribute) joins its first quorum, taking a live peer's state when its group is behind; others do nothing."""
    replicas = getattr(strategy, "replicas", None)
    if replicas is not None:
        replicas.join(live)
