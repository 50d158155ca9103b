"""find_unused_parameters: which parameters any rank used in a synchronised backward, agreed on the host.

A parameter that no rank used keeps ``.grad`` None (torch's DDP semantics); one that some rank used gets the
average, where the ranks that did not use it add zeros. Whether a rank used a parameter is known on its host
(its gradient hook ran), so the ranks agree on host memory: a CPU all-reduce, on the group itself under
gloo and on a gloo group of the same ranks under NCCL. It starts when the last bucket is launched and is
waited for in finalize, so no device value is read on the host (torch's DDP reads a device copy back whenever
a rank has a locally unused parameter). The gloo group is made once, by every rank of the group.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from strategies import group_exit
from strategies.multinode import bind_gloo_interface


class UsedParameters:
    """The per-parameter "used here" flags of one backward and their agreement over the ranks."""

    def __init__(self, n: int, process_group: Any, device: torch.device) -> None:
        self.n = n
        self.local = [0] * n  # set by the gradient hooks (host values)
        self.group = process_group if device.type == "cpu" else _host_group(process_group)
        self._flags: torch.Tensor | None = None
        self._work: Any = None
        group_exit.on_close(self.release)

    def start(self) -> None:
        """Start the agreement on this backward's flags (asynchronously)."""
        self._flags = torch.tensor(self.local, dtype=torch.int32)  # host memory, for a CPU all-reduce
        self._work = dist.all_reduce(self._flags, group=self.group, async_op=True)

    @property
    def started(self) -> bool:
        return self._work is not None

    def collect(self) -> list[int] | None:
        """The agreed flags (non-zero: some rank used the parameter), None if no agreement was started; then
        ready for the next backward."""
        flags, work = self._flags, self._work
        self._flags, self._work, self.local = None, None, [0] * self.n
        if work is None or flags is None:
            return None
        work.wait()
        return flags.tolist()

    def reset(self) -> None:
        """Forget this backward's flags and any agreement on them (after a failed backward: its work keeps
        its own tensor)."""
        self.local, self._flags, self._work = [0] * self.n, None, None

    def release(self) -> None:
        """Drop the group (at exit, before the groups close)."""
        self.group = None


def _host_group(process_group: Any) -> Any:
    """A gloo group of `process_group`'s ranks (made by those ranks only)."""
    bind_gloo_interface()  # (several nodes: gloo must not bind a loopback address)
    ranks = dist.get_process_group_ranks(process_group) if process_group is not None else None
    if ranks is None:
        ranks = list(range(dist.get_world_size()))
    return dist.new_group(ranks, backend="gloo", use_local_synchronization=True)
