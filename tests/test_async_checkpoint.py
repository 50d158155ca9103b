"""AsyncCheckpointIO and Lightning's checkpoint-IO plugins (strategies/checkpoint/async_io.py, plugins.py): the
files equal a synchronous run's, the snapshot is taken before a save returns, at most one training state is in
flight, a checkpoint is visible only when complete, a write error surfaces (naming the file) at the next save
or at teardown, a user's CheckpointIO does the file operations, and (slow) SIGKILL at random points of 20
background saves always leaves a loadable last checkpoint that resumes at its step."""

from __future__ import annotations

import contextlib
import os
import random
import signal
import subprocess
import sys
import threading
import time

import pytest
import torch
from conftest import FAST, ROOT, run_distributed
from helpers.checkpointing import CountingData, Net
from torch.utils.data import DataLoader

from callbacks import LambdaCallback, ModelCheckpoint
from callbacks.checkpoint_names import newest_lasts
from strategies.checkpoint.io import CheckpointIO, TorchCheckpointIO, load
from strategies.fsdp import FSDPStrategy
from tandem_core.errors import CheckpointError, ConfigError
from trainer import Trainer
from trainer.plugins import AsyncCheckpointIO


class Gated(TorchCheckpointIO):
    """The default file form, each write held until the test releases a permit (or failing with `error`)."""

    def __init__(self, error: BaseException | None = None, permits: int = 0) -> None:
        self.permits, self.error = threading.Semaphore(permits), error
        self.started: list[str] = []
        self.order: list[str] = []

    def save_checkpoint(self, checkpoint, path, storage_options=None):
        self.started.append(os.path.basename(path))
        assert self.permits.acquire(timeout=10)
        if self.error is not None:
            raise self.error
        self.order.append(os.path.basename(path))
        super().save_checkpoint(checkpoint, path, storage_options)


def _until(condition, timeout=5.0):
    end = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < end
        time.sleep(0.01)


def _fit(tmp_path, plugins=None, name="run", **kw):
    ckpt = ModelCheckpoint(
        dirpath=str(tmp_path / name),
        every_n_train_steps=1,
        save_top_k=2,
        monitor="step",
        mode="max",
        save_last=True,
    )
    trainer = Trainer(
        max_steps=5, default_root_dir=str(tmp_path), callbacks=[ckpt], plugins=plugins,
        **{**FAST, "enable_checkpointing": True}, **kw,
    )  # fmt: skip
    torch.manual_seed(0)
    task = Net(optimizer="adam")
    trainer.fit(task, DataLoader(CountingData(), batch_size=4))
    return trainer, task, ckpt


def _same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_async_checkpoints_equal_synchronous_ones_and_resume_at_their_step(tmp_path):
    _, _, sync = _fit(tmp_path, name="sync")
    trainer, task, ckpt = _fit(tmp_path, [AsyncCheckpointIO()], name="async")
    assert isinstance(trainer.strategy.checkpoint_io, AsyncCheckpointIO)
    files = sorted(os.listdir(tmp_path / "async"))
    assert (
        files
        == sorted(os.listdir(tmp_path / "sync"))
        == ["epoch=0-step=4.ckpt", "epoch=0-step=5.ckpt", "last.ckpt"]
    )
    for name in files:  # top-k deletion happened, and every file holds what the synchronous run wrote
        a, s = load(tmp_path / "async" / name), load(tmp_path / "sync" / name)
        assert a["global_step"] == s["global_step"] and _same(a["state_dict"], s["state_dict"])
        assert _same(a["optimizer_states"][0]["state"][0], s["optimizer_states"][0]["state"][0])
    last = load(tmp_path / "async" / "last.ckpt")
    assert last["global_step"] == 5 and _same(last["state_dict"], task.state_dict())
    steps = LambdaCallback(on_train_batch_start=lambda trainer, *_: seen.append(trainer.global_step))
    seen: list[int] = []
    resumed = Trainer(max_steps=7, default_root_dir=str(tmp_path), callbacks=[steps], **FAST)
    resumed.fit(
        Net(optimizer="adam"), DataLoader(CountingData(), batch_size=4), ckpt_path=ckpt.last_model_path
    )
    assert seen == [5, 6] and resumed.global_step == 7  # continued at the saved step


def test_the_snapshot_is_taken_before_save_returns_and_one_state_is_in_flight(tmp_path):
    gated = Gated()
    io = AsyncCheckpointIO(gated)
    w = torch.zeros(1000)
    io.save_checkpoint({"w": w, "step": 1}, str(tmp_path / "a.ckpt"))
    _until(lambda: gated.started == ["a.ckpt"])
    w.add_(1)  # the caller goes on: a newer state
    assert not os.path.exists(tmp_path / "a.ckpt")  # not visible before it is complete
    threading.Timer(0.3, gated.permits.release).start()
    t0 = time.monotonic()
    io.save_checkpoint({"w": w, "step": 2}, str(tmp_path / "b.ckpt"))  # w changed: waits for a.ckpt...
    assert time.monotonic() - t0 >= 0.25 and gated.order == ["a.ckpt"]  # ...complete when this returned
    t0 = time.monotonic()
    io.save_checkpoint({"w": w, "step": 2}, str(tmp_path / "c.ckpt"))  # the state in flight: no wait
    assert time.monotonic() - t0 < 0.25 and gated.order == ["a.ckpt"]
    gated.permits.release()
    gated.permits.release()
    io.teardown()
    assert gated.order == ["a.ckpt", "b.ckpt", "c.ckpt"]
    assert float(torch.load(tmp_path / "a.ckpt")["w"].max()) == 0.0  # the copy taken at save time
    assert (
        float(torch.load(tmp_path / "b.ckpt")["w"].min())
        == 1.0
        == float(torch.load(tmp_path / "c.ckpt")["w"].min())
    )


def test_reading_waits_for_a_write_in_flight(tmp_path):
    gated = Gated()
    io = AsyncCheckpointIO(gated)
    _, _, _ = _fit(tmp_path, name="first")
    ckpt = load(tmp_path / "first" / "last.ckpt")
    io.save_checkpoint({**ckpt, "global_step": 99}, str(tmp_path / "x.ckpt"))
    threading.Timer(0.3, gated.permits.release).start()
    assert load(tmp_path / "x.ckpt")["global_step"] == 99  # waited for the write, saw it whole
    io.remove_checkpoint(str(tmp_path / "x.ckpt"))
    assert not os.path.exists(tmp_path / "x.ckpt")
    io.teardown()


def test_a_write_error_surfaces_at_the_next_save_and_at_teardown_naming_the_file(tmp_path):
    io = AsyncCheckpointIO(Gated(OSError(28, "No space left on device"), permits=2))
    io.save_checkpoint({"w": torch.ones(3)}, str(tmp_path / "full.ckpt"))
    time.sleep(0.2)
    with pytest.raises(CheckpointError, match=r"full\.ckpt.*No space left on device"):
        io.save_checkpoint({"w": torch.ones(3) * 2}, str(tmp_path / "next.ckpt"))
    io.teardown()  # reported once: nothing left in flight
    io.save_checkpoint({"w": torch.ones(3) * 3}, str(tmp_path / "again.ckpt"))
    with pytest.raises(CheckpointError, match=r"again\.ckpt.*No space left"):  # a failure not yet reported
        io.teardown()
    assert not os.listdir(tmp_path)  # nothing written, no temporary file left
    with pytest.raises(CheckpointError, match=r"background save of checkpoint .*last\.ckpt|epoch=0-step=1"):
        _fit(tmp_path, [AsyncCheckpointIO(Gated(OSError(28, "No space left on device"), 99))], name="failing")


def test_checkpoint_plugins_attach_as_in_lightning(tmp_path):
    io = AsyncCheckpointIO()
    trainer = Trainer(plugins=[io], **FAST)
    assert trainer.strategy.checkpoint_io is io and type(io.checkpoint_io) is TorchCheckpointIO
    outer = AsyncCheckpointIO(AsyncCheckpointIO())
    Trainer(plugins=[outer], **FAST)
    assert type(outer.checkpoint_io.checkpoint_io) is TorchCheckpointIO
    assert outer._base_checkpoint_io_configured and outer.checkpoint_io._base_checkpoint_io_configured
    for io in (AsyncCheckpointIO(), AsyncCheckpointIO(TorchCheckpointIO())):  # the default file IO or none:
        strategy = FSDPStrategy()  # FSDP's own form is written (directories of shards)
        strategy.checkpoint_io = io
        assert io.writes_directory and strategy.checkpoint_io is io
    io = AsyncCheckpointIO()  # given to the constructor: joins the form the constructor sets after it
    assert FSDPStrategy(checkpoint_io=io).checkpoint_io is io and io.writes_directory
    io = AsyncCheckpointIO()
    assert FSDPStrategy(checkpoint_io=io, save_full=True).checkpoint_io is io and not io.writes_directory
    io = AsyncCheckpointIO()
    assert Trainer(strategy=FSDPStrategy(checkpoint_io=io), **FAST).strategy.checkpoint_io is io
    with pytest.raises(ConfigError, match="both by FSDPStrategy.checkpoint_io=.... and in plugins"):
        Trainer(
            strategy=FSDPStrategy(checkpoint_io=AsyncCheckpointIO()), plugins=[AsyncCheckpointIO()], **FAST
        )

    class Counting(CheckpointIO):  # a user's own plugin: the strategy's file operations go through it
        calls: list[str] = []

        def save_checkpoint(self, checkpoint, path, storage_options=None):
            self.calls.append("save")
            torch.save(checkpoint, path)

        def load_checkpoint(self, path, map_location=None, weights_only=None):
            self.calls.append("load")
            return torch.load(path, weights_only=True)

        def remove_checkpoint(self, path):
            self.calls.append("remove")
            os.remove(path)

    user = Counting()
    trainer, task, ckpt = _fit(tmp_path, [user], name="user")
    assert trainer.strategy.checkpoint_io is user and user.calls.count("save") == 10
    assert user.calls.count("remove") == 3  # top 2 of 5 steps kept
    Trainer(**FAST).validate(task, DataLoader(CountingData(), batch_size=4), ckpt_path=ckpt.last_model_path)
    trainer.validate(task, DataLoader(CountingData(), batch_size=4), ckpt_path=ckpt.last_model_path)
    assert user.calls.count("load") == 1  # through the plugin only where it is set
    with pytest.raises(ConfigError, match=r"directories.*save_full=True"):
        FSDPStrategy().checkpoint_io = Counting()
    with pytest.raises(
        ConfigError, match="at most one plugin of each kind; received multiple values for CheckpointIO"
    ):
        Trainer(plugins=[AsyncCheckpointIO(), TorchCheckpointIO()], **FAST)
    with pytest.raises(ConfigError, match="is of none of them"):
        Trainer(plugins=["bitsandbytes"], **FAST)


def test_a_stop_signal_checkpoint_is_complete_before_the_process_exits(tmp_path):
    gated = Gated(permits=0)
    at_exit: list[list[str]] = []  # what was written when the stop left the loop (before any requeue)
    stop = LambdaCallback(
        on_train_batch_end=lambda trainer, task, out, batch, i: (
            i == 2 and os.kill(os.getpid(), signal.SIGTERM)
        ),
        on_exception=lambda trainer, task, e: at_exit.append(list(gated.order)),
    )
    threading.Timer(0.5, lambda: [gated.permits.release() for _ in range(9)]).start()
    trainer = Trainer(
        max_steps=50,
        default_root_dir=str(tmp_path),
        callbacks=[stop],
        **{**FAST, "enable_checkpointing": True},
    )
    trainer.strategy.checkpoint_io = AsyncCheckpointIO(gated)
    with pytest.raises(SystemExit) as info:
        trainer.fit(Net(), DataLoader(CountingData(), batch_size=4))
    assert info.value.code == 128 + signal.SIGTERM
    assert at_exit == [["last.ckpt"]]  # written before the stop went on (a SLURM requeue comes after)
    assert load(tmp_path / "checkpoints" / "last.ckpt")["global_step"] == 3


def _kill_cycles(tmp_path, *flags: str) -> None:
    """Kill the run at a random moment of one of its background saves, again and again, until 20 saves have
    started: the newest last checkpoint always loads, every checkpoint loads, and the next start resumes at
    its step; the run resumed so through every kill ends with the weights of an uninterrupted one."""
    script, steps, rng = os.path.join(ROOT, "tests/scripts/async_ckpt_train.py"), 28, random.Random(42)
    root = str(tmp_path / "killed")
    saves, kills, saved_step, mid_write = 0, 0, 0, 0
    listing: list[str] = []  # what the last kill left in the checkpoint directory
    while saves < 20:
        proc = subprocess.Popen(
            [sys.executable, script, root, str(steps), *flags], stdout=subprocess.PIPE, text=True,
            start_new_session=True,
        )  # fmt: skip
        # a first run is killed once its first step's checkpoints are written (its 4th save has started)
        target, started = rng.randint(4 if saved_step == 0 else 2, 7), 0
        assert proc.stdout is not None
        said: list[str] = []
        for line in proc.stdout:
            said.append(line)
            if line.startswith("resumed"):  # resumes at the step of the last checkpoint
                assert int(line.split()[1]) == saved_step, (said, listing)
            if line.startswith("saving"):
                started += 1
                if started == target:  # somewhere in this save: the copy, the write, the rename, or after
                    time.sleep(rng.uniform(0.0, 0.8))
                    for pid in [proc.pid, *_children(proc.pid)]:  # every process of the job at once
                        with contextlib.suppress(ProcessLookupError):
                            os.kill(pid, signal.SIGKILL)
                    break
        proc.wait(60)
        assert proc.returncode == -9, "the run ended before the kill"
        saves, kills = saves + started, kills + 1
        left = listing = sorted(os.listdir(os.path.join(root, "ckpt")))
        mid_write += any(".tmp-" in n for n in left)  # the kill landed inside a write (its temporary is left)
        last = newest_lasts([os.path.join(root, "ckpt")])
        assert last, "no last checkpoint after a kill"
        ckpt = load(last[0])  # never a half-written one
        assert ckpt["global_step"] >= saved_step
        saved_step = ckpt["global_step"]
        for name in os.listdir(os.path.join(root, "ckpt")):
            if name.endswith(".ckpt"):
                load(os.path.join(root, "ckpt", name))
    assert kills >= 4 and mid_write >= 1, (kills, mid_write)  # (saves of 50 MB follow each other closely)
    for run in (root, str(tmp_path / "whole")):  # the killed run to its end, and an uninterrupted one
        out = subprocess.run(
            [sys.executable, script, run, str(steps), *flags], capture_output=True, text=True, timeout=300
        )
        assert out.returncode == 0 and "done" in out.stdout, out.stderr[-3000:]
        assert f"resumed {saved_step if run == root else 0}" in out.stdout
    final, whole = torch.load(os.path.join(root, "final.pt")), torch.load(tmp_path / "whole" / "final.pt")
    assert _same(final, whole)
    print(
        f"{kills} kills ({mid_write} inside a write) during {saves} background saves; the last one left step "
        f"{saved_step}"
    )


@pytest.mark.slow
def test_sigkill_during_20_async_saves_leaves_a_loadable_last_checkpoint(tmp_path):
    _kill_cycles(tmp_path)  # one file per save, written by a thread


@pytest.mark.slow
def test_sigkill_during_20_dcp_async_saves_leaves_a_loadable_last_checkpoint(tmp_path):
    _kill_cycles(tmp_path, "--fsdp")  # fsdp at 2 processes: directories of shards, DCP


def _children(pid: int) -> list[int]:
    """Every live descendant of `pid` (from /proc: torch's launcher starts each worker in a session of its own)."""
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    parents[int(entry)] = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
    found, todo = [], [pid]
    while todo:
        p = todo.pop()
        kids = [c for c, parent in parents.items() if parent == p]
        found += kids
        todo += kids
    return found


def _fsdp_async(rank: int, world: int, root: str) -> dict:
    sys.path.insert(0, os.path.join(ROOT, "tests", "scripts"))
    from fsdp_train import Block, Tower, full_state, make_data

    from strategies.fsdp import FSDPStrategy

    def fit(name, plugins=None, ckpt_path=None, max_steps=3, callbacks=(), checkpoint_io=None):
        cbs = list(callbacks)
        if name:
            cbs.append(
                ModelCheckpoint(
                    dirpath=os.path.join(root, name), every_n_train_steps=1, save_top_k=2, monitor="step",
                    mode="max", save_last=True,
                )
            )  # fmt: skip
        trainer = Trainer(
            strategy=FSDPStrategy(wrap=[Block], checkpoint_io=checkpoint_io), devices=world, max_steps=max_steps, callbacks=cbs, plugins=plugins,
            **{**FAST, "enable_checkpointing": bool(name)},
        )  # fmt: skip
        task = Tower()
        trainer.fit(task, DataLoader(make_data(), batch_size=6), ckpt_path=ckpt_path)
        return trainer, task

    out: dict = {}
    fit("sync")
    trainer, task = fit("async", [AsyncCheckpointIO()])
    out["async_io"] = type(trainer.strategy.checkpoint_io).__name__
    out["listing"] = {n: sorted(os.listdir(os.path.join(root, n))) for n in ("sync", "async")}
    start = []
    first = LambdaCallback(on_train_start=lambda t, *_: start.append(t.global_step))
    # resumed from it, saving through the strategy's own checkpoint_io= this time
    resumed_io = AsyncCheckpointIO()
    trainer, resumed = fit(
        "resumed", None, os.path.join(root, "async", "last.ckpt"), 6, [first], checkpoint_io=resumed_io
    )
    out["resumed_at"], out["resumed"] = start, full_state(resumed)
    out["resumed_io"] = trainer.strategy.checkpoint_io is resumed_io and resumed_io.writes_directory
    out["listing"]["resumed"] = sorted(os.listdir(os.path.join(root, "resumed")))
    out["whole"] = full_state(fit(None, max_steps=6)[1])
    return out


@pytest.mark.slow
def test_sharded_checkpoints_are_written_with_dcp_in_the_background(tmp_path):
    """fsdp at 2 processes: the directories the plugin's writer thread wrote with DCP (while training went on) hold what a
    synchronous save wrote at the same steps; a run resumed from one continues at its step and ends as an
    uninterrupted run."""
    ranks = run_distributed(_fsdp_async, str(tmp_path), world_size=2, timeout=400)
    for r in ranks:
        assert r["async_io"] == "AsyncCheckpointIO"
        assert (
            r["listing"]["async"]
            == r["listing"]["sync"]
            == ["epoch=0-step=2.ckpt", "epoch=0-step=3.ckpt", "last.ckpt"]
        )
        assert r["resumed_at"] == [3]
        assert r["resumed_io"] and r["listing"]["resumed"] == [
            "epoch=1-step=5.ckpt",
            "epoch=1-step=6.ckpt",
            "last.ckpt",
        ]
        assert _same(r["resumed"], r["whole"]) or all(
            float((r["resumed"][k] - r["whole"][k]).abs().max()) <= 1e-6 for k in r["whole"]
        )
    for name in ranks[0]["listing"]["async"]:
        a, s = load(tmp_path / "async" / name), load(tmp_path / "sync" / name)
        assert os.path.isdir(tmp_path / "async" / name)
        assert a["global_step"] == s["global_step"] and _same(a["state_dict"], s["state_dict"]), name
    for name in ("async", "resumed"):
        assert not [n for n in os.listdir(tmp_path / name) if ".tmp-" in n or ".old-" in n]
    assert load(tmp_path / "resumed" / "last.ckpt")["global_step"] == 6
