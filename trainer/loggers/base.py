"""The Logger interface and run-directory versioning shared by every logger."""

from __future__ import annotations

import argparse
import os
import re
from typing import Any

from tandem_core.fileio import atomic_write, refuse_url

_VERSION = re.compile(r"version_(\d+)")


def next_version(root: str) -> int:
    """The first N above every root/version_N there now (0 when root does not exist); not a claim."""
    try:
        with os.scandir(root) as entries:
            used = [int(m.group(1)) for e in entries if (m := _VERSION.fullmatch(e.name))]
    except (FileNotFoundError, NotADirectoryError):
        return 0
    return max(used, default=-1) + 1


def claim_version(root: str) -> int:
    """Create root/version_N for the first free N and return N.

    os.mkdir fails when the directory exists, so of two runs that start together under one root each
    gets its own N (the loser of a race retries with N+1) instead of both writing into version_0.
    """
    os.makedirs(root, exist_ok=True)
    n = next_version(root)
    while True:
        try:
            os.mkdir(os.path.join(root, f"version_{n}"))
            return n
        except FileExistsError:
            n += 1


class SharedVersion:
    """One version claimed once for several loggers that write into the same save_dir/name."""

    def __init__(self) -> None:
        self.version: int | None = None

    def get(self, root: str) -> int:
        if self.version is None:
            self.version = claim_version(root)
        return self.version


def align_versions(loggers: list[Logger]) -> list[Logger]:
    """Make loggers that share save_dir/name (and have no fixed version) share one claimed version_N.

    Each logger claims its version when first used, so without this ``[TensorBoardLogger("runs"),
    CSVLogger("runs")]`` would write into version_0 and version_1.
    """
    groups: dict[str, list[Logger]] = {}
    for lg in loggers:
        if (
            getattr(lg, "_version", 0) is None
            and getattr(lg, "numbered_versions", False)
            and getattr(lg, "root_dir", None)
        ):
            groups.setdefault(os.path.abspath(lg.root_dir), []).append(lg)
    for group in groups.values():
        if len(group) > 1:
            shared = SharedVersion()
            for lg in group:
                lg._shared = shared
    return loggers


def agree_versions(loggers: list[Logger], comm: Any) -> None:
    """Under several processes: rank 0 claims every logger's version and the other ranks take rank 0's.

    Called when a stage is set up (the process group exists by then); loggers may be built before it.
    """
    if comm.world_size <= 1 and comm.is_global_zero:
        return
    versions = [_version_or_none(lg) for lg in loggers] if comm.is_global_zero else None
    versions = comm.broadcast(versions, 0)
    if versions is None:  # a lone process that is not rank 0 (tests pose as one): claim nothing
        versions = [_own_version(lg) for lg in loggers]
    for lg, v in zip(loggers, versions):
        if v is not None:
            lg._version = v


def _own_version(lg: Logger) -> Any:
    """A non-zero rank's guess without rank 0: the given version, else the next free one (None: no directory)."""
    given = getattr(lg, "_version", None)
    root = getattr(lg, "root_dir", None)
    return given if given is not None or root is None else next_version(root)


def _version_or_none(lg: Logger) -> Any:
    """The logger's version, or None for a logger that has none (no save_dir, no version of its own)."""
    try:
        return lg.version
    except TypeError:
        return None


class Logger:
    """Receives metrics as floats at a step. Only rank 0's Trainer calls a logger.

    Example: ``Trainer(logger=[TensorBoardLogger("runs"), CSVLogger("runs")])`` writes both
    ``runs/lightning_logs/version_0/events.out.tfevents.*`` and ``runs/lightning_logs/version_0/metrics.csv``.
    """

    #: whether versions are numbered version_N directories (False: a tracker's run id, e.g. W&B, MLflow)
    numbered_versions = True

    def __init__(
        self, save_dir: str = ".", name: str | None = "lightning_logs", version: int | str | None = None
    ) -> None:
        # kept under private names: a subclass may define save_dir or name as read-only properties (Lightning's
        # Logger declares them abstract), and this __init__ must not assign through them
        refuse_url(save_dir, f"{type(self).__name__}'s save_dir")
        self._save_dir = os.fspath(save_dir) if save_dir is not None else None
        self._name = name or ""
        self._version = version
        self._shared: SharedVersion | None = None  # set by align_versions

    @property
    def save_dir(self) -> str | None:
        """The directory under which the experiment's directories are made (None: the logger writes nothing
        locally)."""
        return self._save_dir

    @save_dir.setter
    def save_dir(self, value: str | None) -> None:
        self._save_dir = value

    @property
    def name(self) -> str:
        """The experiment's name (its directory under save_dir)."""
        return self._name

    @name.setter
    def name(self, value: str) -> None:
        self._name = value

    @property
    def root_dir(self) -> str | None:
        """save_dir/name: the directory that holds every version of this experiment (None without save_dir)."""
        if self.save_dir is None:
            return None
        return os.path.join(self.save_dir, str(self.name or ""))

    @property
    def version(self) -> int | str:
        """The run's version: unless given, claimed (version_N created) at the first access on rank 0."""
        if self._version is None:
            root = self.root_dir
            if root is None:
                raise TypeError(
                    f"{type(self).__name__} has neither a save_dir nor a version; define `version`."
                )
            self._version = self._shared.get(root) if self._shared is not None else claim_version(root)
        return self._version

    @property
    def log_dir(self) -> str | None:
        """The directory this logger writes into (None without save_dir)."""
        if self.root_dir is None:
            return None
        version = self.version if isinstance(self.version, str) else f"version_{self.version}"
        return os.path.join(self.root_dir, version)

    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        """Write scalar metrics at a step."""
        raise NotImplementedError

    def log_hyperparams(
        self, params: dict[str, Any] | None = None, metrics: dict[str, float] | None = None
    ) -> None:
        """Record the run's hyperparameters (with metrics when given); the Trainer calls it when a stage starts."""

    def after_save_checkpoint(self, checkpoint_callback: Any) -> None:
        """Called on rank 0 after a ModelCheckpoint wrote a file (trackers upload it with log_model)."""

    def resumed_at(self, step: int) -> None:
        """fit restored a checkpoint: the run goes on from logged step `step`; what an earlier run logged at
        `step` or later (after that checkpoint, before it stopped) is superseded by what comes now."""

    def save(self) -> None:
        """Flush what was written."""

    def finalize(self, status: str) -> None:
        """Called once at the end of a run with 'success' or 'failed'."""
        self.save()


def as_params(params: Any) -> dict[str, Any]:
    """log_hyperparams' `params` as a dict: a mapping, an argparse Namespace (its attributes) or None (Lightning's
    loggers take all three)."""
    if params is None:
        return {}
    return dict(vars(params)) if isinstance(params, argparse.Namespace) else dict(params)


def add_prefix(metrics: dict[str, Any], prefix: str, sep: str = "-") -> dict[str, Any]:
    """Lightning's logger `prefix`: every key becomes ``f"{prefix}{sep}{key}"`` (unchanged when prefix is "";
    Lightning joins with "-" in every logger)."""
    return {f"{prefix}{sep}{k}": v for k, v in metrics.items()} if prefix else metrics


def flatten(params: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """{'a': {'b': 1}} -> {'a/b': 1}; values that are not scalars become strings."""
    out: dict[str, Any] = {}
    for k, v in params.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(flatten(v, key + "/"))
        elif isinstance(v, (int, float, str, bool)) or v is None:
            out[key] = v if v is not None else "None"
        else:
            out[key] = str(v)
    return out


def yaml_safe(value: Any) -> Any:
    """`value` with only YAML-safe types (dicts, lists, numbers, strings); anything else becomes its str()."""
    if isinstance(value, dict):
        return {str(k): yaml_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [yaml_safe(v) for v in value]
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return str(value)


def write_hparams_yaml(log_dir: str, params: dict[str, Any]) -> None:
    """`log_dir`/hparams.yaml with `params` as plain YAML (atomically: a link planted there is replaced, not
    followed)."""
    import yaml  # PyYAML comes with omegaconf

    os.makedirs(log_dir, exist_ok=True)
    atomic_write(os.path.join(log_dir, "hparams.yaml"), yaml.safe_dump(yaml_safe(params), sort_keys=False))
