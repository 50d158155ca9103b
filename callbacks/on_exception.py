"""OnExceptionCheckpoint: save a checkpoint when fit (or another stage) raises."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from callbacks.base import Checkpoint
from tandem_core.errors import ConfigError

if TYPE_CHECKING:
    from trainer.task.base import Task
    from trainer.trainer import Trainer


class OnExceptionCheckpoint(Checkpoint):
    """Writes ``<dirpath>/<filename>.ckpt`` when the stage raises (a crash, KeyboardInterrupt), so that
    ``fit(ckpt_path=...)`` resumes from there. Example: ``OnExceptionCheckpoint("checkpoints")``.

    When a run that resumed from that very file ends without an error, the file is removed, as in
    Lightning; unlike Lightning, a file another run wrote there is never removed.
    """

    FILE_EXTENSION = ".ckpt"

    def __init__(self, dirpath: str | os.PathLike[str], filename: str = "on_exception") -> None:
        super().__init__()
        if not filename:
            raise ConfigError("OnExceptionCheckpoint(filename=...) cannot be empty.")
        self.dirpath = dirpath
        self.filename = filename
        self._failed = False

    @property
    def ckpt_path(self) -> str:
        """The path of the checkpoint written when a run raises."""
        return os.path.join(self.dirpath, self.filename + self.FILE_EXTENSION)

    def setup(self, trainer: Trainer, task: Task, stage: str) -> None:
        self._failed = False
        if trainer.strategy.comm.world_size > 1:
            raise ConfigError(
                "OnExceptionCheckpoint under several processes: writing a checkpoint needs every process, but an "
                "exception stops only the one it happens in, and the others would wait for it. Use "
                "ModelCheckpoint(save_last=True), or stop with SIGTERM/SIGINT, which checkpoints on every rank."
            )

    def on_exception(self, trainer: Trainer, *_: Any) -> None:
        self._failed = True
        trainer.save_checkpoint(self.ckpt_path)

    def teardown(self, trainer: Trainer, *_: Any) -> None:
        session = trainer.session
        resumed = session is not None and session.ckpt_path is not None
        same = resumed and os.path.abspath(str(session.ckpt_path)) == os.path.abspath(self.ckpt_path)  # type: ignore[union-attr]
        if same and not self._failed and trainer.is_global_zero and os.path.isfile(self.ckpt_path):
            os.remove(self.ckpt_path)
