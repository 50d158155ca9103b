"""The Trainer's options read back as attributes, and the run's public properties Lightning documents
(``trainer.limit_train_batches``, ``trainer.ckpt_path``, ``trainer.device_ids``, ``trainer.interrupted``, ...).

A mixin of Trainer: trainer/trainer.py keeps the entry points, this module what a user or callback reads."""

from __future__ import annotations

import signal
from typing import TYPE_CHECKING, Any

from tandem_core.views import view

if TYPE_CHECKING:
    from trainer.loop.state import LoopState
    from trainer.options import TrainerConfig

_OPTIONS = (
    "barebones check_val_every_n_epoch fast_dev_run gradient_clip_algorithm gradient_clip_val limit_train_batches "
    "limit_val_batches limit_test_batches limit_predict_batches log_every_n_steps min_epochs min_steps num_nodes "
    "overfit_batches reload_dataloaders_every_n_epochs val_check_interval enable_autolog_hparams"
).split()


class TrainerReadback:
    """Read-back attributes of every Trainer option, and run properties; see the module docstring."""

    config: TrainerConfig
    state: LoopState
    strategy: Any
    callbacks: list[Any]
    session: Any
    _ckpt_path: str | None = None
    _ckpt_user_managed: bool = False
    _device_spec: Any = None
    _max_epochs_unset: bool = False
    _logged_metrics: dict[str, Any]
    task: Any

    for _name in _OPTIONS:
        locals()[_name] = view(
            f"config.{_name}", f"The ``{_name}`` option as the Trainer uses it (read-only)."
        )
    del _name

    @property
    def max_epochs(self) -> int | None:
        """The epoch limit; None while unset before fit (fit then makes it 1000, or -1 when max_steps is set)."""
        return None if self._max_epochs_unset else self.config.max_epochs

    @property
    def lightning_module(self) -> Any:
        """The task of the current (or last) stage; before one, the task ``strategy.connect`` attached."""
        return self.task if self.task is not None else self.strategy.lightning_module

    @property
    def num_sanity_val_steps(self) -> int | float:
        """Validation batches of the sanity check (``inf`` for -1: all of them)."""
        n = self.config.num_sanity_val_steps
        return float("inf") if n == -1 else n

    @property
    def ckpt_path(self) -> str | None:
        """The checkpoint the last fit/validate/test/predict restored ("best"/"last" resolved to the file), or
        one assigned here: ``trainer.ckpt_path = path`` is restored by the next stage called without one."""
        return self._ckpt_path

    @ckpt_path.setter
    def ckpt_path(self, path: str | None) -> None:
        self._ckpt_path, self._ckpt_user_managed = path, bool(path)

    @property
    def device_ids(self) -> list[int]:
        """Indices of the devices this run uses on each machine."""
        spec, n = self._device_spec, self.config.devices
        if isinstance(spec, (list, tuple)):
            return [int(d) for d in spec]
        if isinstance(spec, str) and "," in spec:
            return [int(d) for d in spec.split(",") if d.strip()]
        if n == "auto":  # what the strategy chose (one process per device on this machine)
            n = max(1, self.strategy.comm.world_size // max(1, self.config.num_nodes))
        return list(range(int(n)))

    @property
    def num_devices(self) -> int:
        """The number of devices this process's strategy uses (Lightning's)."""
        return len(self.device_ids)

    @property
    def node_rank(self) -> int:
        """This machine's index among the run's machines (global rank // processes per machine)."""
        comm = self.strategy.comm
        per_node = max(1, comm.world_size // max(1, self.config.num_nodes))
        return comm.rank // per_node

    precision_plugin = view("strategy.precision")

    @property
    def accelerator(self) -> Any:
        """The Accelerator object of the run's device (the instance given as ``accelerator=``, if one was)."""
        from strategies.accelerators import Accelerator, for_device

        given = getattr(self, "_accelerator_given", None)
        return given if isinstance(given, Accelerator) else for_device(self.strategy.root_device)

    @property
    def scaler(self) -> Any:
        """The precision's gradient scaler (float16 mixed precision), else None."""
        return getattr(self.strategy.precision, "scaler", None)

    @property
    def distributed_sampler_kwargs(self) -> dict[str, int] | None:
        """What the strategy gives each DistributedSampler (None in a one-process run)."""
        comm = self.strategy.comm
        return None if comm.world_size == 1 else {"num_replicas": comm.world_size, "rank": comm.rank}

    @property
    def interrupted(self) -> bool:
        """Whether the last stage ended by an exception or a stop signal."""
        return self.state.status == "interrupted"

    @property
    def received_sigterm(self) -> bool:
        """Whether the run stopped on SIGTERM."""
        return self.state.stop_signal == signal.SIGTERM

    @property
    def evaluating(self) -> bool:
        """Whether a validation or test loop (or the sanity check) is running."""
        stage = self.state.running_stage
        return stage is not None and stage.evaluating

    @property
    def enable_validation(self) -> bool:
        """Whether fit validates (validation_step, validation data, and limit_val_batches > 0)."""
        return self.session is not None and self.session.val_enabled

    @property
    def logged_metrics(self) -> dict[str, Any]:
        """The latest value (a tensor) of everything logged for loggers, logger or not (Lightning's;
        trainer/loggers/logged.py)."""
        from trainer.loggers.logged import current

        return current(self)  # type: ignore[arg-type]

    @property
    def val_check_batch(self) -> int | float | None:
        """The training batches between validations in fit (Lightning's; trainer/loop/val_schedule.py)."""
        from trainer.loop.val_schedule import val_check_batch

        return val_check_batch(self)  # type: ignore[arg-type]

    @property
    def early_stopping_callbacks(self) -> list[Any]:
        """Every EarlyStopping callback."""
        from callbacks.early_stopping import EarlyStopping

        return [cb for cb in self.callbacks if isinstance(cb, EarlyStopping)]

    @property
    def early_stopping_callback(self) -> Any:
        """The first EarlyStopping callback, or None."""
        cbs = self.early_stopping_callbacks
        return cbs[0] if cbs else None

    @property
    def num_sanity_val_batches(self) -> list[int | float]:
        """The sanity check's batches per validation loader (num_sanity_val_steps, capped by each loader); fit
        alone runs a sanity check, so under validate/test/predict it is [] (Lightning's)."""
        if self.state.entry not in (None, "fit"):  # type: ignore[attr-defined]
            return []
        return [min(self.num_sanity_val_steps, n) for n in self.num_val_batches]  # type: ignore[attr-defined]
