"""Issue 34 (safe by default, round three), the checkpoint side: no path, file name or directory is taken
from a checkpoint's callback state (ModelCheckpoint keeps a restored path only when it is this run's file in
its own directory, callbacks/checkpoint_state.py; SpikeDetection never takes its list's path back), trackers
upload only this run's files, ckpt_path="best" loads none of another's, and OnExceptionCheckpoint versions
its file beside another run's and removes only its own. The last tests list every public callback's
restored keys and try an outside path in each path-like one."""

from __future__ import annotations

import os
import re
import warnings
from typing import Any

import pytest
import torch
from callback_tasks import QUIET, Scored, fit, loader

import callbacks as C
from callbacks import ModelCheckpoint, OnExceptionCheckpoint, SpikeDetection
from tandem_core.errors import CheckpointError
from trainer import Trainer
from trainer.checkpoint.find import choose
from trainer.loggers.trackers import ModelUploads

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


def _outside(tmp_path) -> str:
    """A stand-in for ~/.netrc, outside every run directory."""
    (tmp_path / "home").mkdir(exist_ok=True)
    path = tmp_path / "home" / ".netrc"
    path.write_text("machine example.org login me password hunter2")
    return str(path)


def _crafted(tmp_path, prefix: str, **state: Any) -> str:
    """Run A's real checkpoint (plain data, it passes weights_only) with its `prefix` callback's state edited."""
    run_a = tmp_path / "run_a"
    mc = ModelCheckpoint(dirpath=str(run_a), monitor="val/score", mode="max", save_last=True)
    fit(Scored([1.0] * 100), [mc, SpikeDetection()], 1)
    ckpt = torch.load(run_a / "last.ckpt", weights_only=True)
    edited = [k for k in ckpt["callbacks"] if k.startswith(prefix)]
    assert edited, list(ckpt["callbacks"])
    for key in edited:
        ckpt["callbacks"][key].update(state)
    path = tmp_path / "crafted.ckpt"
    torch.save(ckpt, path)
    torch.load(path, weights_only=True)  # what the attack needs: it loads under weights_only
    return str(path)


def _uploads(cb: ModelCheckpoint) -> list[str]:
    """What MLFlowLogger/WandbLogger(log_model=True) upload at the end: their shared ModelUploads rule."""
    sent: list[str] = []
    ModelUploads(True).upload_new(cb, lambda path, aliases, meta: sent.append(path))
    return sent


# ----- 3. ModelCheckpoint ---------------------------------------------------------------------------------
@pytest.mark.parametrize("where", ["outside", "planted", "traversal"])
def test_a_best_model_path_from_a_checkpoint_is_never_uploaded_nor_loaded(where, tmp_path):
    run_b = tmp_path / "run_b"
    run_b.mkdir()
    if where == "outside":  # the attack: a better score naming a file outside the run
        target = _outside(tmp_path)
    elif where == "planted":  # our variant: a file in B's own directory that B did not write
        target = str(run_b / "epoch=0-step=2.ckpt")
        torch.save({"state_dict": {}}, target)
    else:  # our variant: through B's directory and back out
        target = os.path.join(str(run_b), "..", "home", ".netrc")
        _outside(tmp_path)
    crafted = _crafted(tmp_path, "ModelCheckpoint", best_model_path=target, best_model_score=99.0)
    mc = ModelCheckpoint(dirpath=str(run_b), monitor="val/score", mode="max")
    with pytest.warns(UserWarning, match="not this run's file"):
        trainer = fit(Scored([0.5] * 100), [mc], 2, ckpt_path=crafted)
    own = sorted(str(p) for p in run_b.glob("*.ckpt") if str(p) != target)
    assert own and os.path.realpath(mc.best_model_path) != os.path.realpath(target)
    assert mc.best_model_path in own and float(mc.best_model_score) == 0.5
    sent = _uploads(mc)
    assert sent and all(p in own for p in sent), sent
    assert choose(trainer, "validate", "best", True) in own


def test_best_never_resolves_to_a_file_outside_the_run(tmp_path):
    mc = ModelCheckpoint(dirpath=str(tmp_path / "run"), monitor="val/score")
    trainer = fit(Scored(), [mc], 1)
    mc.best_model_path = _outside(tmp_path)  # however it got there
    with pytest.raises(CheckpointError, match="did not write"):
        choose(trainer, "validate", "best", True)
    assert _outside(tmp_path) not in _uploads(mc)


def test_an_earlier_versions_best_is_carried_only_for_the_run_that_wrote_it(tmp_path):
    """Resuming into a new version directory carries the best of an earlier one (the same run going on);
    a state whose token is not the one stored in that file (another run's state naming it) does not."""
    scores = [5.0, 1.0, 8.0]
    first = ModelCheckpoint(monitor="val/score", save_last=True)
    fit(Scored(scores), [first], 2, logger=True, default_root_dir=str(tmp_path))
    last = os.path.join(os.path.dirname(first.best_model_path), "last.ckpt")
    ckpt = torch.load(last, weights_only=True)
    for state in ckpt["callbacks"].values():
        state["run_token"] = "0" * 32  # not the token in first.best_model_path
    torch.save(ckpt, tmp_path / "other_state.ckpt")
    second = ModelCheckpoint(monitor="val/score", save_last=True)
    with pytest.warns(UserWarning, match="not this run's file"):
        fit(Scored(scores), [second], 3, logger=True, default_root_dir=str(tmp_path),
            ckpt_path=str(tmp_path / "other_state.ckpt"))  # fmt: skip
    assert second.best_model_path != first.best_model_path
    assert os.path.dirname(second.best_model_path) == second.dirpath
    third = ModelCheckpoint(monitor="val/score", save_last=True)
    fit(Scored(scores), [third], 3, logger=True, default_root_dir=str(tmp_path), ckpt_path=last)
    assert third.best_model_path == first.best_model_path and float(third.best_model_score) == 1.0


def test_the_loop_state_names_no_path(tmp_path):
    """The checkpoint's own keys and the loop's: none names a file (run_id is compared, never opened)."""
    fit(Scored(), [ModelCheckpoint(dirpath=str(tmp_path), save_last=True)], 1)
    ckpt = torch.load(tmp_path / "last.ckpt", weights_only=True)
    assert sorted(ckpt) == [
        "callbacks", "config", "epoch", "global_step", "hyper_parameters", "loop", "lr_schedulers",
        "optimizer_states", "run_id", "state_dict", "strategy", "tandem_version", "task_class",
    ]  # fmt: skip
    assert sorted(ckpt["loop"]) == [
        "batch_in_epoch",
        "callback_metrics",
        "epoch_finished",
        "ranks",
        "val_pending",
    ]
    assert sorted(ckpt["loop"]["ranks"][0]) == ["epoch_start_rng", "rng", "window_grads"]
    assert sorted(ckpt["run_id"]) == ["experiment", "task_class"]


# ----- 3. SpikeDetection ----------------------------------------------------------------------------------
class SpikeAt(Scored):
    def training_step(self, batch, batch_idx):
        loss = super().training_step(batch, batch_idx)
        return loss * float("inf") if self.trainer.global_step == 3 else loss


@pytest.mark.parametrize("kind", ["outside_file", "another_run"])
def test_a_spike_list_path_from_a_checkpoint_is_not_taken(kind, tmp_path):
    if kind == "outside_file":  # the attack: overwrite a file outside the run
        target = _outside(tmp_path)
    else:  # run A's own directory: run B fine-tuning from A's checkpoint must not write there
        target = str(tmp_path / "run_a" / "skip_batches.json")
    crafted = _crafted(tmp_path, "SpikeDetection", bad_batches_path=target)
    before = open(target).read() if os.path.exists(target) else None
    root = tmp_path / "run_b"
    with pytest.raises(C.spike.TrainingSpikeException):
        fit(SpikeAt(), [SpikeDetection()], 4, ckpt_path=crafted, default_root_dir=str(root))
    assert (open(target).read() if os.path.exists(target) else None) == before
    assert (root / "skip_batches.json").exists()


# ----- 4. OnExceptionCheckpoint ---------------------------------------------------------------------------
class CrashAt(C.Callback):
    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_end(self, trainer, task, outputs, batch, batch_idx):
        if trainer.global_step == self.step:
            raise RuntimeError("crash")


def _crash(dirpath, step: int, ckpt_path: str | None = None) -> OnExceptionCheckpoint:
    cb = OnExceptionCheckpoint(str(dirpath))
    with pytest.raises(RuntimeError, match="crash"):
        Trainer(max_epochs=5, callbacks=[cb, CrashAt(step)], **QUIET).fit(
            Scored(), loader(), ckpt_path=ckpt_path
        )
    return cb


def test_a_crash_never_replaces_another_runs_crash_file(tmp_path):
    a = _crash(tmp_path, 2)
    first = (tmp_path / "on_exception.ckpt").read_bytes()
    with pytest.warns(UserWarning, match="another run's crash checkpoint"):
        b = _crash(tmp_path, 3)  # run B of the same sweep
    assert (tmp_path / "on_exception.ckpt").read_bytes() == first  # A's, untouched
    assert b.saved_path == str(tmp_path / "on_exception-v1.ckpt") and a.saved_path == str(
        tmp_path / "on_exception.ckpt"
    )
    assert torch.load(b.saved_path, weights_only=True)["global_step"] == 3
    c = _crash(tmp_path, 4)  # a third run goes to -v2
    assert c.saved_path == str(tmp_path / "on_exception-v2.ckpt")


def test_a_resumed_run_removes_only_its_own_crash_file(tmp_path):
    _crash(tmp_path, 2)
    path = tmp_path / "on_exception.ckpt"
    # the run resumes from its crash file and crashes again: it replaces its own file (no -v1)
    again = _crash(tmp_path, 4, ckpt_path=str(path))
    assert again.saved_path == str(path) and not (tmp_path / "on_exception-v1.ckpt").exists()
    assert torch.load(path, weights_only=True)["global_step"] == 4

    class Replace(C.Callback):  # meanwhile another run's crash file takes that name
        def on_train_end(self, trainer, task):
            other = OnExceptionCheckpoint(str(tmp_path))
            ckpt = torch.load(path, weights_only=True)
            ckpt["callbacks"] = {k: {"run_token": other._token} for k in ckpt["callbacks"]}
            torch.save(ckpt, path)

    trainer = Trainer(max_epochs=5, callbacks=[OnExceptionCheckpoint(str(tmp_path)), Replace()], **QUIET)
    trainer.fit(Scored(), loader(), ckpt_path=str(path))
    assert path.exists()  # not its own any more: kept
    # the ordinary case still removes it (Lightning's behaviour)
    trainer = Trainer(max_epochs=6, callbacks=[OnExceptionCheckpoint(str(tmp_path))], **QUIET)
    trainer.fit(Scored(), loader(), ckpt_path=str(path))
    assert not path.exists()


# ----- every callback's restored keys --------------------------------------------------------------------
ARGS: dict[str, dict[str, Any]] = {
    "EarlyStopping": {"monitor": "val/score"},
    "GradientAccumulationScheduler": {"scheduling": {0: 1}},
    "ModelPruning": {"pruning_fn": "l1_unstructured"},
    "OnExceptionCheckpoint": {"dirpath": "."},
    "StochasticWeightAveraging": {"swa_lrs": 0.1},
    "ThroughputMonitor": {"batch_size_fn": len},
}
# Every public callback's checkpoint state keys. A new key fails here: if it names a path, a file or a
# directory, it must follow the rule (callbacks/checkpoint_state.py: confined to this run's directory and
# owned by it, or not taken back at all) and test_no_callback_takes_an_outside_path_back must pass for it.
KEYS: dict[str, list[str]] = {
    "BackboneFinetuning": ["done_epoch", "internal_optimizer_metadata", "previous_backbone_lr"],
    "BaseFinetuning": ["done_epoch", "internal_optimizer_metadata"],
    "EMAWeightAveraging": ["latest_update_epoch", "latest_update_step"],
    "EarlyStopping": ["best_score", "patience", "stopped_epoch", "stopping_reason", "stopping_reason_message", "wait_count"],
    "ModelCheckpoint": [
        "best_k_models", "best_model_path", "best_model_score", "current_score", "dirpath", "kth_best_model_path",
        "kth_value", "last_model_path", "mode", "monitor", "run_token",
    ],
    "OnExceptionCheckpoint": ["run_token"],
    "SpikeDetection": ["atol", "bad_batches", "bad_batches_path", "last_val", "mode", "rtol", "values", "warmup"],
    "StochasticWeightAveraging": ["average_model_state", "latest_update_epoch", "n_averaged", "scheduler_state"],
    "Timer": ["time_elapsed"],
    "WeightAveraging": ["latest_update_epoch", "latest_update_step"],
}  # fmt: skip
PATHLIKE = re.compile(r"path|dir|file|name|models|root|url|uri", re.I)


def _instances(tmp_path) -> dict[str, Any]:
    out = {}
    for name in C.__all__:
        cls = getattr(C, name)
        if isinstance(cls, type) and issubclass(cls, C.Callback):
            kwargs = dict(ARGS.get(name, {}))
            if name in ("OnExceptionCheckpoint",):
                kwargs["dirpath"] = str(tmp_path / "own")
            cb = cls(**kwargs)
            if isinstance(cb, ModelCheckpoint):
                cb.dirpath = str(tmp_path / "own")
            out[name] = cb
    return out


def test_every_callbacks_restored_keys_are_listed(tmp_path):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        found = {n: sorted(cb.state_dict()) for n, cb in _instances(tmp_path).items() if cb.state_dict()}
    assert found == KEYS


def test_no_callback_takes_an_outside_path_back(tmp_path):
    outside = _outside(tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name, cb in _instances(tmp_path).items():
            state = cb.state_dict()
            keys = [
                k for k in state if PATHLIKE.search(k) or (isinstance(state[k], str) and os.sep in state[k])
            ]
            for keep_dir in (False, True):  # the state's directory another one, or this callback's own
                crafted = dict(state)
                for k in keys:
                    if k == "dirpath" and keep_dir:
                        continue
                    crafted[k] = {outside: 1.0} if isinstance(state[k], dict) else outside
                if "best_model_score" in crafted:
                    crafted["best_model_score"] = 1.0
                fresh = _instances(tmp_path)[name]
                fresh.load_state_dict(crafted)
                held = repr({k: v for k, v in vars(fresh).items() if not k.startswith("__")})
                assert outside not in held, f"{name} took {keys} back from a checkpoint: {held[:300]}"
