"""docs/porting.md's table of every Trainer option value, strategy name and logger is the one the code gives."""

from __future__ import annotations

from trainer import porting


def test_the_documented_table_is_the_generated_one():
    assert porting.documented() == porting.table(), (
        "docs/porting.md is out of date: run `python -m trainer.porting --write`"
    )


def test_the_table_records_refusals_with_their_messages():
    text = porting.table()
    assert (
        "| `deepspeed` | refused | strategy='deepspeed': DeepSpeed is not part of Tandem; use strategy='fsdp'"
        in text
    )
    assert "| `fsdp_cpu_offload` | alias | FSDPStrategy(cpu_offload=True) |" in text
    assert "| `single_device` | alias | SingleDeviceStrategy() |" in text
    assert "| `TensorBoardLogger` | Y |" in text and "| `CSVLogger` | Y |" in text
