"""Weights & Biases: Lightning's WandbLogger on the `wandb` client (``pip install 'tandem-trainer[wandb]'``)."""

from __future__ import annotations

import os
import warnings
from typing import Any

from tandem_core.errors import ConfigError, require
from trainer.loggers.base import Logger, add_prefix, as_params, yaml_safe
from trainer.loggers.dummy import DummyExperiment
from trainer.loggers.trackers import ModelUploads, is_rank_zero

STEP_KEY = "trainer/global_step"  # the x axis of every metric (Lightning's)


class WandbLogger(Logger):
    """Logs to a W&B run: metrics against ``trainer/global_step``, hyperparameters into the run's config,
    checkpoints as ``model`` artifacts with `log_model` (True: at the end; "all": after every save).

    The arguments are Lightning's: `name` is the run's display name, `project` the W&B project (default
    ``$WANDB_PROJECT`` or ``lightning_logs``), `version`/`id` a run id to continue (W&B's resume="allow"),
    `save_dir`/`dir` where the local ``wandb/`` run directory goes, `offline` writes only that directory
    (``wandb sync`` uploads it later), other keywords go to ``wandb.init`` (entity, group, tags, mode, ...).
    Only global rank 0 creates the run; elsewhere `experiment` does nothing. Example::

        Trainer(logger=WandbLogger(project="digits", log_model=True))
    """

    LOGGER_JOIN_CHAR = "-"
    numbered_versions = False

    def __init__(
        self,
        name: str | None = None,
        save_dir: str | os.PathLike[str] | None = ".",
        version: str | None = None,
        offline: bool = False,
        dir: str | os.PathLike[str] | None = None,
        id: str | None = None,
        anonymous: bool | None = None,
        project: str | None = None,
        log_model: bool | str = False,
        experiment: Any = None,
        prefix: str = "",
        checkpoint_name: str | None = None,
        add_file_policy: str = "mutable",
        **kwargs: Any,
    ) -> None:
        require("wandb", "WandbLogger", "wandb")
        if offline and log_model:
            raise ConfigError(
                f"WandbLogger(log_model={log_model!r}, offline=True): checkpoints cannot be uploaded in offline "
                "mode (as in Lightning). Set offline=False to log your model, or log_model=False."
            )
        if add_file_policy not in ("mutable", "immutable"):
            raise ConfigError(f"add_file_policy must be 'mutable' or 'immutable'; got {add_file_policy!r}")
        local = save_dir if save_dir is not None else dir
        self._init: dict[str, Any] = {
            "name": name,
            "project": project or os.environ.get("WANDB_PROJECT", "lightning_logs"),
            "dir": os.fspath(local) if local is not None else None,
            "id": version or id,
            "resume": "allow",
            "anonymous": "allow"
            if anonymous
            else None,  # (wandb's default; False is None too, as Lightning's)
            **({"mode": "offline"} if offline else {}),
            **kwargs,
        }
        self._offline = offline
        self._experiment = experiment
        self._prefix = prefix
        self._checkpoint_name = checkpoint_name
        self.add_file_policy = add_file_policy
        self._uploads = ModelUploads(log_model)
        self._version: str | None = self._init["id"]
        self._shared = None

    # ----- where and what ------------------------------------------------------------------------
    @property
    def save_dir(self) -> str | None:  # type: ignore[override]
        """The directory that holds the local ``wandb/`` folder."""
        return self._init["dir"]

    @property
    def name(self) -> str:  # type: ignore[override]
        """The project (as Lightning's; the run's display name is ``experiment.name``)."""
        return self._init["project"]

    @property
    def version(self) -> str | None:  # type: ignore[override]
        """The run id; on rank 0 the run is started when first asked (every rank gets rank 0's)."""
        if self._experiment is not None and not isinstance(self._experiment, DummyExperiment):
            return self._experiment.id
        if self._version is None and is_rank_zero():
            return self.experiment.id
        return self._version

    @property
    def root_dir(self) -> str:
        return os.path.join(self.save_dir or ".", self.name)

    @property
    def log_dir(self) -> str:
        """``<save_dir>/<project>/<run id>``: ModelCheckpoint's files go to its ``checkpoints`` (as Lightning's)."""
        return os.path.join(self.root_dir, str(self.version))

    # ----- the run -------------------------------------------------------------------------------
    @property
    def experiment(self) -> Any:
        """The ``wandb`` Run (``self.logger.experiment.log(...)``); a do-nothing object on other ranks."""
        if self._experiment is not None:
            return self._experiment
        if not is_rank_zero():
            return DummyExperiment()
        import wandb

        if wandb.run is not None:
            warnings.warn(
                "There is a wandb run already in progress; this WandbLogger reuses it. Call wandb.finish() "
                "before creating the logger to start a new run.",
                UserWarning,
                stacklevel=2,
            )
            self._experiment = wandb.run
        else:
            if self._init["dir"] is not None:
                os.makedirs(self._init["dir"], exist_ok=True)
            self._experiment = wandb.init(**self._init)
        self._version = self._experiment.id
        if getattr(self._experiment, "define_metric", None) is None:
            pass  # a run object without it (an older client, a stand-in): metrics keep W&B's own step
        elif not self._init.get("sync_tensorboard"):
            self._experiment.define_metric(STEP_KEY)
            self._experiment.define_metric("*", step_metric=STEP_KEY, step_sync=True)
        else:
            self._experiment.define_metric("*", step_metric="global_step")
        return self._experiment

    def __getstate__(self) -> dict[str, Any]:
        """A pickled copy (a spawned worker, a pickled Trainer) holds the run's id, not the run: it continues
        the same run (resume="allow") when its `experiment` is first read."""
        state = self.__dict__.copy()
        live = state.get("_experiment")
        if live is not None and not isinstance(live, DummyExperiment):
            state["_init"] = {**self._init, "id": getattr(live, "id", None) or self._init["id"]}
        state["_experiment"] = None
        return state

    def watch(
        self, model: Any, log: str | None = "gradients", log_freq: int = 100, log_graph: bool = True
    ) -> None:
        """Gradients (and parameters with log="all") every `log_freq` steps: ``wandb.watch``."""
        self.experiment.watch(model, log=log, log_freq=log_freq, log_graph=log_graph)

    def log_hyperparams(self, params: dict[str, Any], metrics: dict[str, float] | None = None) -> None:
        if is_rank_zero():
            self.experiment.config.update(yaml_safe(as_params(params)), allow_val_change=True)

    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        if not is_rank_zero():
            return
        metrics = add_prefix(metrics, self._prefix, self.LOGGER_JOIN_CHAR)
        if step is not None and not self._init.get("sync_tensorboard"):
            self.experiment.log({**metrics, STEP_KEY: step})
        else:
            self.experiment.log(metrics)

    def log_table(
        self, key: str, columns: Any = None, data: Any = None, dataframe: Any = None, step: int | None = None
    ) -> None:
        """Log a wandb.Table built from `columns` and `data` (or a DataFrame) under `key`."""
        import wandb

        self.log_metrics({key: wandb.Table(columns=columns, data=data, dataframe=dataframe)}, step)  # type: ignore[dict-item]

    def log_text(
        self, key: str, columns: Any = None, data: Any = None, dataframe: Any = None, step: int | None = None
    ) -> None:
        """Log text rows as a wandb.Table under `key`."""
        self.log_table(key, columns, data, dataframe, step)

    def log_image(self, key: str, images: list[Any], step: int | None = None, **kwargs: Any) -> None:
        """Images (tensors, arrays, PIL images or paths); keyword lists go to each wandb.Image (caption=...)."""
        import wandb

        self.log_metrics({key: _media(wandb.Image, images, kwargs)}, step)  # type: ignore[dict-item]

    def log_audio(self, key: str, audios: list[Any], step: int | None = None, **kwargs: Any) -> None:
        """Audio clips (arrays or paths); keyword lists go to each wandb.Audio (sample_rate=..., caption=...)."""
        import wandb

        self.log_metrics({key: _media(wandb.Audio, audios, kwargs)}, step)  # type: ignore[dict-item]

    def log_video(self, key: str, videos: list[Any], step: int | None = None, **kwargs: Any) -> None:
        """Videos (arrays or paths); keyword lists go to each wandb.Video (fps=..., format=..., caption=...)."""
        import wandb

        self.log_metrics({key: _media(wandb.Video, videos, kwargs)}, step)  # type: ignore[dict-item]

    @staticmethod
    def download_artifact(
        artifact: str,
        save_dir: str | os.PathLike[str] | None = None,
        artifact_type: str | None = None,
        use_artifact: bool | None = True,
    ) -> str:
        """Download W&B artifact `artifact` into `save_dir` and return its local path; inside a run (and with
        `use_artifact`) the run records that it used it, else it is fetched through wandb's public API."""
        import wandb

        if wandb.run is not None and use_artifact:
            found = wandb.run.use_artifact(artifact)
        else:
            found = wandb.Api().artifact(artifact, type=artifact_type)
        return found.download(root=os.fspath(save_dir) if save_dir is not None else None)

    def use_artifact(self, artifact: str, artifact_type: str | None = None) -> Any:
        """Declare that this run uses W&B artifact `artifact` (and return it)."""
        return self.experiment.use_artifact(artifact, type=artifact_type)

    # ----- checkpoints ---------------------------------------------------------------------------
    def after_save_checkpoint(self, checkpoint_callback: Any) -> None:
        self._uploads.after_save(checkpoint_callback, self._upload)

    def finalize(self, status: str) -> None:
        """A successful run uploads the checkpoints log_model=True held back. The run stays open (as in
        Lightning) so that validate/test afterwards log into it; wandb closes it when the process ends."""
        if status == "success" and self._experiment is not None and is_rank_zero():
            self._uploads.at_end(self._upload)

    def _upload(self, path: str, aliases: list[str], metadata: dict[str, Any]) -> None:
        import wandb

        run = self.experiment
        if not self._checkpoint_name:
            self._checkpoint_name = f"model-{run.id}"
        artifact = wandb.Artifact(name=self._checkpoint_name, type="model", metadata=metadata)
        if os.path.isdir(path):  # a sharded checkpoint
            artifact.add_dir(path, name="model.ckpt", policy=self.add_file_policy)
        else:
            artifact.add_file(path, name="model.ckpt", policy=self.add_file_policy)
        run.log_artifact(artifact, aliases=aliases)


def _media(kind: Any, items: list[Any], kwargs: dict[str, list[Any]]) -> list[Any]:
    if not isinstance(items, list):
        raise TypeError(f"expected a list of items, found {type(items).__name__}")
    for k, v in kwargs.items():
        if len(v) != len(items):
            raise ValueError(f"expected {len(items)} items for {k!r}, found {len(v)}")
    return [kind(item, **{k: v[i] for k, v in kwargs.items()}) for i, item in enumerate(items)]
