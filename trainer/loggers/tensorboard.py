"""TensorBoard event files: scalars at the global step, hyperparameters in the HParams tab.

A run resumed into the same version directory appends: the earlier event files stay, and the new file starts
with a purge marker at the resumed step (SummaryWriter's purge_step), so TensorBoard hides what the earlier
run logged at that step or later, after its checkpoint and before it stopped: each step shows once.
"""

from __future__ import annotations

import os
from typing import Any

from trainer.loggers.base import Logger, add_prefix, flatten


class TensorBoardLogger(Logger):
    """Writes event files to save_dir/name/version_N; view them with ``tensorboard --logdir save_dir``.

    Example: ``Trainer(logger=TensorBoardLogger("runs", name="digits"))``. Hyperparameters go to the HParams
    tab at the end of the run, together with the final value of every scalar the run wrote; with
    `default_hp_metric` (Lightning's) an ``hp_metric`` column too, -1 unless the task logged "hp_metric".
    Lightning's other arguments: `log_graph` (the task's graph from ``example_input_array`` at fit start),
    `prefix` (tags ``f"{prefix}-{key}"``), `sub_dir` (events in ``log_dir/sub_dir``).
    """

    def __init__(
        self,
        save_dir: str = ".",
        name: str | None = "lightning_logs",
        version: int | str | None = None,
        log_graph: bool = False,
        default_hp_metric: bool = True,
        prefix: str = "",
        sub_dir: str | os.PathLike[str] | None = None,
        flush_secs: int = 120,
        **writer_kwargs: Any,
    ) -> None:
        super().__init__(save_dir, name, version)
        self.log_graph_enabled, self.default_hp_metric, self.prefix = log_graph, default_hp_metric, prefix
        self.sub_dir = os.fspath(sub_dir) if sub_dir is not None else None
        self._writer_kwargs = {"flush_secs": flush_secs, **writer_kwargs}
        self._writer: Any = None
        self._hparams: dict[str, Any] = {}
        self._tags: set[str] = set()
        self._purge_step: int | None = None  # set by resumed_at

    @property
    def log_dir(self) -> str:
        """save_dir/name/version_N (or the version string), then sub_dir; ~ and $VARS expanded (Lightning's)."""
        log_dir = super().log_dir
        if self.sub_dir is not None:
            log_dir = os.path.join(log_dir, self.sub_dir)
        return os.path.expanduser(os.path.expandvars(log_dir))

    @property
    def experiment(self) -> Any:
        """The SummaryWriter, created on first use (importing tensorboard is slow)."""
        if self._writer is None:
            from torch.utils.tensorboard import SummaryWriter

            os.makedirs(self.log_dir, exist_ok=True)
            kwargs = dict(self._writer_kwargs)
            if self._purge_step is not None:
                kwargs["purge_step"], self._purge_step = self._purge_step, None
            self._writer = SummaryWriter(log_dir=self.log_dir, **kwargs)
        return self._writer

    def resumed_at(self, step: int) -> None:
        """Events of an earlier run at `step` or later are superseded: the next event file says so."""
        if self._writer is not None:  # opened before the restore: a new file carries the marker
            self._writer.close()
            self._writer = None
        self._purge_step = step

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        metrics = add_prefix(metrics, self.prefix)
        writer = self.experiment
        for name, value in metrics.items():
            writer.add_scalar(name, value, global_step=step)
        self._tags.update(metrics)

    def log_hyperparams(self, params: dict[str, Any], metrics: dict[str, float] | None = None) -> None:
        """Remember `params`; with `metrics` (the end of a run) write both to the HParams tab."""
        self._hparams.update(flatten(params))
        if metrics is None or not self._hparams:
            return
        from torch.utils.tensorboard.summary import hparams

        # The HParams tab reads a metric's value from the scalar tag of the same name in this run, so only
        # metrics that were written as scalars are listed (the others would show up empty).
        final = {k: float(v) for k, v in add_prefix(metrics, self.prefix).items() if k in self._tags}
        hp_metric = next(iter(add_prefix({"hp_metric": 0}, self.prefix)))
        if self.default_hp_metric and hp_metric not in final:  # Lightning's placeholder column
            self.log_metrics({"hp_metric": -1.0}, 0)
            final[hp_metric] = -1.0
        # Written into this run's own event file (SummaryWriter.add_hparams would start a sub-run).
        writer = self.experiment._get_file_writer()
        for summary in hparams(self._hparams, final):
            writer.add_summary(summary)

    def save(self) -> None:
        if self._writer is not None:
            self._writer.flush()

    def finalize(self, status: str) -> None:
        if self._writer is not None:
            self._writer.flush()
            self._writer.close()
            self._writer = None

    def log_graph(self, model: Any, input_array: Any = None) -> None:
        """With log_graph=True, trace `model` on `input_array` (default: its example_input_array) into the
        Graphs tab; a warning when there is nothing to trace it on (as Lightning)."""
        if not self.log_graph_enabled:
            return
        import warnings

        import torch

        inputs = getattr(model, "example_input_array", None) if input_array is None else input_array
        if not isinstance(inputs, (torch.Tensor, tuple)):
            warnings.warn(
                "TensorBoardLogger(log_graph=True) could not log the graph: set the task's example_input_array "
                f"to a tensor or a tuple of forward()'s arguments (it is {type(inputs).__name__})",
                stacklevel=2,
            )
            return
        from strategies.batch import move_to_device
        from trainer.task.export import _scriptable  # a Task's run-reading properties kept out of the trace

        device = next((p.device for p in model.parameters()), torch.device("cpu"))
        with _scriptable(model):
            self.experiment.add_graph(model, move_to_device(inputs, device))
