"""Lightning's ``lightning.pytorch.utilities.memory.recursive_detach``."""

from __future__ import annotations

from typing import Any

import torch

from strategies.batch import apply_to_tensors


def recursive_detach(in_dict: Any, to_cpu: bool = False) -> Any:
    """A copy of `in_dict` (any nesting of dicts, lists and tuples) whose tensors are detached (and moved to the
    CPU with `to_cpu`); the original is left as it is."""

    def detach(t: torch.Tensor) -> torch.Tensor:
        t = t.detach()
        return t.cpu() if to_cpu else t

    return apply_to_tensors(in_dict, detach)
