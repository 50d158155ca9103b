"""A user's script under strategy="ddp", devices=2 with WandbLogger (offline) and MLFlowLogger (file store):
`python tracker_ddp.py SAVE_DIR`. Tandem re-runs it once per process; rank 0 writes SAVE_DIR/ids.json."""

from __future__ import annotations

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from tests.helpers.trackers import QUIET, Small, loaders  # noqa: E402
from trainer import Trainer  # noqa: E402
from trainer.loggers import CSVLogger, MLFlowLogger, WandbLogger  # noqa: E402


def main() -> None:
    save_dir = sys.argv[1]
    wl = WandbLogger(project="ddp", save_dir=save_dir)
    ml = MLFlowLogger("ddp", save_dir=os.path.join(save_dir, "mlruns"))
    csv_logger = CSVLogger(save_dir, name="csv")
    trainer = Trainer(
        strategy="ddp", accelerator="cpu", devices=2, max_epochs=2, logger=[wl, ml, csv_logger], **QUIET
    )
    trainer.fit(Small(), *loaders())
    if trainer.is_global_zero:
        ids = {"wandb": wl.version, "mlflow": ml.run_id, "csv": csv_logger.metrics_file}
        with open(os.path.join(save_dir, "ids.json"), "w") as f:
            json.dump({**ids, "world_size": trainer.world_size}, f)


if __name__ == "__main__":
    main()
