"""FaultTolerance: the option that makes a ddp or fsdp job one replica group of a job that keeps training
through failures (in-place recovery on torchft). Its values, checked, and what the environment fills in."""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass, fields
from typing import Any
from urllib.parse import urlsplit

from tandem_core.errors import ConfigError

GROUP_ENV, GROUPS_ENV, LIGHTHOUSE_ENV = "TANDEM_REPLICA_GROUP", "TANDEM_REPLICA_GROUPS", "TORCHFT_LIGHTHOUSE"
EXTRA = "fault-tolerance"  # pip install 'tandem-trainer[fault-tolerance]'


@dataclass
class FaultTolerance:
    """Keep training when a replica group fails: the others go on without restarting, and the failed group,
    restarted by its launcher, takes the live state from a peer and trains in lockstep again.

    Example::

        ft = FaultTolerance(replica_groups=2, min_replicas=1, lighthouse="http://10.0.0.1:29510")
        Trainer(strategy=DDPStrategy(fault_tolerance=ft), devices=8).fit(task)

    Each replica group is one launcher job (a torchrun per node, say) of `devices` processes; gradients are
    averaged inside it as usual, then across the live groups through torchft's manager. `replica_group`
    (this group's index, 0..replica_groups-1) defaults to the TANDEM_REPLICA_GROUP variable, `replica_groups`
    to TANDEM_REPLICA_GROUPS (under SLURM, without them: SLURM_NODEID and SLURM_NNODES, a group per node),
    `lighthouse` to TORCHFT_LIGHTHOUSE. `address` is where this group's manager and
    store listen and what peers reach it by; by default the local address of the route to the lighthouse.
    A step waits at most `quorum_timeout_s` for `min_replicas` groups, then fails with the reason;
    `timeout_s` bounds a collective across groups and the state transfer to a rejoining group;
    `max_uncommitted_steps` consecutive steps that no group could commit end the run.
    """

    replica_groups: int | None = None
    min_replicas: int = 1
    replica_group: int | None = None
    lighthouse: str | None = None
    address: str | None = None
    timeout_s: float = 60.0
    quorum_timeout_s: float = 60.0
    connect_timeout_s: float = 30.0
    max_uncommitted_steps: int = 20

    def __post_init__(self) -> None:
        for name in ("replica_groups", "replica_group"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
                raise ConfigError(
                    f"FaultTolerance({name}={value!r}): pass a non-negative int (or leave it unset)"
                )
        if self.replica_groups is not None and self.replica_groups < 1:
            raise ConfigError("FaultTolerance(replica_groups=0): a job has at least one replica group")
        if (
            isinstance(self.min_replicas, bool)
            or not isinstance(self.min_replicas, int)
            or self.min_replicas < 1
        ):
            raise ConfigError(f"FaultTolerance(min_replicas={self.min_replicas!r}): pass an int >= 1")
        for name in ("timeout_s", "quorum_timeout_s", "connect_timeout_s"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
                raise ConfigError(f"FaultTolerance({name}={value!r}): pass a positive number of seconds")
        steps = self.max_uncommitted_steps
        if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
            raise ConfigError(f"FaultTolerance(max_uncommitted_steps={steps!r}): pass an int >= 1")
        if self.lighthouse is not None:
            lighthouse_host_port(self.lighthouse)

    @classmethod
    def of(cls, value: FaultTolerance | dict[str, Any] | None) -> FaultTolerance | None:
        """`value` as given to a strategy: an instance, a config mapping of its fields, or None (off)."""
        if value is None or isinstance(value, FaultTolerance):
            return value
        if isinstance(value, dict):
            known = {f.name for f in fields(cls)}
            unknown = sorted(set(value) - known)
            if unknown:
                raise ConfigError(
                    f"fault_tolerance: unknown key(s) {unknown}; FaultTolerance takes {sorted(known)}"
                )
            return cls(**value)
        raise ConfigError(
            f"fault_tolerance={value!r}: pass FaultTolerance(...), a mapping of its fields, or None"
        )

    def resolved(self) -> Resolved:
        """The values with the environment's filled in; a ConfigError says which one is missing."""
        groups = (
            self.replica_groups if self.replica_groups is not None else _env_int(GROUPS_ENV, "replica_groups")
        )
        group = self.replica_group if self.replica_group is not None else _env_int(GROUP_ENV, "replica_group")
        if group >= groups:
            raise ConfigError(
                f"replica group {group} does not exist in a job of replica_groups={groups}: number the groups "
                f"0..{groups - 1} ({GROUP_ENV})"
            )
        if self.min_replicas > groups:
            raise ConfigError(
                f"FaultTolerance(min_replicas={self.min_replicas}) exceeds replica_groups={groups}: no quorum "
                "could ever form; lower min_replicas"
            )
        url = self.lighthouse or os.environ.get(LIGHTHOUSE_ENV)
        if not url:
            raise ConfigError(
                f"fault tolerance needs the lighthouse's address: FaultTolerance(lighthouse='http://HOST:PORT') or "
                f"{LIGHTHOUSE_ENV}; start one with `tandem lighthouse --bind HOST:PORT --min-replicas N` "
                "(docs/fault-tolerance.md)"
            )
        host, port = lighthouse_host_port(url)
        address = self.address or route_address(host, port)
        return Resolved(self, groups, group, url, host, port, address)


@dataclass(frozen=True)
class Resolved:
    """A FaultTolerance with every value known (see FaultTolerance.resolved)."""

    options: FaultTolerance
    replica_groups: int
    replica_group: int
    lighthouse: str
    lighthouse_host: str
    lighthouse_port: int
    address: str

    @property
    def replica_id(self) -> str:
        """torchft's name for this group: it must end in digits (torchft numbers ranks from them)."""
        return f"tandem_group_{self.replica_group}"


def lighthouse_host_port(url: str) -> tuple[str, int]:
    """('10.0.0.1', 29510) from 'http://10.0.0.1:29510'; a ConfigError for anything else."""
    try:
        parts = urlsplit(url if "://" in url else f"http://{url}")
        host, port = parts.hostname, parts.port
    except ValueError:
        host = port = None
    if not host or not port or parts.scheme != "http" or parts.path not in ("", "/"):
        raise ConfigError(f"lighthouse address {url!r} is not of the form http://HOST:PORT")
    return host, port


def route_address(host: str, port: int) -> str:
    """This machine's address on the route to `host` (a UDP connect sends no packet; it only picks the route)."""
    try:
        with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((host, port))
            return s.getsockname()[0]
    except OSError as e:
        raise ConfigError(
            f"no route from this machine to the lighthouse host {host!r} ({e}); set FaultTolerance(address=...) "
            "to the address other replica groups reach this one by"
        ) from None


#: under SLURM, one replica group per node by default (a torchrun per node inside the allocation)
_SLURM = {GROUP_ENV: "SLURM_NODEID", GROUPS_ENV: "SLURM_NNODES"}


def _env_int(var: str, name: str) -> int:
    value = os.environ.get(var)
    if value is None and os.environ.get("SLURM_JOB_ID") and _SLURM[var] in os.environ:
        value = os.environ[_SLURM[var]]
    if value is None or not value.strip().isdigit():
        shown = "unset" if value is None else repr(value)
        raise ConfigError(
            f"fault tolerance needs {name}: pass FaultTolerance({name}=...) or set {var} (it is {shown}) in each "
            "replica group's environment"
        )
    return int(value)
