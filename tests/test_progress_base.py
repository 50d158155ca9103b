"""ProgressBar, Lightning's base class of progress bars: a custom bar (Lightning's documented example) gets the
batch totals and is switched off on other ranks; trainer.progress_bar_callback finds it."""

from __future__ import annotations

from callback_tasks import Scored, loader

from callbacks import ProgressBar, TQDMProgressBar
from trainer import Trainer


class LitProgressBar(ProgressBar):
    def __init__(self):
        super().__init__()
        self.enable = True
        self.shown: list[float] = []

    def disable(self):
        self.enable = False

    def on_train_batch_end(self, trainer, task, outputs, batch, batch_idx):
        super().on_train_batch_end(trainer, task, outputs, batch, batch_idx)
        self.shown.append((batch_idx + 1) / self.total_train_batches * 100)


def test_a_custom_bar_replaces_the_default_and_knows_the_totals(tmp_path):
    bar = LitProgressBar()
    trainer = Trainer(max_epochs=1, callbacks=[bar], default_root_dir=str(tmp_path), logger=False,
                      enable_model_summary=False, enable_checkpointing=False)  # fmt: skip
    trainer.fit(Scored(), loader(8, 2), loader(4, 2))
    assert trainer.progress_bar_callback is bar and not any(
        isinstance(c, TQDMProgressBar) for c in trainer.callbacks
    )
    assert bar.shown == [25.0, 50.0, 75.0, 100.0] and bar.total_val_batches == 2 and bar.enable
    assert bar.get_metrics(trainer, trainer.task) == trainer.progress_bar_metrics  # no logger: no v_num


def test_v_num_is_the_loggers_version(tmp_path):
    trainer = Trainer(max_epochs=1, default_root_dir=str(tmp_path), enable_model_summary=False)
    trainer.fit(Scored(), loader())
    assert trainer.progress_bar_callback.get_metrics(trainer, trainer.task)["v_num"] == 0
