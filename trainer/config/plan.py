"""`tandem plan --config run.yaml`: the memory plan (trainer/plan.py) of what ``tandem fit`` would run."""

from __future__ import annotations

from typing import Any

import torch

from strategies.memory.plan import MemoryPlan, device_bytes
from trainer.plan import plan_memory


def plan_config(sources: Any, overrides: Any = (), steps: int = 2) -> MemoryPlan:
    """The plan of a run config (what ``tandem fit --config ...`` would run): its task, its training data's
    first batch, its strategy, devices, nodes and precision."""
    from trainer import config

    run = config.build(sources, list(overrides), with_task=False)
    cfg = run.config["trainer"]
    with torch.device("meta"):  # the data only: no weights are allocated
        built = config.build_task(run)
    assert built.task is not None
    dm = built.datamodule
    if dm is not None:
        dm.prepare_data()
        dm.setup(stage="fit")
    loader = dm.train_dataloader() if dm is not None else built.task.train_dataloader()
    batch = next(iter(loader))
    options = {k: cfg[k] for k in ("devices", "num_nodes", "precision") if cfg.get(k) is not None}
    plan = plan_memory(
        lambda: config.build_task(run).task,
        batch,
        steps,
        strategy=run.trainer.strategy,
        **options,  # type: ignore[arg-type,return-value]
    )
    plan.device_bytes = device_bytes(run.trainer.strategy.root_device, run.trainer.config.devices)
    return plan
