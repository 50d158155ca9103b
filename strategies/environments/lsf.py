"""LSFEnvironment: processes started by IBM Spectrum LSF's job step manager (``jsrun``), Lightning's class of
the same name. jsrun gives each process JSM_NAMESPACE_RANK / _LOCAL_RANK / _SIZE; the hosts of the job are
the lines of the file LSB_DJOB_RANKFILE names (its first line is the launch node, which runs no rank)."""

from __future__ import annotations

import logging
import os
import socket

from strategies.environments.base import ClusterEnvironment
from tandem_core.errors import ConfigError

log = logging.getLogger(__name__)
_DETECT = ("LSB_JOBID", "LSB_DJOB_RANKFILE", "JSM_NAMESPACE_LOCAL_RANK", "JSM_NAMESPACE_SIZE")


class LSFEnvironment(ClusterEnvironment):
    """Built inside a jsrun step: reads the job's hosts once (the main address is the first compute host, the
    port MASTER_PORT or one derived from LSB_JOBID, so that every rank computes the same)."""

    def __init__(self) -> None:
        hosts = self._hosts()
        self._main_address = hosts[0]
        self._main_port = self._port()
        order: dict[str, int] = {}
        for host in hosts:
            order.setdefault(host, len(order))
        here = socket.gethostname()
        if here not in order:
            raise ConfigError(
                f"LSFEnvironment: this host {here!r} is not among the job's hosts in LSB_DJOB_RANKFILE"
            )
        self._node_rank = order[here]

    @staticmethod
    def _hosts() -> list[str]:
        path = os.environ.get("LSB_DJOB_RANKFILE")
        if not path:
            raise ConfigError(
                "LSFEnvironment needs LSB_DJOB_RANKFILE (set by LSF in a job); start the script with jsrun"
            )
        with open(path) as f:
            hosts = [line.strip() for line in f if line.strip()]
        if len(hosts) < 2:
            raise ConfigError(f"LSFEnvironment: {path} lists no compute host after the launch node")
        return hosts[1:]  # the first line is the launch node

    @staticmethod
    def _port() -> int:
        if "MASTER_PORT" in os.environ:
            return int(os.environ["MASTER_PORT"])
        job = os.environ.get("LSB_JOBID")
        if job is None or not job.isdigit():
            raise ConfigError("LSFEnvironment needs LSB_JOBID (a job number) or MASTER_PORT to pick the port")
        return 10000 + int(job) % 1000

    @property
    def creates_processes_externally(self) -> bool:
        return True

    @property
    def main_address(self) -> str:
        return self._main_address

    @property
    def main_port(self) -> int:
        return self._main_port

    @staticmethod
    def detect() -> bool:
        """True in a jsrun step (LSB_JOBID, LSB_DJOB_RANKFILE, JSM_NAMESPACE_LOCAL_RANK and _SIZE set)."""
        return all(v in os.environ for v in _DETECT)

    def world_size(self) -> int:
        return _jsm("JSM_NAMESPACE_SIZE")

    def set_world_size(self, size: int) -> None:
        log.debug("LSFEnvironment takes the world size from jsrun; %s ignored", size)

    def global_rank(self) -> int:
        return _jsm("JSM_NAMESPACE_RANK")

    def set_global_rank(self, rank: int) -> None:
        log.debug("LSFEnvironment takes the rank from jsrun; %s ignored", rank)

    def local_rank(self) -> int:
        return _jsm("JSM_NAMESPACE_LOCAL_RANK")

    def node_rank(self) -> int:
        return self._node_rank


def _jsm(var: str) -> int:
    value = os.environ.get(var)
    if value is None:
        raise ConfigError(f"LSFEnvironment: {var} is not set; start the script with jsrun")
    return int(value)
