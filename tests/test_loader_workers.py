"""Loader worker processes at the end of a stage, compared with Lightning's (its test_workers_are_shutdown): the
workers of a persistent_workers loader end with the stage, failed or not; other loaders' workers end when their
pass over the data does."""

from __future__ import annotations

import pytest
from torch.utils.data import DataLoader
from torch.utils.data.dataloader import _MultiProcessingDataLoaderIter


class Failed(Exception):
    pass


def _shutdowns(lightning: bool, fail: bool, persistent: bool) -> tuple[list[int], list[int]]:
    """The epochs at which the train and val loaders' worker processes were shut down, in a 3-epoch fit (one
    that raises at the end of epoch 1 when `fail`)."""
    if lightning:
        pl = pytest.importorskip("pytorch_lightning")
        from pytorch_lightning.demos.boring_classes import BoringModel, RandomDataset

        Trainer, Callback = pl.Trainer, pl.Callback
    else:
        from callbacks import Callback
        from trainer import Trainer
        from trainer.demos import BoringModel, RandomDataset

    class Raise(Callback):
        def on_train_epoch_end(self, trainer, *_):
            if trainer.current_epoch == 1:
                raise Failed

    t = Trainer(limit_train_batches=2, limit_val_batches=2, max_epochs=3, callbacks=[Raise()] if fail else [],
                enable_checkpointing=False, enable_model_summary=False, enable_progress_bar=False, logger=False)  # fmt: skip

    class Iterator(_MultiProcessingDataLoaderIter):
        def _shutdown_workers(self):
            self._loader.shut.append(t.current_epoch)
            super()._shutdown_workers()

    class Loader(DataLoader):
        shut: list[int]

        def _get_iterator(self):
            it = Iterator(self)
            it._loader = self
            return it

    loaders = [Loader(RandomDataset(32, 64), num_workers=1, persistent_workers=persistent) for _ in range(2)]
    for loader in loaders:
        loader.shut = []
    try:
        t.fit(BoringModel(), *loaders)
    except Failed:
        assert fail
    return loaders[0].shut, loaders[1].shut


@pytest.mark.parametrize("fail", [False, True])
def test_persistent_workers_end_with_the_stage_failed_or_not_as_in_lightning(fail):
    ours, theirs = _shutdowns(False, fail, True), _shutdowns(True, fail, True)
    assert ours == theirs == (([1, 1], [1, 1]) if fail else ([3, 3], [3, 3]))


def test_other_workers_end_with_their_pass_over_the_data():
    """Deliberate difference (docs/porting.md): Lightning keeps a finished validation's workers until the next
    validation starts (through the training epoch between them); Tandem's end when the validation does."""
    train, val = _shutdowns(False, False, False)
    assert train == [1, 2, 3]  # as Lightning: a training epoch's workers end when the next epoch starts
    assert val == [0, 0, 1, 2]  # the sanity check's and each epoch's validation's, at their own end
