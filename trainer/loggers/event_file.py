"""TensorBoard event files written in the training thread, each event handed to the OS as it is added.

torch's SummaryWriter hands events to tensorboard's writer thread, which opens and closes the event file for
every record (tensorboard's local file system appends that way) and computes its checksums in Python. Each of
those system calls releases the GIL, and the training thread, which releases it in backward, must win it back:
inside a fit that cost about 370 µs of CPU per event (7 µs per step at log_every_n_steps=50), against about
40 µs written here (benchmarks/tensorboard_events.py). A record reaches the OS (the page cache) at once, as
with tensorboard's writer, so a killed run keeps every event it added.

`SummaryWriter` is torch's, with this file behind its FileWriter: `experiment.add_image` and the rest work
unchanged; `flush_secs` and `max_queue` have nothing left to bound (every event is written through).
"""

from __future__ import annotations

import itertools
import os
import socket
import time
from typing import Any

from tensorboard.compat.proto.event_pb2 import Event, SessionLog, SourceMetadata
from tensorboard.summary.writer.record_writer import RecordWriter
from torch.utils.tensorboard.writer import FileWriter
from torch.utils.tensorboard.writer import SummaryWriter as _TorchSummaryWriter

_files = itertools.count()  # tells apart the event files one process opens within a second


class EventFile:
    """One new event file in `log_dir` (never an existing one), framed and checksummed by tensorboard's
    RecordWriter; the interface of tensorboard's EventFileWriter that torch's FileWriter uses."""

    def __init__(self, log_dir: str, filename_suffix: str = "") -> None:
        os.makedirs(log_dir, exist_ok=True)
        self._log_dir = log_dir
        stamp = f"events.out.tfevents.{int(time.time()):010d}.{socket.gethostname()}.{os.getpid()}"
        while True:  # "x": a name another writer took is skipped, its file never truncated
            self.path = os.path.join(log_dir, f"{stamp}.s{next(_files)}{filename_suffix}")
            try:
                self._file = open(self.path, "xb")  # noqa: SIM115 (open until close())
                break
            except FileExistsError:
                continue
        self._records = RecordWriter(self._file)
        writer = SourceMetadata(writer="tandem")
        self.add_event(Event(wall_time=time.time(), file_version="brain.Event:2", source_metadata=writer))

    def get_logdir(self) -> str:
        return self._log_dir

    def add_event(self, event: Any) -> None:
        """Append `event` and hand it to the OS (one write system call)."""
        self._records.write(event.SerializeToString())
        self._file.flush()

    def flush(self) -> None:
        self._file.flush()

    def reopen(self) -> None:
        """Nothing to do: the file stays open until close()."""

    def close(self) -> None:
        if not self._file.closed:
            self._file.close()


class _FileWriter(FileWriter):
    """torch's FileWriter (it stamps each event's step and wall time) in front of an EventFile."""

    def __init__(self, log_dir: str, filename_suffix: str = "") -> None:  # no super(): it starts a thread
        self.event_writer = EventFile(str(log_dir), filename_suffix)


class SummaryWriter(_TorchSummaryWriter):
    """torch's SummaryWriter writing through an EventFile; `purge_step` marks the new file as torch's does
    (TensorBoard then hides what earlier files logged at that step or later)."""

    def _get_file_writer(self) -> FileWriter:
        if self.all_writers is None or self.file_writer is None:
            self.file_writer = _FileWriter(self.log_dir, self.filename_suffix)
            self.all_writers = {self.file_writer.get_logdir(): self.file_writer}
            if self.purge_step is not None:
                step, self.purge_step = self.purge_step, None
                self.file_writer.add_event(Event(step=step, file_version="brain.Event:2"))
                self.file_writer.add_event(Event(step=step, session_log=SessionLog(status=SessionLog.START)))
        return self.file_writer  # type: ignore[return-value]
