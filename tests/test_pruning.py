"""ModelPruning equals torch.nn.utils.prune applied by hand at the same moments (global L1 at each epoch's end,
the lottery-ticket reset to the weights from before training, the masks removed when training ends)."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
import torch.nn.utils.prune as prune
from averaging_tasks import Regress, as_plain, assert_equal, fit, loader, state

from callbacks import ModelCheckpoint, ModelPruning
from tandem_core.errors import ConfigError

EPOCHS, AMOUNT = 3, 0.3


def layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    return [m for m in model.modules() if isinstance(m, torch.nn.Linear)]


def hand_loop(lottery: bool, global_: bool) -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    model = as_plain(Regress())
    originals = [copy.deepcopy(m) for m in layers(model)]
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    pairs = [
        (m, n) for n in ("weight", "bias") for m in layers(model)
    ]  # Lightning's order: names, then layers
    for _ in range(EPOCHS):
        for x, y in loader():
            opt.zero_grad()
            F.mse_loss(model(x), y).backward()
            opt.step()
        if global_:
            prune.global_unstructured(pairs, pruning_method=prune.L1Unstructured, amount=AMOUNT)
        else:
            for m, n in pairs:
                prune.l1_unstructured(m, name=n, amount=AMOUNT)
        if lottery:
            for m, orig in zip(layers(model), originals):
                for n in ("weight", "bias"):
                    getattr(m, n + "_orig").data = getattr(orig, n).data.clone()
    for m, n in pairs:
        prune.remove(m, n)
    return state(model)


@pytest.mark.parametrize(("lottery", "global_"), [(True, True), (False, False)])
def test_pruning_equals_torch_prune_by_hand(lottery, global_):
    expected = hand_loop(lottery, global_)
    torch.manual_seed(0)
    task = Regress()
    cb = ModelPruning(
        "l1_unstructured",
        amount=AMOUNT,
        use_lottery_ticket_hypothesis=lottery,
        use_global_unstructured=global_,
    )
    fit(task, [cb], EPOCHS)
    got = state(as_plain(task))
    assert_equal(got, expected)
    zeros = sum(int((v == 0).sum()) for v in got.values())
    total = sum(v.numel() for v in got.values())
    assert zeros / total == pytest.approx(1 - (1 - AMOUNT) ** EPOCHS, abs=0.03)


def test_checkpoints_hold_the_pruned_weights_without_masks(tmp_path):
    torch.manual_seed(0)
    task = Regress()
    ckpt = ModelCheckpoint(dirpath=str(tmp_path), every_n_epochs=1, save_top_k=-1)
    fit(task, [ModelPruning("l1_unstructured", amount=0.5), ckpt], 2, enable_checkpointing=True)
    saved = torch.load(tmp_path / "epoch=1-step=16.ckpt", weights_only=True)["state_dict"]
    assert set(saved) == set(Regress().state_dict())  # weight, not weight_orig/weight_mask
    assert_equal(Regress.load_from_checkpoint(str(tmp_path / "epoch=1-step=16.ckpt")).state_dict(), saved)
    assert int((saved["head.weight"] == 0).sum()) > 0


def test_amount_and_apply_pruning_as_functions_of_the_epoch():
    torch.manual_seed(0)
    task, calls = Regress(), []
    cb = ModelPruning(
        "random_unstructured",
        amount=lambda e: calls.append(e) or (0.5 if e == 1 else 0),
        make_pruning_permanent=False,
    )
    fit(task, [cb], 3)
    assert calls == [0, 1, 2]
    assert hasattr(task.head, "weight_mask") and float(task.head.weight_mask.mean()) == pytest.approx(
        0.5, abs=0.2
    )


def test_arguments_are_checked_as_lightning_does():
    with pytest.raises(ConfigError, match="pruning_dim"):
        ModelPruning("ln_structured", use_global_unstructured=False)
    with pytest.raises(ConfigError, match="unstructured"):
        ModelPruning("random_structured", pruning_dim=0)
    with pytest.raises(ConfigError, match="isn't|not one of"):
        ModelPruning("magic")
    with pytest.raises(ConfigError, match="verbose"):
        ModelPruning("l1_unstructured", verbose=3)
