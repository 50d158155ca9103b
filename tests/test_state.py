"""trainer/loop/state.py: the loop's state, its checkpoint keys, and each rank's own part."""

from __future__ import annotations

import torch

from trainer.loop.state import LoopState
from trainer.seed import get_rng_state, set_rng_state


def test_state_dict_round_trip_with_per_rank_parts():
    state = LoopState(epoch=3, global_step=17, batch_in_epoch=5, epoch_finished=False, val_pending=True)
    torch.manual_seed(1)
    part0 = state.rank_state([torch.ones(2), None])
    torch.manual_seed(2)
    part1 = state.rank_state(None)
    saved = state.state_dict(ranks=[part0, part1])
    assert saved["epoch"] == 3 and saved["global_step"] == 17 and saved["loop"]["batch_in_epoch"] == 5
    for rank, part in ((0, part0), (1, part1)):
        restored = LoopState()
        restored.load_state_dict(saved, rank)
        assert (restored.epoch, restored.global_step, restored.batch_in_epoch) == (3, 17, 5)
        assert restored.val_pending and not restored.epoch_finished
        assert torch.equal(restored.resume_rng["torch"], part["rng"]["torch"])
    restored = LoopState()
    restored.load_state_dict(saved, 0)
    assert torch.equal(restored.window_grads[0], torch.ones(2)) and restored.window_grads[1] is None
    restored.load_state_dict(saved, 1)
    assert restored.window_grads is None


def test_a_one_process_checkpoint_serves_every_rank():
    state = LoopState(epoch=1, global_step=4)
    saved = state.state_dict(ranks=[state.rank_state(None)])
    restored = LoopState()
    restored.load_state_dict(saved, rank=3)
    assert restored.resume_rng is not None and restored.global_step == 4


def test_rank_state_captures_the_rng_at_that_moment():
    torch.manual_seed(5)
    part = LoopState().rank_state(None)
    expected = torch.rand(3)
    torch.manual_seed(6)
    set_rng_state(part["rng"])
    assert torch.equal(torch.rand(3), expected)
    assert set(part["rng"]) >= set(get_rng_state()) - {"cuda"}


def test_mid_window_and_next_epoch():
    state = LoopState(batch_in_epoch=3)
    assert state.mid_window(k=2, automatic=True) and not state.mid_window(k=3, automatic=True)
    assert not state.mid_window(k=2, automatic=False)
    state.epoch_finished = True
    assert not state.mid_window(k=2, automatic=True)
    state.next_epoch()
    assert (state.epoch, state.batch_in_epoch, state.epoch_finished) == (1, 0, False)
