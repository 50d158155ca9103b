"""Run the port tests against PyTorch Lightning itself, to check that the hand-written references implement
Lightning's semantics: ``python -m tests.ports.lightning_check [pytest arguments]``.

It copies tests/ports and tests/conftest.py into a temporary directory, turns each Tandem import line back into
Lightning's (``from trainer import Task`` becomes ``from pytorch_lightning import LightningModule as Task``,
and so on), and runs pytest there with the Tandem checkout off the path. Needs ``pip install
pytorch-lightning`` (not a Tandem dependency; the suite itself never imports it). The tests that exercise
behaviour Lightning lacks are deselected (see DESELECT).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
TESTS = os.path.dirname(HERE)
ROOT = os.path.dirname(TESTS)

#: tests that check Tandem's own choices where Lightning differs, with the reason
DESELECT = {
    "test_imagenet_port_on_two_processes": "torch.nn.SyncBatchNorm refuses CPU tensors: Lightning cannot run it on gloo",
    "each[imagenet]": "the same: sync_batchnorm=True on CPU processes",
    "test_skipping_batches_on_two_processes": "Lightning refuses a None training_step under DDP on one rank only",
    "test_a_resumed_run_appends_to_its_metrics_file": "Lightning 2.6's CSVLogger rewrites metrics.csv of a version "
    "directory it reuses with the new rows only (it warns); Tandem keeps the earlier rows",
    "test_resume_after_the_first_milestone_is_bit_identical": "Lightning 2.6.6's BaseFinetuning leaves the layers "
    "it unfroze frozen after a resume (setup freezes them again; the restored groups do not unfreeze them)",
}

_MODULE_NAMES = {"Task": "LightningModule as Task", "DataModule": "LightningDataModule as DataModule"}


def _trainer_line(names: str) -> str:
    wanted = [n.strip() for n in names.split(",")]
    main = [_MODULE_NAMES.get(n, n) for n in wanted if n not in ("rank_zero_only", "Tuner")]
    lines = [f"from pytorch_lightning import {', '.join(main)}"] if main else []
    if "rank_zero_only" in wanted:
        lines.append("from pytorch_lightning.utilities import rank_zero_only")
    if "Tuner" in wanted:
        lines.append("from pytorch_lightning.tuner import Tuner")
    return "\n".join(lines)


RULES: list[tuple[str, object]] = [
    (r"^from trainer import (.*)$", lambda m: _trainer_line(m.group(1))),
    (r"^from callbacks import (.*)$", r"from pytorch_lightning.callbacks import \1"),
    (r"^from trainer\.loggers import (.*)$", r"from pytorch_lightning.loggers import \1"),
    (r"^from strategies import (.*)$", r"from pytorch_lightning.strategies import \1"),
    (r"^from trainer\.errors import TandemError$", "TandemError = RuntimeError"),
    (
        r"^from trainer\.errors import TaskError$",
        "from pytorch_lightning.utilities.exceptions import MisconfigurationException\n"
        "TaskError = (NotImplementedError, MisconfigurationException)",
    ),
]


def convert(text: str) -> str:
    """The same source with Tandem's import lines replaced by Lightning's."""
    for pattern, replacement in RULES:
        text = re.sub(pattern, replacement, text, flags=re.M)  # type: ignore[arg-type]
    return text


def main(argv: list[str]) -> int:
    with tempfile.TemporaryDirectory() as tmp:
        os.makedirs(os.path.join(tmp, "tests", "ports"))
        shutil.copy(os.path.join(TESTS, "conftest.py"), os.path.join(tmp, "tests", "conftest.py"))
        for name in os.listdir(HERE):
            if name.endswith(".py"):
                with open(os.path.join(HERE, name)) as f:
                    text = convert(f.read())
                with open(os.path.join(tmp, "tests", "ports", name), "w") as f:
                    f.write(text)
        # the Tandem checkout stays off the path: `trainer`, `callbacks` and `strategies` must not resolve
        paths = [
            p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and os.path.abspath(p) != ROOT
        ]
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([tmp, *paths]))
        env.setdefault("TANDEM_HOOK_GOLDENS", os.path.join(HERE, "hook_order"))  # the recorded sequences
        keep = " and ".join(f"not {key}" for key in DESELECT)
        cmd = [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "no:cacheprovider",
            "-W",
            "ignore",
            "tests/ports",
            "-k",
            keep,
        ]
        return subprocess.call([*cmd, *argv], cwd=tmp, env=env)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
