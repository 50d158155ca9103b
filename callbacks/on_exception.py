"""OnExceptionCheckpoint: save a checkpoint when fit (or another stage) raises."""

from __future__ import annotations

import os
import re
import warnings
from typing import TYPE_CHECKING, Any

from callbacks.base import Checkpoint
from callbacks.checkpoint_names import unique_path
from callbacks.checkpoint_state import new_token, stored_tokens
from tandem_core.errors import ConfigError

if TYPE_CHECKING:
    from trainer.task.base import Task
    from trainer.trainer import Trainer


class OnExceptionCheckpoint(Checkpoint):
    """Writes ``<dirpath>/<filename>.ckpt`` when the stage raises (a crash, KeyboardInterrupt), so that
    ``fit(ckpt_path=...)`` resumes from there. Example: ``OnExceptionCheckpoint("checkpoints")``.

    When a run that resumed from that very file ends without an error, the file is removed, as in
    Lightning; unlike Lightning, a file another run wrote there is never removed nor replaced: where one is,
    this run's goes beside it as ``<filename>-v1.ckpt`` (-v2, ...; `saved_path` says which), as
    ModelCheckpoint does. Ownership is ModelCheckpoint's token rule (callbacks/checkpoint_state.py): each
    run has a random token, stored in the files it writes; a resumed run is the same run going on only
    when the file it resumed from is one of this callback's names and still holds the token it loaded.
    """

    FILE_EXTENSION = ".ckpt"

    def __init__(self, dirpath: str | os.PathLike[str], filename: str = "on_exception") -> None:
        super().__init__()
        if not filename:
            raise ConfigError("OnExceptionCheckpoint(filename=...) cannot be empty.")
        self.dirpath = dirpath
        self.filename = filename
        self._failed = False
        self._token = new_token()  # this run's, stored in the file it writes
        self._restored: str | None = None  # the token of the state this run resumed from
        self.saved_path: str | None = None  # where this run's crash checkpoint went

    @property
    def ckpt_path(self) -> str:
        """The path of the checkpoint written when a run raises."""
        return os.path.join(self.dirpath, self.filename + self.FILE_EXTENSION)

    def state_dict(self) -> dict[str, Any]:
        return {"run_token": self._token}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        token = state.get("run_token")
        self._restored = token if isinstance(token, str) and token else None  # adopted only if it is ours

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
        resumed = self._resumed_own(trainer)
        if resumed is not None:  # the same run going on: its file carries its token again
            self._token = self._restored or self._token
        mine = self.saved_path or resumed or ""
        path = unique_path(os.path.abspath(self.ckpt_path), mine and os.path.abspath(mine))
        if path != os.path.abspath(self.ckpt_path) and path != mine:
            warnings.warn(
                f"OnExceptionCheckpoint: {self.ckpt_path!r} is another run's crash checkpoint; this run's is "
                f"written beside it, to {path!r}.",
                UserWarning,
                stacklevel=2,
            )
        self.saved_path = path
        trainer.save_checkpoint(path)

    def teardown(self, trainer: Trainer, task: Any, stage: str) -> None:
        resumed = self._resumed_own(trainer)
        if resumed is not None and not self._failed and trainer.is_global_zero and os.path.isfile(resumed):
            os.remove(resumed)

    def _resumed_own(self, trainer: Trainer) -> str | None:
        """The crash file this run resumed from: one of this callback's names in its directory that still
        holds the token loaded from it (a file another run wrote there meanwhile holds another)."""
        session = trainer.session
        restoring = getattr(session, "restoring", None)  # the file read, also for "last" or resume="auto"
        path = getattr(restoring, "path", None) or (None if session is None else session.ckpt_path)
        if path is None or self._restored is None:
            return None
        path = os.path.abspath(str(path))
        name = re.escape(self.filename) + r"(-v\d+)?" + re.escape(self.FILE_EXTENSION)
        same_dir = os.path.dirname(path) == os.path.abspath(self.dirpath)
        if not same_dir or not re.fullmatch(name, os.path.basename(path)) or not os.path.isfile(path):
            return None
        return path if self._restored in stored_tokens(path) else None
