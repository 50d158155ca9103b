"""Lightning's public utilities (``lightning.pytorch.utilities``) under Tandem: ``from trainer.utilities import
rank_zero_info, grad_norm, CombinedLoader, ...``. Each is Tandem's own, with Lightning's signature and results."""

from __future__ import annotations

from callbacks.throughput.meter import measure_flops
from tandem_core.rank_zero import (
    TandemDeprecationWarning,
    rank_zero_debug,
    rank_zero_deprecation,
    rank_zero_info,
    rank_zero_only,
    rank_zero_warn,
)
from trainer.task.hparams import AttributeDict
from trainer.utilities.combined_loader import CombinedLoader
from trainer.utilities.compile import from_compiled, to_uncompiled
from trainer.utilities.data import (
    has_len_all_ranks,
    is_picklable,
    move_data_to_device,
    suggested_max_num_workers,
)
from trainer.utilities.distributed import is_shared_filesystem
from trainer.utilities.enums import (
    GradClipAlgorithmType,
    LightningEnum,
    PossibleUserWarning,
    disable_possible_user_warnings,
)
from trainer.utilities.grads import grad_norm
from trainer.utilities.model_helpers import is_overridden
from trainer.utilities.parameter_tying import find_shared_parameters, set_shared_parameters

__all__ = [
    "AttributeDict",
    "CombinedLoader",
    "GradClipAlgorithmType",
    "LightningEnum",
    "PossibleUserWarning",
    "disable_possible_user_warnings",
    "is_shared_filesystem",
    "TandemDeprecationWarning",
    "find_shared_parameters",
    "from_compiled",
    "grad_norm",
    "has_len_all_ranks",
    "is_overridden",
    "is_picklable",
    "measure_flops",
    "move_data_to_device",
    "rank_zero_debug",
    "rank_zero_deprecation",
    "rank_zero_info",
    "rank_zero_only",
    "rank_zero_warn",
    "set_shared_parameters",
    "suggested_max_num_workers",
    "to_uncompiled",
]
