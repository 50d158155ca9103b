"""ModelCheckpoint's file operations: the last checkpoint as a link, and deleting a file that fell out of the
top k (only this run's own files inside its directory: callbacks/checkpoint_state.py)."""

from __future__ import annotations

import os
import shutil
from typing import TYPE_CHECKING, Any

from callbacks import checkpoint_state
from tandem_core.fileio import wait_written

if TYPE_CHECKING:
    from trainer.trainer import Trainer


def link_last(trainer: Trainer, target: str, link: str) -> None:
    """save_last="link": `link` becomes a relative symbolic link to `target` (a copy where links fail)."""
    if trainer.is_global_zero and os.path.abspath(target) != os.path.abspath(link):
        wait_written(
            target
        )  # a link to a file still being written (AsyncCheckpointIO) could dangle after a kill
        if os.path.islink(link) or os.path.isfile(link):
            os.remove(link)
        elif os.path.isdir(link):
            shutil.rmtree(link)
        try:
            os.symlink(os.path.relpath(target, os.path.dirname(link)), link)
        except OSError:  # a file system without links
            shutil.copytree(target, link) if os.path.isdir(target) else shutil.copy(target, link)
    trainer.strategy.comm.barrier("last checkpoint link")


def remove_file(cb: Any, trainer: Trainer, path: str) -> None:
    """Delete a checkpoint of ModelCheckpoint `cb` that fell out of the top k (rank 0; never the last
    checkpoint, the one this fit resumed from, a file outside dirpath or of another run)."""
    keep = {cb.last_model_path, cb.best_model_path, *cb.best_k_models}
    resumed = getattr(trainer, "ckpt_path", None)  # the file this fit resumed from stays (Lightning)
    if resumed and os.path.abspath(resumed) == os.path.abspath(path):
        return
    inside = os.path.dirname(os.path.abspath(path)) == cb.dirpath
    if (
        trainer.is_global_zero
        and path not in keep
        and inside
        and os.path.lexists(path)
        and checkpoint_state.owned(cb, path)
    ):
        if os.path.islink(path):
            os.remove(path)
            return
        # through the strategy's checkpoint plugin (Lightning's remove_checkpoint): a file or a sharded directory
        trainer.strategy.checkpoint_io.remove_checkpoint(path)
