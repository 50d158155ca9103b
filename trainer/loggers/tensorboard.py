"""TensorBoard event files: scalars at the global step, hyperparameters in the HParams tab.

A run resumed into the same version directory appends: the earlier event files stay, and the new file starts
with a purge marker at the resumed step (SummaryWriter's purge_step), so TensorBoard hides what the earlier
run logged at that step or later, after its checkpoint and before it stopped: each step shows once.
"""

from __future__ import annotations

import os
from typing import Any

from tandem_core.rank_zero import rank_zero_only
from trainer.loggers.base import Logger, add_prefix, as_params, flatten, write_hparams_yaml
from trainer.loggers.dummy import rank_zero_experiment


class TensorBoardLogger(Logger):
    """Writes event files to save_dir/name/version_N; view them with ``tensorboard --logdir save_dir``.

    Example: ``Trainer(logger=TensorBoardLogger("runs", name="digits"))``. Hyperparameters go to the HParams
    tab when each stage starts (as Lightning), so a run killed later has them; with `default_hp_metric`
    (Lightning's) its one metric column is ``hp_metric``: -1, or the last value the task logged under that name.
    Lightning's other arguments: `log_graph` (the task's graph from ``example_input_array`` at fit start),
    `prefix` (tags ``f"{prefix}-{key}"``), `sub_dir` (events in ``log_dir/sub_dir``). Each event is written
    through to the file when it is logged (trainer/loggers/event_file.py), so `flush_secs` bounds nothing.
    """

    NAME_HPARAMS_FILE = "hparams.yaml"

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
        # kept as given and passed on as **self._kwargs: LightningCLI (jsonargparse) then offers SummaryWriter's
        # arguments (comment, max_queue, ...) as this logger's, as Lightning's does
        self._flush_secs = flush_secs
        self._kwargs = writer_kwargs
        self._writer: Any = None
        self._hparams: dict[str, Any] = {}
        self._params: dict[str, Any] | None = None  # as given, for hparams.yaml (None: none logged yet)
        self._purge_step: int | None = None  # set by resumed_at

    @property
    def log_dir(self) -> str:
        """save_dir/name/version_N (or the version string), then sub_dir; ~ and $VARS expanded (Lightning's)."""
        log_dir = super().log_dir
        if self.sub_dir is not None:
            log_dir = os.path.join(log_dir, self.sub_dir)
        return os.path.expanduser(os.path.expandvars(log_dir))

    @property
    @rank_zero_experiment
    def experiment(self) -> Any:
        """torch's SummaryWriter, created on first use (importing tensorboard is slow); it writes each event
        in this thread (trainer/loggers/event_file.py). On ranks other than 0 a DummyExperiment (Lightning's)."""
        if self._writer is None:
            from trainer.loggers.event_file import SummaryWriter

            os.makedirs(self.log_dir, exist_ok=True)
            purge = {} if self._purge_step is None else {"purge_step": self._purge_step}
            self._purge_step = None
            self._writer = SummaryWriter(
                log_dir=self.log_dir, flush_secs=self._flush_secs, **purge, **self._kwargs
            )
        return self._writer

    def resumed_at(self, step: int) -> None:
        """Events of an earlier run at `step` or later are superseded: the next event file says so."""
        if self._writer is not None:  # opened before the restore: a new file carries the marker
            self._writer.close()
            self._writer = None
        self._purge_step = step

    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        """All of a step's scalars in one event (one Summary holding a value per tag): an event's cost
        (serializing, a checksum in Python, a write) is per event, so a step of several metrics costs what
        one did. Each value is what torch's add_scalar writes for a number, a `simple_value` (its `scalar()`
        takes 30 µs per call inside a fit, converting through numpy)."""
        from torch.utils.tensorboard.summary import Summary

        value = Summary.Value
        values = [
            value(tag=name, simple_value=float(x)) for name, x in add_prefix(metrics, self.prefix).items()
        ]
        if not values:
            return
        # the open writer directly (no rank lookup per step); on ranks other than 0 the experiment is a
        # DummyExperiment, whose file writer is None: nothing is written there (Lightning's rank-zero-only)
        writer = (self._writer if self._writer is not None else self.experiment)._get_file_writer()
        if writer is not None:
            writer.add_summary(Summary(value=values), step)

    @rank_zero_only
    def log_hyperparams(
        self, params: dict[str, Any] | None = None, metrics: Any = None, step: int | None = None
    ) -> None:
        """Lightning's: `params` (with those given before) go to the HParams tab with `metrics`, each also
        written as a scalar at `step` (None: 0); without metrics (one number: the hp_metric), ``hp_metric=-1`` when `default_hp_metric`, else the
        params are only remembered. The Trainer calls this at the start of each stage. TensorBoard's reader
        keeps the first HParams summary of a run (later ones are ignored), so the tab's columns are those
        of the first call; each column shows the last value of the scalar of that name."""
        params = as_params(params)
        self._hparams.update(flatten(params))
        self._params = {**(self._params or {}), **params}
        if metrics is None:
            metrics = {"hp_metric": -1} if self.default_hp_metric else {}
        elif not isinstance(metrics, dict):  # one number: the hp_metric (Lightning's)
            metrics = {"hp_metric": metrics}
        if not metrics:
            return
        from torch.utils.tensorboard.summary import hparams

        self.log_metrics(metrics, step)  # (None: TensorBoard's step 0)
        # Written into this run's own event file (SummaryWriter.add_hparams would start a sub-run), under
        # the scalars' own (prefixed) names, so that the tab finds their values.
        writer = self.experiment._get_file_writer()
        for summary in hparams(self._hparams, add_prefix(metrics, self.prefix)):
            writer.add_summary(summary)

    @rank_zero_only
    def save(self) -> None:
        """Flush the events; the first save after hyperparameters were logged also writes hparams.yaml
        beside them, as Lightning's TensorBoardLogger (an existing one, an earlier start's, is kept)."""
        if self._writer is not None:
            self._writer.flush()
        # once the run has a directory, hparams.yaml is there ({} without hyperparameters, as Lightning's)
        has_dir = self._version is not None and os.path.isdir(self.log_dir)  # (log_dir claims a version)
        if (self._params is not None or has_dir) and not os.path.lexists(
            os.path.join(self.log_dir, self.NAME_HPARAMS_FILE)
        ):
            write_hparams_yaml(self.log_dir, self._params or {})

    def __getstate__(self) -> dict[str, Any]:
        """Pickled without the open event file (a copy opens its own when it logs)."""
        return {**vars(self), "_writer": None}

    def finalize(self, status: str) -> None:
        """Close the event file; a successful run also saves (hparams.yaml), as Lightning's."""
        if status == "success":
            self.save()
        if self._writer is not None:
            self._writer.flush()
            self._writer.close()
            self._writer = None

    @rank_zero_only
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
