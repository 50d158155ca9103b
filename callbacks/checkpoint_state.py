"""ModelCheckpoint's saved state, and which files it may delete: only its own run's, never what a restored
state (a checkpoint from elsewhere, perhaps crafted) merely names.

Each ModelCheckpoint carries a random run token, stored in its state inside every checkpoint it writes and
adopted when a run resumes into the same dirpath (the same run going on). A file is this run's when this
process wrote it, or when the token stored in that file is this run's token. A restored state keeps a
path only when it lies directly inside the callback's dirpath (resolved: no ``..``, no symlinked parent
leading elsewhere), has a checkpoint's name (``*.ckpt``; ``last*.ckpt`` only as the last checkpoint) and,
where the file exists, carries the token; the rest is dropped with a warning. The deletion itself checks
again, because a path can be taken by another run's file after the state was loaded.

A state from another directory (fine-tuning from another run's checkpoint) brings no path at all: its best
is carried only when it lies in one of this experiment's ``version_N/checkpoints`` and stores the token of
the state being restored (the same run, started again into a new version). So no restored path is ever
uploaded by a tracker's ``log_model`` or loaded by ``ckpt_path="best"`` (`trusted`).
"""

from __future__ import annotations

import os
import re
import uuid
import warnings
from typing import TYPE_CHECKING, Any

from tandem_core.errors import ConfigError

if TYPE_CHECKING:
    from callbacks.checkpoint import ModelCheckpoint

_LAST = re.compile(r"last(-v\d+)?\.ckpt")


def new_token() -> str:
    return uuid.uuid4().hex


def state_dict(cb: ModelCheckpoint) -> dict[str, Any]:
    return {
        "monitor": cb.monitor,
        "mode": cb.mode,
        "dirpath": cb.dirpath,
        "best_model_score": cb._best_score,
        "best_model_path": cb.best_model_path,
        "current_score": cb.current_score,
        "best_k_models": dict(cb.best_k_models),
        "kth_best_model_path": cb.kth_best_model_path,
        "kth_value": cb.kth_value,
        "last_model_path": cb.last_model_path,
        "run_token": cb._token,
    }


def load_state_dict(cb: ModelCheckpoint, state: dict[str, Any]) -> None:
    """Restore the top k when resuming into the same directory (only this run's files, see the module
    docstring); otherwise remember the best only when it is this run's (an earlier version directory of
    the experiment, written by the run being resumed), a reference that is never deleted (a deletion needs
    the file to be inside dirpath and this run's); any other best is dropped with a warning."""
    score = state.get("best_model_score")
    cb._best_score = None if score is None else float(score)
    cb.best_model_path = str(state.get("best_model_path") or "")
    if cb.dirpath is None or state.get("dirpath") != cb.dirpath:
        # another directory (fine-tuning from another run's checkpoint): its best file is no file of this
        # run, so neither kept nor carried (a tracker would upload it, ckpt_path="best" would load it)
        resumed = state.get("run_token")
        if cb.best_model_path and not (
            confined(cb, cb.best_model_path) or _earlier_version(cb, cb.best_model_path, resumed)
        ):
            warnings.warn(
                f"ModelCheckpoint(dirpath={cb.dirpath!r}): the restored state's best checkpoint "
                f"{cb.best_model_path!r} is not this run's file in that directory; it is dropped (its score "
                "too): this run's best is the best it saves itself.",
                UserWarning,
                stacklevel=4,
            )
            cb.best_model_path, cb._best_score = "", None
        elif cb.best_model_path and cb._best_score is not None:
            cb._carried = (cb.best_model_path, cb._best_score)
        return
    token = state.get("run_token")
    if isinstance(token, str) and token:
        cb._token = token  # the same run going on: its earlier files are its own
    dropped: list[str] = []

    def keep(path: Any, last: bool = False) -> bool:
        ok = (
            isinstance(path, str)
            and _own_name(cb, path, last)
            and (not os.path.lexists(path) or owned(cb, path))
        )
        if not ok and path:
            dropped.append(repr(path))
        return ok

    cb.best_k_models = {k: float(v) for k, v in (state.get("best_k_models") or {}).items() if keep(k)}
    kth = state.get("kth_best_model_path") or ""
    if kth in cb.best_k_models or not cb.best_k_models:
        cb.kth_best_model_path = kth if kth in cb.best_k_models else ""
        cb.kth_value = state.get("kth_value") if cb.kth_best_model_path else None
    else:  # the saved k-th was dropped: the worst one kept takes its place
        cb.kth_best_model_path = cb._monitor.worst_of(cb.best_k_models)
        cb.kth_value = cb.best_k_models[cb.kth_best_model_path]
    cb.current_score = state.get("current_score")
    last = state.get("last_model_path") or ""
    cb.last_model_path = last if keep(last, last=True) else ""
    if cb.best_model_path and cb.best_model_path not in cb.best_k_models and not keep(cb.best_model_path):
        cb.best_model_path, cb._best_score = "", None
    if kth and kth not in cb.best_k_models and repr(kth) not in dropped:
        dropped.append(repr(kth))
    if dropped:
        warnings.warn(
            f"ModelCheckpoint(dirpath={cb.dirpath!r}): the restored state names files that are not this "
            f"run's checkpoints in that directory ({', '.join(sorted(set(dropped)))}); they are dropped "
            "from its state and will not be deleted.",
            UserWarning,
            stacklevel=4,
        )


def confined(cb: ModelCheckpoint, path: str, last: bool = False) -> bool:
    """The rule for every path a restored state names: directly in cb.dirpath, named as cb names files,
    and, where a file is there, this run's (written by this process, or carrying this run's token)."""
    return (
        isinstance(path, str)
        and _own_name(cb, path, last or bool(_LAST.fullmatch(os.path.basename(path))))
        and (not os.path.lexists(path) or owned(cb, path))
    )


def trusted(cb: ModelCheckpoint, path: str) -> bool:
    """A path this run may upload or load as its best: `confined`, or the best carried from an earlier
    version directory of this experiment (checked by `_earlier_version` when the state was restored)."""
    return confined(cb, path) or (cb._carried is not None and path == cb._carried[0])


def _earlier_version(cb: ModelCheckpoint, path: str, token: Any) -> bool:
    """`path` is a checkpoint in one of this experiment's version_N/checkpoints directories (the default
    dirpath: each start of the same experiment writes a new version) that the resumed run wrote: the file
    stores the token of the state being restored. The same run going on, in an earlier directory."""
    from callbacks.checkpoint_names import version_checkpoint_dirs

    if not isinstance(token, str) or not token or not path.endswith(cb.FILE_EXTENSION):
        return False
    parent = os.path.realpath(os.path.dirname(os.path.abspath(path)))
    own = {os.path.realpath(d) for root in cb._experiment_roots for d in version_checkpoint_dirs(root)}
    return parent in own and os.path.isfile(path) and token in stored_tokens(path)


def _own_name(cb: ModelCheckpoint, path: str, last: bool) -> bool:
    """`path` lies directly in cb.dirpath (also after resolving links) and is named as cb names files."""
    if not path or not cb.dirpath:
        return False
    parent = os.path.dirname(os.path.abspath(path))
    if parent != cb.dirpath or os.path.realpath(parent) != os.path.realpath(cb.dirpath):
        return False
    name = os.path.basename(path)
    return (
        bool(_LAST.fullmatch(name))
        if last
        else name.endswith(cb.FILE_EXTENSION) and not _LAST.fullmatch(name)
    )


def owned(cb: ModelCheckpoint, path: str) -> bool:
    """True when this process wrote `path`, or the checkpoint there stores this run's token."""
    return path in cb._written or cb._token in stored_tokens(path)


def stored_tokens(path: str) -> set[str]:
    """The run tokens stored in the checkpoint at `path` (file or directory) by ModelCheckpoint and
    OnExceptionCheckpoint (one per callback that has one); empty when none can be read."""
    from strategies.checkpoint.directory import META
    from strategies.checkpoint.files import read

    path = os.path.realpath(path)  # a link (save_last="link") is this run's when its target is
    head = os.path.join(path, META) if os.path.isdir(path) else path
    try:
        ckpt = read(head, "cpu", True, True)  # plain data, sizes checked, memory-mapped
    except Exception:
        return set()
    states = ckpt.get("callbacks") if isinstance(ckpt, dict) else None
    return {
        state["run_token"]
        for state in ((states or {}).values() if isinstance(states, dict) else ())
        if isinstance(state, dict) and isinstance(state.get("run_token"), str) and state["run_token"]
    }


class BestKYaml:
    """ModelCheckpoint.to_yaml (Lightning's): the top-k checkpoints and their scores as a YAML mapping."""

    best_k_models: dict[str, Any]
    dirpath: str | None

    def to_yaml(self, filepath: str | os.PathLike[str] | None = None) -> None:
        """Write ``{path: score}`` of the best k checkpoints to `filepath` (default: dirpath/best_k_models.yaml)."""
        import yaml  # PyYAML comes with omegaconf

        from tandem_core.fileio import atomic_write

        best_k = {path: float(score) for path, score in self.best_k_models.items()}
        if filepath is None:
            if self.dirpath is None:
                raise ConfigError(
                    "to_yaml() needs a filepath until the checkpoint directory is known (after setup)"
                )
            filepath = os.path.join(self.dirpath, "best_k_models.yaml")
        atomic_write(os.fspath(filepath), yaml.safe_dump(best_k))
