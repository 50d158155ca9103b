"""MLflow: Lightning's MLFlowLogger on the `mlflow` client (``pip install 'tandem-trainer[mlflow]'``)."""

from __future__ import annotations

import os
import re
import tempfile
import time
import warnings
from typing import Any
from urllib.parse import urlparse

from tandem_core.errors import ConfigError, require
from trainer.loggers.base import Logger, add_prefix, as_params, flatten
from trainer.loggers.dummy import DummyExperiment
from trainer.loggers.trackers import ModelUploads, is_rank_zero

_STATUS = {"success": "FINISHED", "finished": "FINISHED", "failed": "FAILED"}
_BAD_KEY_CHARS = re.compile(r"[^a-zA-Z0-9_/. -]+")


class MLFlowLogger(Logger):
    """Logs to an MLflow run through ``MlflowClient``: metrics with their step, hyperparameters as params,
    checkpoints as artifacts with `log_model` (True: at the end; "all": after every save).

    The arguments are Lightning's: `tracking_uri` (default ``$MLFLOW_TRACKING_URI``, else ``file:<save_dir>``;
    a server ``http://host:5000`` or a database ``sqlite:///mlflow.db`` work the same), `experiment_name`,
    `run_name`, `tags`, `artifact_location`, `run_id` (continue that run: a resume), `prefix`,
    `synchronous`. Only global rank 0 creates the run; elsewhere `experiment` does nothing. Example::

        Trainer(logger=MLFlowLogger("digits", tracking_uri="sqlite:///mlflow.db", log_model=True))
    """

    LOGGER_JOIN_CHAR = "-"
    numbered_versions = False

    def __init__(
        self,
        experiment_name: str = "lightning_logs",
        run_name: str | None = None,
        tracking_uri: str | None = None,
        tags: dict[str, Any] | None = None,
        save_dir: str | None = "./mlruns",
        log_model: bool | str = False,
        prefix: str = "",
        artifact_location: str | None = None,
        run_id: str | None = None,
        synchronous: bool | None = None,
    ) -> None:
        require("mlflow", "MLFlowLogger", "mlflow")
        self._tracking_uri = tracking_uri or os.environ.get("MLFLOW_TRACKING_URI") or f"file:{save_dir}"
        self._experiment_name = experiment_name
        self._experiment_id: str | None = None
        self._run_name = run_name
        self._run_id = run_id
        self.tags = tags
        self._prefix = prefix
        self._artifact_location = artifact_location
        self._batch_kwargs = {} if synchronous is None else {"synchronous": synchronous}
        self._uploads = ModelUploads(log_model)
        self._client: Any = None
        self._version: str | None = run_id
        self._shared = None

    # ----- where and what ------------------------------------------------------------------------
    @property
    def save_dir(self) -> str | None:  # type: ignore[override]
        """The local directory of a ``file:`` tracking store, else None."""
        if self._tracking_uri.startswith("file:"):
            return urlparse(self._tracking_uri).path or None
        return None

    @property
    def name(self) -> str | None:  # type: ignore[override]
        """The experiment id (as Lightning's); on rank 0 the run is started when first asked."""
        if self._experiment_id is None and is_rank_zero():
            self.experiment  # noqa: B018
        return self._experiment_id

    @property
    def version(self) -> str | None:  # type: ignore[override]
        """The run id; on rank 0 the run is started when first asked (every rank gets rank 0's)."""
        if self._run_id is None and is_rank_zero():
            self.experiment  # noqa: B018
        return self._run_id or self._version

    @property
    def run_id(self) -> str | None:
        """The MLflow run's id (the logger's version), or None before the run exists."""
        return self.version

    @property
    def experiment_id(self) -> str | None:
        """The MLflow experiment's id (the logger's name)."""
        return self.name

    @property
    def root_dir(self) -> str:
        save_dir = self.save_dir
        return os.path.join(save_dir, self.name or self._experiment_name) if save_dir else ""

    @property
    def log_dir(self) -> str | None:  # type: ignore[override]
        """``<save_dir>/<experiment id>/<run id>`` of a file store (ModelCheckpoint's files go to its
        ``checkpoints``, as Lightning's), else None: checkpoints then go to default_root_dir."""
        root = self.root_dir
        return os.path.join(root, str(self.version)) if root else None

    # ----- the run -------------------------------------------------------------------------------
    @property
    def experiment(self) -> Any:
        """The ``MlflowClient`` (``self.logger.experiment.log_text(self.logger.run_id, ...)``); a
        do-nothing object on other ranks."""
        if not is_rank_zero():
            return DummyExperiment()
        if self._client is not None:
            return self._client
        client = _client(self._tracking_uri)
        if self._run_id is not None:  # continue this run
            run = client.get_run(self._run_id)
            self._experiment_id = run.info.experiment_id
            if run.info.status != "RUNNING":
                client.update_run(self._run_id, status="RUNNING")
        else:
            found = client.get_experiment_by_name(self._experiment_name)
            if found is not None and found.lifecycle_stage != "deleted":
                self._experiment_id = found.experiment_id
            else:
                self._experiment_id = client.create_experiment(
                    name=self._experiment_name, artifact_location=self._artifact_location
                )
            tags = dict(self.tags or {})
            if self._run_name is not None:
                tags["mlflow.runName"] = self._run_name
            from mlflow.tracking.context.registry import resolve_tags  # source, user and git tags

            run = client.create_run(experiment_id=self._experiment_id, tags=resolve_tags(tags))
            self._run_id = run.info.run_id
        self._version = self._run_id
        self._client = client
        return client

    def log_hyperparams(self, params: dict[str, Any], metrics: dict[str, float] | None = None) -> None:
        if not is_rank_zero():
            return
        from mlflow.entities import Param
        from mlflow.utils.validation import MAX_PARAM_VAL_LENGTH

        client = self.experiment
        wanted = {k: str(v)[:MAX_PARAM_VAL_LENGTH] for k, v in flatten(as_params(params)).items()}
        logged = client.get_run(self.run_id).data.params  # a resumed run has them already
        changed = {k: (logged[k], v) for k, v in wanted.items() if k in logged and logged[k] != v}
        if changed:
            shown = ", ".join(f"{k}: {old!r} (now {new!r})" for k, (old, new) in changed.items())
            warnings.warn(
                f"MLflow keeps a run's params fixed; run {self.run_id} keeps {shown}. Start a new run "
                "(no run_id) to record other values.",
                UserWarning,
                stacklevel=2,
            )
        flat = [Param(k, v) for k, v in wanted.items() if k not in logged]
        for i in range(0, len(flat), 100):  # MLflow takes at most 100 params per batch
            client.log_batch(run_id=self.run_id, params=flat[i : i + 100], **self._batch_kwargs)

    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        if not is_rank_zero():
            return
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        batch = []
        for key, value in add_prefix(metrics, self._prefix, self.LOGGER_JOIN_CHAR).items():
            clean = _BAD_KEY_CHARS.sub("", key)
            if clean != key:
                warnings.warn(
                    f"MLflow allows only letters, digits, '_', '/', '.', '-' and ' ' in metric names: "
                    f"{key!r} is logged as {clean!r}",
                    RuntimeWarning,
                    stacklevel=2,
                )
            batch.append(Metric(key=clean, value=float(value), timestamp=now, step=step or 0))
        client = self.experiment
        for i in range(0, len(batch), 1000):  # MLflow takes at most 1000 metrics per batch
            client.log_batch(run_id=self.run_id, metrics=batch[i : i + 1000], **self._batch_kwargs)

    # ----- checkpoints and the end ---------------------------------------------------------------
    def after_save_checkpoint(self, checkpoint_callback: Any) -> None:
        self._uploads.after_save(checkpoint_callback, self._upload)

    def finalize(self, status: str = "success") -> None:
        """Upload the checkpoints log_model=True held back, and end the run as FINISHED or FAILED."""
        if self._client is None or not is_rank_zero():
            return
        self._uploads.at_end(self._upload)
        self._client.set_terminated(self.run_id, _STATUS.get(status, status.upper()))

    def _upload(self, path: str, aliases: list[str], metadata: dict[str, Any]) -> None:
        """``<file stem>/<file>`` with ``metadata.yaml`` and ``aliases.txt`` beside it (Lightning's layout)."""
        import yaml

        client, folder = self.experiment, os.path.splitext(os.path.basename(path))[0]
        if os.path.isdir(path):  # a sharded checkpoint
            client.log_artifacts(self.run_id, path, f"{folder}/{os.path.basename(path)}")
        else:
            client.log_artifact(self.run_id, path, folder)
        with tempfile.TemporaryDirectory() as tmp:
            with open(os.path.join(tmp, "metadata.yaml"), "w") as f:
                yaml.safe_dump(metadata, f, default_flow_style=False)
            with open(os.path.join(tmp, "aliases.txt"), "w") as f:
                f.write(str(aliases))
            client.log_artifacts(self.run_id, tmp, folder)


def _client(uri: str) -> Any:
    """An MlflowClient on `uri`; a file store this mlflow refuses is a ConfigError saying what to change."""
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    try:
        return MlflowClient(uri)
    except MlflowException as e:
        if uri.startswith("file:") and "MLFLOW_ALLOW_FILE_STORE" in str(e):
            raise ConfigError(
                f"MLFlowLogger: this mlflow refuses the file store {uri!r} (its default, file:<save_dir>). "
                "Pass tracking_uri='sqlite:///mlflow.db' (or a server's http:// address), or set "
                "MLFLOW_ALLOW_FILE_STORE=true to keep the file store."
            ) from e
        raise
