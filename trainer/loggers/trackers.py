"""What the experiment-tracker loggers (W&B, MLflow) share: which rank is rank 0 (the others get Lightning's
DummyExperiment, trainer/loggers/dummy.py), and Lightning's `log_model` rule for uploading a ModelCheckpoint's files as artifacts."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from tandem_core.errors import ConfigError
from tandem_core.fileio import wait_written
from tandem_core.rank_zero import _global_rank


def is_rank_zero() -> bool:
    return _global_rank() == 0


def check_log_model(value: Any) -> bool | str:
    if value is True or value is False or value == "all":
        return value
    raise ConfigError(f"log_model must be True, False or 'all'; got {value!r}")


# what is recorded of the ModelCheckpoint next to each uploaded file, under Lightning's keys (its attribute names:
# the step interval's is underscored there), so that dashboards and queries over them carry over
_SETTINGS = {
    "monitor": "monitor",
    "mode": "mode",
    "save_last": "save_last",
    "save_top_k": "save_top_k",
    "save_weights_only": "save_weights_only",
    "every_n_train_steps": "_every_n_train_steps",
}

#: upload(path, aliases, metadata): send one checkpoint (a file, or a directory for sharded checkpoints)
Upload = Callable[[str, list[str], dict[str, Any]], None]


class ModelUploads:
    """Lightning's `log_model`: "all" uploads each checkpoint right after it is saved; True uploads at the end
    of a successful run (or right away when save_top_k == -1, where every file is kept); False never.

    Only files that are new, or rewritten since their last upload (last.ckpt), are sent again.
    """

    def __init__(self, log_model: bool | str) -> None:
        self.log_model = check_log_model(log_model)
        self._uploaded: dict[str, float] = {}  # path -> its modification time when uploaded
        self._at_end: dict[int, Any] = {}  # the checkpoint callbacks whose files go up at the end

    def after_save(self, checkpoint_callback: Any, upload: Upload) -> None:
        every = getattr(checkpoint_callback, "save_top_k", None) == -1
        if self.log_model == "all" or (self.log_model is True and every):
            self.upload_new(checkpoint_callback, upload)
        elif self.log_model is True:
            self._at_end[id(checkpoint_callback)] = checkpoint_callback

    def at_end(self, upload: Upload) -> None:
        for checkpoint_callback in self._at_end.values():
            self.upload_new(checkpoint_callback, upload)

    def upload_new(self, cb: Any, upload: Upload) -> None:
        scores: dict[str, Any] = {}
        if getattr(cb, "last_model_path", ""):
            scores[cb.last_model_path] = getattr(cb, "current_score", None)
        if getattr(cb, "best_model_path", ""):
            scores[cb.best_model_path] = getattr(cb, "best_model_score", None)
        scores.update(getattr(cb, "best_k_models", {}) or {})
        for (
            path
        ) in scores:  # a file still being written in the background (AsyncCheckpointIO) is uploaded whole
            wait_written(path)
        # only files this run wrote: a path restored from a checkpoint's state is never uploaded
        found = sorted((os.path.getmtime(p), p) for p in scores if os.path.exists(p) and _own(cb, p))
        for mtime, path in found:
            if path in self._uploaded and self._uploaded[path] >= mtime:
                continue
            score = scores[path]
            metadata = {
                "score": score.item() if hasattr(score, "item") else score,  # a Python number, as Lightning's
                "original_filename": os.path.basename(path),
                type(cb).__name__: {key: getattr(cb, k) for k, key in _SETTINGS.items() if hasattr(cb, k)},
            }
            aliases = ["latest", "best"] if path == getattr(cb, "best_model_path", "") else ["latest"]
            upload(path, aliases, metadata)
            self._uploaded[path] = mtime


def _own(cb: Any, path: str) -> bool:
    """`path` is a checkpoint this run's ModelCheckpoint wrote (callbacks/checkpoint_state.py's rule);
    another checkpoint callback's files are its own business."""
    from callbacks.checkpoint import ModelCheckpoint
    from callbacks.checkpoint_state import trusted

    return trusted(cb, path) if isinstance(cb, ModelCheckpoint) else True
