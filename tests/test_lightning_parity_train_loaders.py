"""Training data given as a list, tuple or dict, on one script under Lightning and Tandem: what is one loader and
what is a collection of loaders, and the TypeError for an element that cannot be iterated (Lightning's
trainer/connectors/test_data_connector.py::test_non_iterables_raise covers the evaluation stages; this is fit's)."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from helpers.lightning_pair import pair_trainer

pl = pytest.importorskip("pytorch_lightning")
from pytorch_lightning.demos import boring_classes as plb  # noqa: E402

from trainer import demos  # noqa: E402


def _recording(lightning: bool) -> Any:
    base = plb.BoringModel if lightning else demos.BoringModel

    class Recording(base):
        """Records each batch's structure (type, and each part's shape or value); trains on a fixed batch."""

        seen: list[Any] = []

        def training_step(self, batch: Any, batch_idx: int) -> Any:
            parts = list(batch.values()) if isinstance(batch, dict) else batch
            parts = parts if isinstance(parts, (list, tuple)) else [parts]
            shapes = [tuple(p.shape) if isinstance(p, torch.Tensor) else p for p in parts]
            self.seen.append((type(batch).__name__, shapes))
            return super().training_step(torch.ones(2, 32), batch_idx)

        def train_dataloader(self) -> Any:
            return None

    return Recording()


def _batches(lightning: bool, tmp_path: Any, data: Any) -> list[Any]:
    model = _recording(lightning)
    pair_trainer(lightning, tmp_path, max_steps=3, limit_val_batches=0).fit(model, train_dataloaders=data)
    return model.seen


@pytest.mark.parametrize(
    "data",
    [
        [torch.arange(64.0).view(2, 32), torch.arange(96.0).view(3, 32)],  # two loaders of rows, cycled
        [[1, 2], [3, 4]],  # two loaders of numbers
        ([1, 2], [3, 4]),
        [5, 6, 7],  # one loader: a list of numbers
        {"a": torch.zeros(2, 32), "b": [8, 9]},
    ],
    ids=["tensors", "lists", "tuple", "numbers", "dict"],
)
def test_a_list_of_iterables_is_a_collection_of_loaders_as_lightnings(tmp_path, data):
    ours = _batches(False, tmp_path, data)
    assert ours == _batches(True, tmp_path, data)
    assert len(ours) == 3


def _refused(lightning: bool, tmp_path: Any, data: Any) -> list[str]:
    """The TypeError's words up to the origin, for data passed to fit and returned by train_dataloader."""
    with pytest.raises(TypeError) as passed:
        pair_trainer(lightning, tmp_path, fast_dev_run=1).fit(_recording(lightning), train_dataloaders=data)
    model = _recording(lightning)
    model.train_dataloader = lambda: data
    with pytest.raises(TypeError) as returned:
        pair_trainer(lightning, tmp_path, fast_dev_run=1).fit(model)
    return ["`".join(str(e.value).split("`")[:2]) for e in (passed, returned)]


@pytest.mark.parametrize("data", [[1, object()], [[torch.zeros(1)], object()]], ids=["number", "object"])
def test_an_element_that_cannot_be_iterated_is_a_type_error_before_training(tmp_path, data):
    ours = _refused(False, tmp_path, data)
    assert ours == _refused(True, tmp_path, data)
    assert ours == [
        "An invalid dataloader was passed to `Trainer.fit(train_dataloaders=...)",
        "An invalid dataloader was returned from `Recording.train_dataloader()",
    ]
