"""When ModelCheckpoint writes last.ckpt, against Lightning 2.6: the lists below are what Lightning writes
in tests/scripts/last_ckpt_runs.py (checked by the slow test, which runs that script under Lightning)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "scripts"))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "ports"))

import last_ckpt_runs  # noqa: E402

#: the checkpoints Lightning 2.6.6 writes, with the global step of each, in order
LIGHTNING = {
    # last.ckpt only where a top-1 file was saved (epochs 0, 1, 3); never at the end of training
    "top1_monitor": [("epoch=0-step=4", 4), ("last", 4), ("epoch=1-step=8", 8), ("last", 8)]
    + [("epoch=3-step=16", 16), ("last", 16)],
    # step-triggered saves write last.ckpt every time; no epoch-end saves
    "every_3_steps": [
        w for s in (3, 6, 9, 12, 15, 18) for w in ((f"epoch={(s - 1) // 4}-step={s}", s), ("last", s))
    ],
    # nothing saved during fit: last.ckpt once, at the end of training
    "top0": [("last", 20)],
    # save_last="link": last.ckpt is a link to the newest top-k file, never a copy
    "link": [("epoch=0-step=4", 4), ("epoch=1-step=8", 8), ("epoch=3-step=16", 16)],
    # max_steps=6 in the second epoch: its on_train_epoch_end saves at step 6
    "max_steps_mid_epoch": [("epoch=0-step=4", 4), ("last", 4), ("epoch=1-step=6", 6), ("last", 6)],
}
LINK = {"link": "epoch=3-step=16.ckpt"}


def expected(name: str) -> dict[str, object]:
    writes = [[f"{stem}.ckpt", step] for stem, step in LIGHTNING[name]]
    lasts = [step for stem, step in LIGHTNING[name] if stem == "last"]
    last_step = lasts[-1] if lasts else int(LINK[name].split("step=")[1].split(".")[0])
    return {"writes": writes, "link": LINK.get(name), "last_step": last_step}


@pytest.mark.parametrize(
    "name",
    [
        "top1_monitor",
        "every_3_steps",
        "top0",
        "link",
        "max_steps_mid_epoch",
    ],
)
def test_last_ckpt_is_written_when_lightning_writes_it(tmp_path, name):
    assert last_ckpt_runs.run(name, str(tmp_path)) == expected(name)


def test_test_ckpt_last_loads_the_last_top_k_weights(tmp_path):
    """test(ckpt_path="last") after fit tests the weights of the step Lightning's last.ckpt holds (16, not 20)."""
    import torch

    from callbacks import ModelCheckpoint
    from trainer import Trainer

    cb = ModelCheckpoint(dirpath=str(tmp_path), monitor="val_score", save_last=True)
    trainer = Trainer(
        max_epochs=5, callbacks=[cb], logger=False, enable_progress_bar=False, accelerator="cpu"
    )
    task = last_ckpt_runs.Scored()
    trainer.fit(task, last_ckpt_runs.data(8), last_ckpt_runs.data(2))
    saved = torch.load(os.path.join(str(tmp_path), "last.ckpt"), weights_only=False)
    final = task.net.weight.detach().sum().item()
    (result,) = trainer.test(task, last_ckpt_runs.data(2), ckpt_path="last", verbose=False)
    assert saved["global_step"] == 16
    assert result["weights_sum"] == pytest.approx(saved["state_dict"]["net.weight"].sum().item())
    assert result["weights_sum"] != pytest.approx(final)  # not the weights of the end of training


@pytest.mark.slow
def test_the_lists_are_lightnings(tmp_path):
    """Run the same script under Lightning itself (its imports rewritten) and compare."""
    pytest.importorskip("pytorch_lightning", reason="the oracle: pip install pytorch-lightning==2.6.6")
    from lightning_check import convert

    script = tmp_path / "runs.py"
    with open(last_ckpt_runs.__file__) as f:
        script.write_text(convert(f.read()))
    out = subprocess.run(
        [sys.executable, "-W", "ignore", str(script), str(tmp_path / "out")],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=str(tmp_path),
        env=dict(os.environ, PYTHONPATH=""),  # Tandem's packages off the path
    )
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.split("RESULT ", 1)[1])
    assert result == {name: expected(name) for name in LIGHTNING}
