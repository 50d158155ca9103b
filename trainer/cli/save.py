"""SaveConfigCallback: LightningCLI writes the config it ran with next to the run's logs, as Lightning's does.

    LightningCLI(MyModel, save_config_kwargs={"overwrite": True})   # config.yaml in trainer.log_dir

When a stage sets up (once per Trainer), global rank 0 writes ``<log_dir>/config.yaml`` (atomically); an
existing file there is a RuntimeError on every rank unless ``overwrite=True``, so that a run never writes over
another run's config. Subclass it and override `save_config` to keep the config elsewhere as well (a logger's
hyperparameters); with ``save_to_log_dir=False`` only `save_config` runs.
"""

from __future__ import annotations

import os
from typing import Any

from callbacks.base import Callback
from tandem_core.fileio import atomic_write


class SaveConfigCallback(Callback):
    """Saves the LightningCLI config (`config`, as `parser` parsed it) to the log directory at setup."""

    def __init__(
        self,
        parser: Any,
        config: Any,
        config_filename: str = "config.yaml",
        overwrite: bool = False,
        multifile: bool = False,
        save_to_log_dir: bool = True,
    ) -> None:
        self.parser, self.config = parser, config
        self.config_filename, self.overwrite, self.multifile = config_filename, overwrite, multifile
        self.save_to_log_dir = save_to_log_dir
        self.already_saved = False
        if not save_to_log_dir and type(self).save_config is SaveConfigCallback.save_config:
            raise ValueError(
                "`save_to_log_dir=False` only makes sense when subclassing SaveConfigCallback to implement "
                "`save_config`: the config would be saved nowhere."
            )

    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        """Write the config (rank 0) once, then call `save_config` (rank 0)."""
        if self.already_saved:
            return
        comm = trainer.strategy.comm
        if self.save_to_log_dir:
            log_dir = trainer.log_dir
            path = os.path.join(log_dir, self.config_filename)
            exists = comm.broadcast(os.path.isfile(path) if trainer.is_global_zero else False)
            if exists and not self.overwrite:
                raise RuntimeError(
                    f"{type(self).__name__} expected {path} to NOT exist. Aborting to avoid overwriting the config "
                    "of an earlier run: delete that file, give LightningCLI(save_config_callback=None) to save no "
                    'config, or LightningCLI(save_config_kwargs={"overwrite": True}) to write over it.'
                )
            if trainer.is_global_zero:
                os.makedirs(log_dir, exist_ok=True)
                if self.multifile:  # jsonargparse keeps the files the config came from
                    self.parser.save(
                        self.config, path, skip_unset=False, overwrite=self.overwrite, multifile=True
                    )
                else:
                    atomic_write(path, self.parser.dump(self.config, skip_unset=False))
        if trainer.is_global_zero:
            self.save_config(trainer, pl_module, stage)
            self.already_saved = True
        self.already_saved = comm.broadcast(self.already_saved)  # every rank skips the later stages' setup

    def save_config(self, trainer: Any, pl_module: Any, stage: str) -> None:
        """Override to keep the config somewhere else too (called on global rank 0 only, so it must not call
        collectives), e.g. ``trainer.logger.log_hyperparams({"config": self.parser.dump(self.config)})``."""
