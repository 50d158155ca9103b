"""One script under Lightning and under Tandem: a Trainer of either with the same quiet defaults (no logger, bar,
summary or checkpoints; Lightning told the CPU, which Tandem picks by itself)."""

from __future__ import annotations

from typing import Any

QUIET = dict(logger=False, enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False)


def pair_trainer(lightning: bool, tmp_path: Any, **kwargs: Any) -> Any:
    """Lightning's Trainer when `lightning`, else Tandem's, under `tmp_path/<lightning>`; `kwargs` override QUIET."""
    if lightning:
        import pytorch_lightning as pl

        return pl.Trainer(default_root_dir=tmp_path / "True", **{**QUIET, "accelerator": "cpu", **kwargs})
    from trainer import Trainer

    return Trainer(default_root_dir=tmp_path / "False", **{**QUIET, **kwargs})
