"""Tandem: a small, fast, Lightning-style trainer for PyTorch.

Names are imported on first use (PEP 562), so `import trainer` is cheap and `strategies`, which needs
`tandem_core.errors`, can be imported before or after this package without a cycle.
"""

from __future__ import annotations

import importlib
import os
from typing import TYPE_CHECKING, Any

import tandem_core  # noqa: F401 (NVML-based CUDA checks, set before anything asks torch about CUDA)

__version__ = "0.1.0"

_EXPORTS = {
    "DataModule": "trainer.task.datamodule",
    "TandemError": "tandem_core.errors",
    "Task": "trainer.task.base",
    "TaskOptimizer": "trainer.loop.task_optimizer",
    "Trainer": "trainer.trainer",
    "Tuner": "trainer.tuner",
    "seed_everything": "trainer.seed",
    "rank_zero_only": "tandem_core.rank_zero",
}
__all__ = list(_EXPORTS)

if TYPE_CHECKING:
    from tandem_core.errors import TandemError  # noqa: F401
    from tandem_core.rank_zero import rank_zero_only  # noqa: F401
    from trainer.loop.task_optimizer import TaskOptimizer  # noqa: F401
    from trainer.seed import seed_everything  # noqa: F401
    from trainer.task.base import Task  # noqa: F401
    from trainer.task.datamodule import DataModule  # noqa: F401
    from trainer.trainer import Trainer  # noqa: F401
    from trainer.tuner import Tuner  # noqa: F401


if os.environ.get("POSSIBLE_USER_WARNINGS", "").lower() in ("0", "off"):  # Lightning's switch, read at import
    from trainer.utilities.enums import disable_possible_user_warnings

    disable_possible_user_warnings()


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'trainer' has no attribute {name!r}")
