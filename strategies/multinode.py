"""Multi-node launches: detect one, pick the network interface gloo must bind, name this node to its peers."""

from __future__ import annotations

import fcntl
import ipaddress
import os
import socket
import struct

from tandem_core.errors import DistributedError

_SIOCGIFADDR = 0x8915  # Linux ioctl: an interface's IPv4 address


def is_multinode() -> bool:
    """True when this job's ranks span more than one node (WORLD_SIZE > LOCAL_WORLD_SIZE, or SLURM_NNODES > 1)."""
    world, local = int(os.environ.get("WORLD_SIZE", 1)), os.environ.get("LOCAL_WORLD_SIZE")
    if local is None:  # srun sets no LOCAL_WORLD_SIZE
        return int(os.environ.get("SLURM_NNODES", "1")) > 1
    return world > int(local)


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(socket.gethostbyname(host)).is_loopback
    except (OSError, ValueError):
        return False


def route_ip(host: str, port: int = 9) -> str:
    """This machine's IPv4 address on the route to `host` (a UDP connect() only picks a route: no packet)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect((host, port))
        return s.getsockname()[0]


def interface_of(ip: str) -> str | None:
    """The name of the interface holding IPv4 address `ip`, None if none does."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for _, name in socket.if_nameindex():
            try:
                raw = fcntl.ioctl(s.fileno(), _SIOCGIFADDR, struct.pack("256s", name.encode()[:15]))
            except OSError:
                continue  # no IPv4 address on this interface
            if socket.inet_ntoa(raw[20:24]) == ip:
                return name
    return None


def bind_gloo_interface() -> str | None:
    """For a multi-node gloo group, make sure gloo does not bind a loopback address; the interface set, if any.

    gloo binds the address the host name resolves to; where that is 127.0.0.1 (a common /etc/hosts entry)
    remote peers cannot reach this rank. Then GLOO_SOCKET_IFNAME is set to the interface whose address
    routes to MASTER_ADDR.
    """
    if not is_multinode() or os.environ.get("GLOO_SOCKET_IFNAME"):
        return None
    master = os.environ.get("MASTER_ADDR", "127.0.0.1")
    if _is_loopback(master):
        raise DistributedError(
            f"this job spans several nodes (WORLD_SIZE={os.environ.get('WORLD_SIZE')}, LOCAL_WORLD_SIZE="
            f"{os.environ.get('LOCAL_WORLD_SIZE')}) but MASTER_ADDR={master!r} is a loopback address, which "
            "other nodes cannot reach: pass torchrun --local-addr=<this node's address> (torch took the host "
            "name, which resolves to loopback here) or set MASTER_ADDR to an address every node can reach."
        )
    if not _is_loopback(socket.gethostname()):
        return None  # gloo binds the host name's address, which is not loopback: leave it
    try:
        ip = route_ip(master)
    except OSError as e:
        raise DistributedError(f"this node has no route to MASTER_ADDR={master!r} ({e})") from e
    name = interface_of(ip)
    if name is None or ipaddress.ip_address(ip).is_loopback:
        raise DistributedError(
            f"the host name {socket.gethostname()!r} resolves to a loopback address, so gloo would bind it "
            f"and other nodes could not connect, and no interface holds {ip} (the route to MASTER_ADDR="
            f"{master!r}): set GLOO_SOCKET_IFNAME to the interface other nodes reach this one on."
        )
    os.environ["GLOO_SOCKET_IFNAME"] = name
    return name


def node_identity() -> str:
    """'hostname (ip)': the host name and the address peers reach this node on."""
    ip = "?"
    try:
        ip = route_ip(os.environ.get("MASTER_ADDR", "127.0.0.1"))
    except OSError:
        pass
    return f"{socket.gethostname()} ({ip})"
