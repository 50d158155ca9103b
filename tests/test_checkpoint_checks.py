"""Loading checks sizes and kinds before allocating or opening (issue 24): a record that declares more than
the file holds, a sharded directory whose metadata declares more than its data files store, a named pipe
in place of a checkpoint part, and malformed contents are each a CheckpointError naming the file and what
is wrong; torch's own reader allocates what the crafted file declares (the control)."""

from __future__ import annotations

import glob
import json
import os
import subprocess
import sys
import threading
import warnings
from collections.abc import Callable
from typing import Any

import pytest
import torch
from conftest import FAST
from helpers.checkpointing import CountingData, Net, run_fit
from helpers.crafted import declare_size, deflated_bomb, point_item_at, tensor_bytes
from torch.utils.data import DataLoader

from strategies.checkpoint.checks import FORMAT_VERSION
from strategies.checkpoint.io import ShardedCheckpointIO, load
from strategies.checkpoint.plugins import use_form
from tandem_core.errors import CheckpointError
from trainer import Trainer

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DECLARED = 160_000_000  # bytes a crafted record declares (the file declares 1.2 GB; see the report)


@pytest.fixture
def genuine(tmp_path) -> str:
    """A full checkpoint file of a 2-step run (weights, optimizer and scheduler states, loop position)."""
    _, trainer, _ = run_fit(tmp_path / "run", max_steps=2, enable_checkpointing=False)
    path = str(tmp_path / "genuine.ckpt")
    trainer.save_checkpoint(path)
    return path


@pytest.fixture
def sharded(tmp_path) -> str:
    """A directory checkpoint of a 2-step run, as FSDPStrategy writes one (one process here)."""
    trainer = Trainer(max_steps=2, default_root_dir=str(tmp_path), **FAST)
    use_form(trainer.strategy, ShardedCheckpointIO())
    trainer.fit(Net(), DataLoader(CountingData(), batch_size=5))
    path = str(tmp_path / "dir.ckpt")
    trainer.save_checkpoint(path)
    return path


def _resume(path: str, root: Any) -> None:
    Trainer(max_steps=4, default_root_dir=str(root), **FAST).fit(
        Net(), DataLoader(CountingData(), batch_size=5), ckpt_path=path
    )


LOADERS: dict[str, Callable[[str, Any], Any]] = {
    "load": lambda path, root: load(path),
    "load_from_checkpoint": lambda path, root: Net.load_from_checkpoint(path),
    "fit": _resume,
}

_PEAK = """
import json, sys, torch
sys.path[:0] = [{root!r}]
from strategies.checkpoint.io import load
def status(key):  # kB; VmHWM is the peak resident size, VmRSS the current one
    return next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith(key + ":")) * 1024
read = load if {tandem} else lambda p: torch.load(p, weights_only=True)
before = status("VmRSS")  # not the peak so far: imports leave freed memory below it
try:
    read({path!r})
    error = None
except Exception as e:
    error = type(e).__name__ + ": " + str(e)
print(json.dumps({{"error": error, "grew": status("VmHWM") - before}}))
"""


def _peak(path: str, tandem: bool) -> dict[str, Any]:
    """What loading `path` in a fresh process raised, and how far its peak RSS rose above the RSS before."""
    script = _PEAK.format(root=ROOT, path=path, tandem=tandem)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_a_deflated_record_is_refused_before_torch_allocates_what_it_declares(genuine, tmp_path):
    path = str(tmp_path / "bomb.ckpt")
    with open(genuine, "rb") as f:
        blob = deflated_bomb(f.read(), DECLARED)
    with open(path, "wb") as f:
        f.write(blob)
    assert len(blob) < DECLARED / 500  # a small file
    ours, control = _peak(path, tandem=True), _peak(path, tandem=False)
    assert ours["error"].startswith(f"CheckpointError: checkpoint {path!r}: record 'archive/data/0' is compr")
    assert "declaring 160000000 bytes" in ours["error"]
    assert ours["grew"] < 64 << 20, ours  # refused before anything was allocated (the rest: the read's own)
    assert control["grew"] >= DECLARED * 0.9, control  # torch's reader allocates the declared size


@pytest.mark.parametrize("how", sorted(LOADERS))
def test_a_sharded_directory_declaring_more_than_it_stores_is_refused(sharded, tmp_path, how):
    declare_size(
        sharded, "model/net.0.weight", 75_000_000
    )  # (75e6, 4): 1.2 GB of float32 in under 128 KB of files
    assert sum(os.path.getsize(f) for f in glob.glob(os.path.join(sharded, "*"))) < 128 << 10
    with pytest.raises(
        CheckpointError, match=r"tensor 'model/net.0.weight' declares a chunk of 1200000000 byt"
    ):
        LOADERS[how](sharded, tmp_path / "run")


@pytest.mark.parametrize("how", sorted(LOADERS))
def test_a_deflated_record_inside_a_sharded_directory_is_refused(sharded, tmp_path, how):
    point_item_at(sharded, "model/net.0.weight", deflated_bomb(tensor_bytes(torch.zeros(8, 4)), DECLARED))
    with pytest.raises(CheckpointError, match=r"crafted.distcp'.*is compressed, declaring 160000000 bytes"):
        LOADERS[how](sharded, tmp_path / "run")


def _in_time(fn: Callable[[], Any], seconds: float = 60) -> BaseException | None:
    """Run `fn` in a thread; what it raised (None: it returned). Fails if it has not ended in `seconds`."""
    box: list[BaseException | None] = [None]

    def target() -> None:
        try:
            fn()
        except BaseException as e:  # noqa: BLE001 (handed back to the test)
            box[0] = e

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), "the loader blocked on the named pipe"
    return box[0]


@pytest.mark.parametrize("part", [".metadata", "tandem.pt", "data"])
@pytest.mark.parametrize("how", sorted(LOADERS))
def test_a_named_pipe_in_a_sharded_directory_is_refused_not_waited_on(sharded, tmp_path, part, how):
    name = sorted(glob.glob(os.path.join(sharded, "*.distcp")))[0] if part == "data" else part
    pipe = os.path.join(sharded, name)
    os.remove(pipe)
    os.mkfifo(pipe)
    error = _in_time(lambda: LOADERS[how](sharded, tmp_path / "run"))
    assert isinstance(error, CheckpointError), error
    assert f"{pipe!r} is a named pipe, not a regular file" in str(error)


@pytest.mark.parametrize("how", sorted(LOADERS))
def test_a_named_pipe_as_the_checkpoint_file_is_refused_not_waited_on(tmp_path, how):
    pipe = str(tmp_path / "last.ckpt")
    os.mkfifo(pipe)
    error = _in_time(lambda: LOADERS[how](pipe, tmp_path / "run"))
    assert isinstance(error, CheckpointError) and "is a named pipe, not a regular file" in str(error), error


def _edit(ckpt: dict[str, Any], change: str) -> None:
    if change == "other format version":
        ckpt["tandem_version"] = FORMAT_VERSION + 1
    elif change == "no format version":
        del ckpt["tandem_version"]
    elif change == "non-tensor weight":
        ckpt["state_dict"]["net.0.weight"] = "weights"
    elif change == "no optimizer states":
        del ckpt["optimizer_states"]
    elif change == "non-numeric epoch":
        ckpt["epoch"] = "three"


MALFORMED = {
    "other format version": f"has format version {FORMAT_VERSION + 1}, and this Tandem reads version {FORMAT_VERSION}",
    "no format version": "has no 'tandem_version'",
    "non-tensor weight": "has the weight 'net.0.weight' = str, not a tensor",
    "no optimizer states": "is a full checkpoint (it has each rank's loop state) without 'optimizer_states'",
    "non-numeric epoch": "has 'epoch' = 'three', not a whole number >= 0",
}


@pytest.mark.parametrize("how", sorted(LOADERS))
@pytest.mark.parametrize("change", sorted(MALFORMED))
def test_a_malformed_checkpoint_is_an_error_naming_the_file_and_the_problem(genuine, tmp_path, change, how):
    ckpt = torch.load(genuine, weights_only=True)
    _edit(ckpt, change)
    path = str(tmp_path / "malformed.ckpt")
    torch.save(ckpt, path)
    with pytest.raises(CheckpointError) as e:
        LOADERS[how](path, tmp_path / "run")
    assert str(e.value).startswith(f"checkpoint {path!r} {MALFORMED[change]}"), str(e.value)


def test_a_directory_of_another_format_version_is_refused(sharded, tmp_path):
    meta = os.path.join(sharded, "tandem.pt")
    part = torch.load(meta, weights_only=True)
    part["tandem_version"] = 1
    with warnings.catch_warnings():
        torch.save(part, meta)
    for how, loader in LOADERS.items():
        with pytest.raises(
            CheckpointError, match=rf"checkpoint '{sharded}' has format version 1, and this Tan"
        ):
            loader(sharded, tmp_path / how)
