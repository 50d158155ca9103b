"""ModelCheckpoint: top k by a monitored value, triggers, resuming, file names, and where files go."""

from __future__ import annotations

import os
from datetime import timedelta

import pytest
import torch
from callback_tasks import CountFiles, Scored, fit, loader

from callbacks import Callback, ModelCheckpoint
from callbacks.checkpoint_names import format_name, newest_last, parse_template, unique_path
from callbacks.checkpoint_schedule import SaveSchedule
from tandem_core.errors import ConfigError
from trainer import Trainer

SCORES = [5.0, 3.0, 8.0, 1.0, 7.0, 2.0]


@pytest.mark.parametrize(
    ("mode", "kept", "best"), [("min", {3: 1.0, 5: 2.0}, 3), ("max", {2: 8.0, 4: 7.0}, 2)]
)
def test_keeps_exactly_the_top_k_by_the_monitored_value(tmp_path, mode, kept, best):
    d = str(tmp_path / "ckpt")
    cb = ModelCheckpoint(
        dirpath=d, filename="{epoch}-{val/score:.1f}", monitor="val/score", mode=mode, save_top_k=2
    )
    counter = CountFiles(d)
    fit(Scored(SCORES), [cb, counter], epochs=6)
    names = {e: f"epoch={e}-val_score={s:.1f}.ckpt" for e, s in kept.items()}
    assert sorted(os.listdir(d)) == sorted(names.values())
    assert counter.most <= 2
    assert cb.best_model_path == os.path.join(d, names[best])
    assert cb.best_model_score.item() == kept[best]
    assert {os.path.basename(p): v for p, v in cb.best_k_models.items()} == {
        names[e]: s for e, s in kept.items()
    }
    ckpt = torch.load(cb.best_model_path, weights_only=False)
    assert ckpt["epoch"] == best
    assert ckpt["callbacks"][cb.state_key]["best_model_score"] == kept[best]  # the state includes this save


def test_resume_restores_the_best_score_and_top_k(tmp_path):
    scores = [5.0, 3.0, 8.0, 1.0, 7.0, 2.0, 9.0, 0.5]

    def make(d):
        return ModelCheckpoint(dirpath=d, monitor="val/score", save_top_k=2, save_last=True)

    whole = make(str(tmp_path / "whole"))
    fit(Scored(scores), [whole], epochs=8)
    first, second = make(str(tmp_path / "split")), make(str(tmp_path / "split"))
    fit(Scored(scores), [first], epochs=4)
    assert first.best_model_score.item() == 1.0

    class Probe(Callback):
        def on_train_start(self, trainer, task):
            self.restored = (second.best_model_score.item(), dict(second.best_k_models))

    probe = Probe()
    fit(Scored(scores), [second, probe], epochs=8, ckpt_path="last")
    assert probe.restored == (1.0, first.best_k_models)
    assert second.best_model_score.item() == whole.best_model_score.item() == 0.5
    assert sorted(os.listdir(tmp_path / "split")) == sorted(os.listdir(tmp_path / "whole"))
    assert {os.path.basename(p): v for p, v in second.best_k_models.items()} == {
        os.path.basename(p): v for p, v in whole.best_k_models.items()
    }


def test_resume_into_a_new_version_directory_carries_the_best(tmp_path):
    scores = [5.0, 1.0, 8.0, 7.0, 9.0, 6.0]
    root = str(tmp_path)
    first = ModelCheckpoint(monitor="val/score", save_last=True)
    fit(Scored(scores), [first], epochs=3, logger=True, default_root_dir=root)
    assert os.path.dirname(first.best_model_path) == os.path.join(
        root, "lightning_logs", "version_0", "checkpoints"
    )
    second = ModelCheckpoint(monitor="val/score", save_last=True)
    trainer = fit(Scored(scores), [second], epochs=6, logger=True, default_root_dir=root, ckpt_path="last")
    assert second.dirpath == os.path.join(trainer.log_dir, "checkpoints")
    assert trainer.log_dir.endswith("version_1")
    assert second.best_model_score.item() == 1.0  # later epochs were worse: the best stays in version_0
    assert second.best_model_path == first.best_model_path
    assert os.path.isfile(first.best_model_path)


def test_monitored_key_never_logged_raises_naming_the_logged_keys(tmp_path):
    cb = ModelCheckpoint(dirpath=str(tmp_path), monitor="val/acc")
    with pytest.raises(ConfigError, match=r"'val/acc'.*logged keys: \[.*'val/score'"):
        fit(Scored(), [cb], epochs=1)


def test_unknown_key_in_filename_template_raises_naming_the_logged_keys(tmp_path):
    cb = ModelCheckpoint(dirpath=str(tmp_path), filename="{epoch}-{val/scor:.2f}")
    with pytest.raises(ConfigError, match=r"val/scor.*logged keys: \[.*'val/score'"):
        fit(Scored(), [cb], epochs=1)
    with pytest.raises(ConfigError, match="bad format"):
        ModelCheckpoint(filename="{val/score:.2q}")


def test_validation_key_before_the_first_validation_waits_instead_of_failing(tmp_path):
    """A step save before the monitored validation key exists waits for a validation's end that saves by
    steps (Lightning 2.6); validating once per epoch, that end saves by epochs only (every_n_epochs=0
    here), so epoch 0 saves nothing, as in Lightning."""
    cb = ModelCheckpoint(dirpath=str(tmp_path), monitor="val/score", every_n_train_steps=1, save_top_k=-1)
    fit(Scored([3.0, 2.0]), [cb], epochs=2)
    assert sorted(os.listdir(tmp_path)) == ["epoch=1-step=3.ckpt", "epoch=1-step=4.ckpt"]


@pytest.mark.parametrize(
    ("kwargs", "epochs", "expected"),
    [
        ({}, 3, ["epoch=2-step=6.ckpt"]),
        ({"save_top_k": -1}, 3, ["epoch=0-step=2.ckpt", "epoch=1-step=4.ckpt", "epoch=2-step=6.ckpt"]),
        ({"save_top_k": -1, "every_n_train_steps": 3}, 3, ["epoch=1-step=3.ckpt", "epoch=2-step=6.ckpt"]),
        ({"save_top_k": -1, "every_n_epochs": 2}, 4, ["epoch=1-step=4.ckpt", "epoch=3-step=8.ckpt"]),
        ({"save_last": True, "save_top_k": 0}, 2, ["last.ckpt"]),
    ],
)
def test_triggers_without_a_monitor(tmp_path, kwargs, epochs, expected):
    cb = ModelCheckpoint(dirpath=str(tmp_path), **kwargs)
    fit(Scored(), [cb], epochs=epochs, val=False)
    assert sorted(os.listdir(tmp_path)) == expected


def test_without_validation_the_validation_interval_does_not_change_the_saves(tmp_path):
    """No validation: every epoch end saves, whatever check_val_every_n_epoch says (it once saved nothing)."""
    saved = {}
    for every in (1, 2):
        d = str(tmp_path / str(every))
        fit(
            Scored(), [ModelCheckpoint(dirpath=d, save_top_k=-1)], 3, val=False, check_val_every_n_epoch=every
        )
        saved[every] = sorted(os.listdir(d))
    assert saved[2] == saved[1] == ["epoch=0-step=2.ckpt", "epoch=1-step=4.ckpt", "epoch=2-step=6.ckpt"]


def test_writes_go_through_atomic_save_and_leave_no_temporary_files(tmp_path, monkeypatch):
    import strategies.checkpoint.io as ckpt_io

    written = []
    real = ckpt_io.atomic_save
    monkeypatch.setattr(
        ckpt_io, "atomic_save", lambda obj, path: (written.append(os.fspath(path)), real(obj, path))
    )
    cb = ModelCheckpoint(dirpath=str(tmp_path), monitor="val/score", save_top_k=2, save_last=True)
    fit(Scored(SCORES), [cb], epochs=6)
    assert set(os.listdir(tmp_path)) <= {os.path.basename(p) for p in written}
    assert not [f for f in os.listdir(tmp_path) if f.startswith(".tmp")]
    assert cb.last_checkpoint_path() == os.path.join(str(tmp_path), "last.ckpt")


def test_default_dirpath_follows_the_logger_or_the_root_dir(tmp_path):
    with_logger = fit(Scored(), [], epochs=1, logger=True, default_root_dir=str(tmp_path / "a"))
    cb = with_logger.checkpoint_callback
    assert cb.dirpath == os.path.join(with_logger.log_dir, "checkpoints")
    assert os.listdir(cb.dirpath) == ["epoch=0-step=2.ckpt"]
    without = fit(Scored(), [], epochs=1, default_root_dir=str(tmp_path / "b"))
    assert without.checkpoint_callback.dirpath == os.path.join(str(tmp_path / "b"), "checkpoints")


def test_max_steps_mid_epoch_still_refreshes_last(tmp_path):  # Lightning saves it in on_train_epoch_end
    cb = ModelCheckpoint(dirpath=str(tmp_path), save_last=True)
    fit(Scored(), [cb], epochs=5, val=False, max_steps=3)
    assert torch.load(os.path.join(str(tmp_path), "last.ckpt"), weights_only=False)["global_step"] == 3


def test_fast_dev_run_writes_no_checkpoint(tmp_path):
    cb = ModelCheckpoint(dirpath=str(tmp_path / "ck"), save_last=True)
    Trainer(fast_dev_run=True, callbacks=[cb], enable_progress_bar=False).fit(
        Scored(), loader(), loader(2, 2)
    )
    assert not os.path.exists(tmp_path / "ck")


# ----- file names and the save schedule, without a Trainer ------------------------------------------------
def test_file_names_fill_the_template_and_never_overwrite_a_foreign_file(tmp_path):
    values = {"epoch": 3.0, "step": 40.0, "val/loss": 0.12345}
    template = "{epoch}-{val/loss:.3f}"
    assert parse_template(template) == [("epoch", ""), ("val/loss", ".3f")]
    expected = f"epoch={int(values['epoch'])}-val_loss={values['val/loss']:.3f}"
    assert format_name(template, values, "=") == expected
    assert format_name(template, values, None) == f"{int(values['epoch'])}-{values['val/loss']:.3f}"
    taken = tmp_path / "a.ckpt"
    taken.write_bytes(b"someone else's")
    (tmp_path / "a-v1.ckpt").write_bytes(b"also taken")
    assert unique_path(str(taken), replaceable="") == str(tmp_path / "a-v2.ckpt")
    assert unique_path(str(taken), replaceable=str(taken)) == str(taken)  # our own file: replace it
    assert unique_path(str(tmp_path / "free.ckpt"), "") == str(tmp_path / "free.ckpt")


def test_newest_last_ignores_other_files_and_takes_the_newest(tmp_path):
    assert newest_last([str(tmp_path)]) is None
    for i, name in enumerate(["last.ckpt", "last-v1.ckpt", "lastly.ckpt", "last-v2.ckpt.part"]):
        (tmp_path / name).write_bytes(b"x")
        os.utime(tmp_path / name, (1000 + i, 1000 + i))
    assert newest_last([str(tmp_path / "missing"), str(tmp_path)]) == str(tmp_path / "last-v1.ckpt")


def test_schedule_arguments_and_defaults():
    assert (SaveSchedule(None, None, None).every_n_epochs, SaveSchedule(None, None, None).per_step) == (
        1,
        False,
    )
    steps = SaveSchedule(5, None, None)
    assert (steps.every_n_epochs, steps.every_n_train_steps, steps.per_step) == (0, 5, True)
    timed = SaveSchedule(None, 90, None)
    assert timed.train_time_interval == timedelta(seconds=90) and timed.per_step
    with pytest.raises(ConfigError, match="mutually exclusive"):
        SaveSchedule(5, None, 2)
    with pytest.raises(ConfigError, match=r"every_n_epochs=...\) must be an int >= 0"):
        SaveSchedule(None, None, -1)
    cb = ModelCheckpoint(every_n_train_steps=7)
    assert (cb.every_n_train_steps, cb.every_n_epochs, cb.train_time_interval) == (7, 0, None)


class ValScored(Scored):
    def validation_step(self, batch, batch_idx):
        self.log("val_score", float(self.scores[self.current_epoch]))


@pytest.mark.parametrize("template", ["{epoch}-{val_score:.2f}", "{val_score}-{step}"])
def test_a_filename_key_not_logged_yet_is_filled_with_zero_as_lightning(template, tmp_path):
    """Issue 34: a short run that ends before its first validation still saves; the name is Lightning's."""
    from pytorch_lightning.callbacks import ModelCheckpoint as LightningCheckpoint

    cb = ModelCheckpoint(dirpath=str(tmp_path), filename=template, every_n_train_steps=1)
    with pytest.warns(UserWarning, match=r"\['val_score'\], which were never logged.*Not logged yet: 0"):
        trainer = fit(ValScored(), [cb], 1, max_steps=1)
    expected = LightningCheckpoint(dirpath=str(tmp_path), filename=template).format_checkpoint_name(
        {"epoch": torch.tensor(0), "step": torch.tensor(trainer.global_step)}
    )
    assert [str(p) for p in tmp_path.glob("*.ckpt")] == [expected] == [cb.best_model_path]
