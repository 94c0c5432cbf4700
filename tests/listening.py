"""The TCP ports a run's processes listen on, read from ``/proc`` (Linux), and a watcher that collects them.

A listening socket shows in ``/proc/net/tcp`` or ``tcp6`` in state ``0A`` with its local
address; it belongs to the processes whose file descriptors link to its inode. An
unspecified address (``0.0.0.0``, ``::``: every interface) is off loopback.
"""

from __future__ import annotations

import ipaddress
import os
import threading
from collections.abc import Iterable
from pathlib import Path
from types import TracebackType
from typing import Self

from experiments.flower import procs

IP = ipaddress.IPv4Address | ipaddress.IPv6Address
LISTEN = "0A"  # the TCP state LISTEN in /proc/net/tcp


def _ip(hex_address: str) -> IP:
    """An address of ``/proc/net/tcp{,6}`` (each 32-bit word in this machine's little-endian order)."""
    raw = bytes.fromhex(hex_address.split(":")[0])
    ip = ipaddress.ip_address(b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4)))
    return (ip.ipv4_mapped or ip) if isinstance(ip, ipaddress.IPv6Address) else ip


def _socket_inodes(pid: int) -> set[str]:
    try:
        links = [os.readlink(fd) for fd in Path(f"/proc/{pid}/fd").iterdir()]
    except OSError:  # gone meanwhile, or not ours
        return set()
    return {link[8:-1] for link in links if link.startswith("socket:[")}


def listening(pids: Iterable[int]) -> dict[tuple[IP, int], str]:
    """Every (address, port) that one of ``pids`` listens on, with its program and pid (``raylet, pid 12``)."""
    owner = {inode: pid for pid in pids for inode in _socket_inodes(pid)}
    found: dict[tuple[IP, int], str] = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for row in Path(table).read_text().splitlines()[1:]:
            fields = row.split()
            if fields[3] == LISTEN and fields[9] in owner:
                pid = owner[fields[9]]
                found[(_ip(fields[1]), int(fields[1].split(":")[1], 16))] = f"{_name(pid)}, pid {pid}"
    return found


def off_loopback(sockets: dict[tuple[IP, int], str]) -> list[str]:
    """The sockets not on loopback, as ``ADDRESS:PORT (PROGRAM, pid N)``."""
    return [f"{ip}:{port} ({owner})" for (ip, port), owner in sockets.items() if not ip.is_loopback]


def _name(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return "?"


class ListeningWatch:
    """While open, every 0.2 s: the listening sockets of this process's descendants and of the processes that
    carry ``tag`` (``KEY=VALUE``) in their environment, which catches those a dying parent left to init."""

    def __init__(self, tag: tuple[str, str] | None = None) -> None:
        self.tag = tag
        self.sockets: dict[tuple[IP, int], str] = {}
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._before: set[int] = set()

    def __enter__(self) -> Self:
        # what another test left behind is that test's to answer for, not what this block starts
        self._before = self._pids()
        self._thread.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self._done.set()
        self._thread.join()

    def _watch(self) -> None:
        while not self._done.wait(0.2):
            self.sockets.update(listening(self._pids() - self._before))

    def _pids(self) -> set[int]:
        tagged = procs.processes_with_env(*self.tag) if self.tag else []
        return procs.descendants({os.getpid()}) | set(tagged)
