"""classifier.py (Trainer defaults, shuffled loader, dropout) against a hand loop, and the sanity check: Lightning
saves and restores every random generator around it, so running it (or not) leaves the run unchanged."""

from __future__ import annotations

import functools

import pytest
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader

from tests.ports.harness import QUIET, LazyPort, assert_same_weights, differs, seed_all, weights

classifier = LazyPort("classifier")


@functools.cache  # computed once per session; the tests only read it
def reference(leak: bool = False) -> tuple[dict[str, torch.Tensor], float]:
    seed_all(1)
    train, val, test = classifier.digits_split()
    net = classifier.LitClassifier()  # as a plain nn.Module
    if leak:
        torch.empty((), dtype=torch.int64).random_()  # what iterating a loader before training would draw
    opt = torch.optim.Adam(net.parameters(), lr=1e-2)
    train_loader, val_loader = DataLoader(train, batch_size=32, shuffle=True), DataLoader(val, batch_size=100)
    for _ in range(3):
        net.train()
        for x, y in train_loader:
            loss = F.cross_entropy(net(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
        net.eval()
        with torch.no_grad():
            for x, _ in val_loader:
                net(x)
    with torch.no_grad():
        correct = sum(int((net(x).argmax(1) == y).sum()) for x, y in DataLoader(test, batch_size=100))
    return weights(net), correct / len(test)


def test_classifier_ends_with_the_hand_loops_weights(tmp_path):
    out = classifier.main(default_root_dir=str(tmp_path), **QUIET)
    expected, acc = reference()
    assert_same_weights(weights(out["model"]), expected)
    assert out["results"] == [{"test_acc": pytest.approx(acc, abs=1e-6)}]


def test_sanity_check_leaves_the_random_state_alone(tmp_path):
    runs = {
        steps: weights(
            classifier.main(default_root_dir=str(tmp_path / str(steps)), num_sanity_val_steps=steps, **QUIET)[
                "model"
            ]
        )  # fmt: skip
        for steps in (0, 2, -1)
    }
    assert_same_weights(runs[2], runs[0])
    assert_same_weights(runs[-1], runs[0])


def test_an_extra_random_draw_would_change_this_script():
    # a sanity check that leaked its loader's draw from the global generator would shift every shuffle and
    # dropout mask after it: the size of effect the test above guards against
    assert differs(reference(leak=True)[0], reference()[0])
