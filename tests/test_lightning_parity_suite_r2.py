"""Public behaviour found by Lightning's whole CPU suite in issue 43's second round, each compared with Lightning
itself on the same script (or, for a deliberate difference of docs/porting.md, showing both sides)."""

from __future__ import annotations

from typing import Any

import pytest
from helpers.lightning_pair import pair_trainer as _trainer

pl = pytest.importorskip("pytorch_lightning")
from pytorch_lightning.demos import boring_classes as plb  # noqa: E402

from trainer import demos  # noqa: E402


def _interrupted_fit(lightning: bool, tmp_path: Any) -> tuple[type, bool, str, str, list[str]]:
    """trainer/test_states.py::test_interrupt_state_on_keyboard_interrupt's script: a KeyboardInterrupt raised by
    a callback at the first training batch."""
    Callback = pl.Callback if lightning else __import__("callbacks").Callback
    seen: list[str] = []

    class Interrupt(Callback):  # type: ignore[misc,valid-type]
        def on_train_batch_start(self, *args: Any) -> None:
            raise KeyboardInterrupt

        def on_exception(self, trainer: Any, task: Any, exception: BaseException) -> None:
            seen.append(type(exception).__name__)

    trainer = _trainer(lightning, tmp_path, max_steps=1, callbacks=[Interrupt()])
    task = (plb.BoringModel if lightning else demos.BoringModel)()
    with pytest.raises(BaseException) as raised:
        trainer.fit(task)
    return (
        raised.type,
        trainer.interrupted,
        str(trainer.state.status.value),
        str(trainer.state.fn.value),
        seen,
    )


def test_a_keyboard_interrupt_in_fit_reaches_the_caller_where_lightning_exits(tmp_path):
    """Deliberate difference (docs/porting.md): the state and the hooks are Lightning's; Lightning then turns the
    KeyboardInterrupt into sys.exit(1), Tandem lets the KeyboardInterrupt itself reach the caller."""
    import signal

    before = signal.getsignal(signal.SIGINT)
    ours = _interrupted_fit(False, tmp_path)
    assert signal.getsignal(signal.SIGINT) is before
    theirs = _interrupted_fit(True, tmp_path)
    signal.signal(signal.SIGINT, before)  # Lightning leaves SIGINT ignored in the process
    assert theirs[0] is SystemExit and ours[0] is KeyboardInterrupt
    assert ours[1:] == theirs[1:] == (True, "interrupted", "fit", ["KeyboardInterrupt"])


def test_ddp_takes_an_accelerator_object_with_its_parallel_devices_as_lightning():
    """utilities/test_all_gather_grad.py's spawn_launch: DDPStrategy(accelerator=CPUAccelerator(),
    parallel_devices=[cpu] * 3) is one CPU process per device in Lightning; Tandem refused the object as another
    device type. A mismatched accelerator stays an error."""
    import torch

    from strategies import DDPStrategy
    from strategies.accelerators import CPUAccelerator
    from trainer.errors import ConfigError

    devices = [torch.device("cpu")] * 3
    theirs = pl.strategies.DDPStrategy(accelerator=pl.accelerators.CPUAccelerator(), parallel_devices=devices)
    ours = DDPStrategy(accelerator=CPUAccelerator(), parallel_devices=devices)
    assert list(ours.parallel_devices) == list(theirs.parallel_devices) == devices
    assert ours.devices == theirs.num_processes == 3
    with pytest.raises(ConfigError, match="choose one device type"):
        DDPStrategy(accelerator="cuda", parallel_devices=devices)
