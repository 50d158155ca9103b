"""Directory (DCP) checkpoints load as plain data only. A crafted ``.metadata``, or a crafted non-tensor item
in a ``.distcp`` file, whose payload would create a marker file, is refused on Tandem's load paths with a
CheckpointError naming the global; torch's own reader runs the same payload (the controls). A genuine
directory still reads back exactly what was saved."""

from __future__ import annotations

import contextlib
import glob
import os
import pickle
import warnings
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.distributed.checkpoint as dcp
from conftest import FAST
from helpers.checkpointing import CountingData, Net
from torch.utils.data import DataLoader

from strategies.checkpoint import dcp_read
from strategies.checkpoint.directory import dir_payload
from strategies.checkpoint.io import ShardedCheckpointIO, TorchCheckpointIO, load
from strategies.checkpoint.plugins import use_form
from tandem_core.errors import CheckpointError
from trainer import Trainer

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
OPT_ITEM = "optim0/param_groups.net.0.weight.lr"  # a non-tensor item that resuming reads


class _Payload:
    """Unpickling this runs os.system: a stand-in for whatever an attacker's file would run."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.system, (f"touch {self.marker}",))


def _data() -> DataLoader:
    return DataLoader(CountingData(), batch_size=5)


@pytest.fixture
def saved(tmp_path) -> tuple[str, Net, Trainer]:
    """A directory checkpoint of a 3-step Adam run, written as FSDPStrategy writes one (one process here)."""
    task = Net(optimizer="adam")
    trainer = Trainer(max_steps=3, default_root_dir=str(tmp_path), **FAST)
    use_form(trainer.strategy, ShardedCheckpointIO())
    trainer.fit(task, _data())
    path = str(tmp_path / "dir.ckpt")
    trainer.save_checkpoint(path)
    assert os.path.isfile(os.path.join(path, ".metadata"))
    return path, task, trainer


def _fit(path: str, root: str) -> None:
    Trainer(max_steps=5, default_root_dir=root, **FAST).fit(Net(optimizer="adam"), _data(), ckpt_path=path)


LOADERS: dict[str, Callable[[str, str], Any]] = {
    "load_from_checkpoint": lambda path, root: Net.load_from_checkpoint(path),  # read_dir
    "fit": _fit,  # restore_dir
}


def _refused(e: pytest.ExceptionInfo[CheckpointError], marker: str, where: str) -> None:
    text = str(e.value)
    assert "needs 'posix.system' to load" in text and "reads only plain data from checkpoints" in text, text
    assert where in text, text
    assert not os.path.exists(marker)


# ----- a genuine directory ------------------------------------------------------------------------
def test_a_genuine_directory_reads_back_what_was_saved(saved, tmp_path):
    path, task, trainer = saved
    ckpt = load(path)
    assert ckpt["global_step"] == 3
    for k, v in task.state_dict().items():
        assert torch.equal(ckpt["state_dict"][k], v), k
    fresh = Net(optimizer="adam")
    optimizer = fresh.configure_optimizers()["optimizer"]
    for group in optimizer.param_groups:  # so that only reading the saved non-tensor items restores them
        group.update(lr=0.5, betas=(0.1, 0.2), eps=0.3)
    TorchCheckpointIO().restore(path, fresh, [optimizer])
    want, got = trainer.optimizers[0].state_dict(), optimizer.state_dict()
    assert got["param_groups"] == want["param_groups"]  # lr, betas (a tuple), eps, ...: the non-tensor items
    for i, state in want["state"].items():
        for k, v in state.items():
            assert torch.equal(got["state"][i][k], v), (i, k)
    # the restricted unpickler builds the same metadata as torch's own reader
    ours, torchs = dcp_read.read_metadata(path), dcp.FileSystemReader(path).read_metadata()
    assert ours.state_dict_metadata == torchs.state_dict_metadata
    assert ours.storage_data == torchs.storage_data and ours.planner_data == torchs.planner_data


def test_resuming_from_the_directory_matches_resuming_from_a_file(saved, tmp_path):
    path, _, trainer = saved
    use_form(trainer.strategy, TorchCheckpointIO())
    trainer.save_checkpoint(str(tmp_path / "file.ckpt"))
    resumed = {}
    for name in ("dir.ckpt", "file.ckpt"):
        task = Net(optimizer="adam")
        Trainer(max_steps=6, default_root_dir=str(tmp_path / name), **FAST).fit(
            task, _data(), ckpt_path=str(tmp_path / name)
        )
        resumed[name] = task.state_dict()
    for k, v in resumed["file.ckpt"].items():
        assert torch.equal(resumed["dir.ckpt"][k], v), k


# ----- a crafted .metadata ------------------------------------------------------------------------
def _craft_metadata(path: str, marker: str, inside: bool) -> None:
    """Replace the directory's .metadata by the payload alone, or by the genuine metadata carrying it."""
    payload: Any = _Payload(marker)
    if inside:
        payload = dcp.FileSystemReader(path).read_metadata()  # genuine so far: no payload in it yet
        payload.storage_meta.modules = [_Payload(marker)]
    with open(os.path.join(path, ".metadata"), "wb") as f:
        pickle.dump(payload, f)


@pytest.mark.parametrize("inside", [False, True], ids=["alone", "inside"])
def test_torchs_reader_runs_a_crafted_metadata(saved, tmp_path, inside):
    """The control: torch's own reader of the same directory does run the payload."""
    path, marker = saved[0], str(tmp_path / "PWNED")
    _craft_metadata(path, marker, inside)
    with contextlib.suppress(AttributeError):  # the payload alone is no metadata, but it has run by then
        dcp.FileSystemReader(path).read_metadata()
    assert os.path.exists(marker)


@pytest.mark.parametrize("inside", [False, True], ids=["alone", "inside"])
@pytest.mark.parametrize("how", sorted(LOADERS))
def test_a_crafted_metadata_is_refused(saved, tmp_path, how, inside):
    path, marker = saved[0], str(tmp_path / "PWNED")
    _craft_metadata(path, marker, inside)
    with pytest.raises(CheckpointError) as e:
        LOADERS[how](path, str(tmp_path / "run"))
    _refused(e, marker, os.path.join(path, ".metadata"))


def test_dcp_read_load_refuses_a_crafted_metadata(saved, tmp_path):
    """The metadata dcp.load reads itself is refused too (not only Tandem's first read)."""
    path, marker = saved[0], str(tmp_path / "PWNED")
    _craft_metadata(path, marker, inside=False)
    with pytest.raises(CheckpointError) as e:
        dcp_read.load({"model/net.0.weight": torch.empty(8, 4)}, path, no_dist=True)
    _refused(e, marker, os.path.join(path, ".metadata"))


# ----- a crafted non-tensor item in a .distcp file -----------------------------------------------
def _craft_item(path: str, task: Net, trainer: Trainer, key: str, marker: str) -> None:
    """Rewrite the directory's DCP files (tandem.pt stays) with the payload as the non-tensor item `key`."""
    tensors, _ = dir_payload(ShardedCheckpointIO().collect(task, trainer.optimizers))
    tensors[key] = _Payload(marker)
    for f in glob.glob(os.path.join(path, "*.distcp")) + [os.path.join(path, ".metadata")]:
        os.remove(f)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save(tensors, checkpoint_id=path, no_dist=True)


ITEMS = {"load_from_checkpoint": "model/net.0._extra", "fit": OPT_ITEM}


def test_torchs_planner_runs_a_crafted_item(saved, tmp_path):
    """The control: dcp.load with torch's default planner does run the payload."""
    path, task, trainer = saved
    marker = str(tmp_path / "PWNED")
    _craft_item(path, task, trainer, OPT_ITEM, marker)
    dcp.load({OPT_ITEM: None}, checkpoint_id=path, no_dist=True)
    assert os.path.exists(marker)


@pytest.mark.parametrize("how", sorted(LOADERS))
def test_a_crafted_item_is_refused(saved, tmp_path, how):
    path, task, trainer = saved
    marker = str(tmp_path / "PWNED")
    _craft_item(path, task, trainer, ITEMS[how], marker)
    with pytest.raises(CheckpointError) as e:
        LOADERS[how](path, str(tmp_path / "run"))
    _refused(e, marker, f"item {ITEMS[how]!r}")
    assert "add_safe_globals([posix.system])" in str(e.value)


def test_a_data_file_outside_the_directory_is_refused(saved):
    path = saved[0]
    metadata = dcp.FileSystemReader(path).read_metadata()
    info = next(iter(metadata.storage_data.values()))
    info.relative_path = "../../elsewhere.distcp"
    with open(os.path.join(path, ".metadata"), "wb") as f:
        pickle.dump(metadata, f)
    with pytest.raises(CheckpointError, match="outside its checkpoint directory"):
        load(path)


def test_a_missing_data_file_is_a_checkpoint_error(saved, tmp_path):
    """DCP would report it in a BaseException (torch's CheckpointException); Tandem names the file first."""
    path = saved[0]
    for f in glob.glob(os.path.join(path, "*.distcp")):
        os.remove(f)
    for how, loader in LOADERS.items():
        with pytest.raises(CheckpointError, match=r"checkpoint data file '.*\.distcp' does not exist"):
            loader(path, str(tmp_path / how))
