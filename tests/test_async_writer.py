"""AsyncCheckpointIO's writer thread (strategies/checkpoint/async_io.py): every write, a file's torch.save and a
directory's dcp.save, runs there; with writer_nice=19 at a lower CPU priority than training (Linux), the caller's own
unchanged."""

from __future__ import annotations

import os
import sys
import threading

import pytest
import torch

from strategies.checkpoint.io import TorchCheckpointIO
from tandem_core.errors import CheckpointError
from trainer.plugins import AsyncCheckpointIO


def _nice() -> int:
    return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="a thread's own nice value is Linux's")
def test_every_write_runs_in_the_writer_thread_at_the_priority_asked(tmp_path, monkeypatch):
    """Every write (a file's torch.save, a directory's dcp.save) runs in the plugin's writer thread: at nice 19
    with writer_nice=19 (that thread only: the caller's priority is unchanged), at the process's by default."""
    import torch.distributed.checkpoint as dcp

    from strategies.checkpoint.io import ShardedCheckpointIO
    from strategies.comm import Comm

    class Recording(TorchCheckpointIO):
        def save_checkpoint(self, checkpoint, path, storage_options=None):
            seen.append((threading.get_native_id(), _nice()))
            super().save_checkpoint(checkpoint, path, storage_options)

    real_save = dcp.save

    def recording_save(*args, **kwargs):
        seen.append((threading.get_native_id(), _nice()))
        return real_save(*args, **kwargs)

    monkeypatch.setattr(dcp, "save", recording_save)
    mine, me = _nice(), threading.get_native_id()
    for nice, expected in ((19, max(19, mine)), (None, mine)):  # (None: the default)
        seen: list[tuple[int, int]] = []
        io = AsyncCheckpointIO(Recording(), writer_nice=nice)
        io.save_checkpoint({"w": torch.ones(3)}, str(tmp_path / f"{nice}.ckpt"))
        io.teardown()
        directory = AsyncCheckpointIO(writer_nice=nice)
        directory.form = ShardedCheckpointIO()
        directory.write(
            {"state_dict": {"w": torch.ones(3)}, "global_step": 1}, str(tmp_path / f"{nice}.d"), Comm()
        )
        directory.teardown()
        assert [n for _, n in seen] == [expected, expected] and me not in {t for t, _ in seen}, seen
        assert _nice() == mine  # the caller's own priority stays
        assert torch.equal(torch.load(tmp_path / f"{nice}.ckpt")["w"], torch.ones(3))
        assert {".metadata", "tandem.pt"} <= set(os.listdir(tmp_path / f"{nice}.d"))  # published whole
    with pytest.raises(CheckpointError, match="writer_nice=20"):
        AsyncCheckpointIO(writer_nice=20)
