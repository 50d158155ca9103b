"""Lightning's ``lightning.pytorch.utilities.model_summary`` under Tandem (callbacks/summary/model_summary.py)."""

from __future__ import annotations

from callbacks.summary.model_summary import (
    LEFTOVER_PARAMS_NAME,
    NOT_APPLICABLE,
    UNKNOWN_SIZE,
    ModelSummary,
    get_formatted_model_size,
    get_human_readable_count,
    parse_batch_shape,
    summarize,
)

__all__ = [
    "LEFTOVER_PARAMS_NAME",
    "NOT_APPLICABLE",
    "UNKNOWN_SIZE",
    "ModelSummary",
    "get_formatted_model_size",
    "get_human_readable_count",
    "parse_batch_shape",
    "summarize",
]
