"""Worker identities, and when a worker can be proven gone.

A worker id names one process: ``host:pid:nonce:scope``. ``scope`` is the
kernel's boot id and the process's PID namespace, so a pid is only ever
compared with pids it can be compared with. Two containers that share a
state directory and a host name, or a machine rebooted since, give different
scopes: their pids say nothing about each other.

``owner_is_gone`` is the only place that concludes a worker is dead. Each
use turns "dead" into action: the runner takes over a thread lease at once
instead of waiting for it to expire, recovery takes over an attempt in
flight (``Ledger.attempt_holder``; otherwise only once the lease of the
thread it ran for has lapsed), and dispatch trusts a lookup's "not found" as
final for an attempt that worker started. A worker that is
merely silent (stopped with SIGSTOP or Ctrl-Z, a suspended laptop or VM, a
long GC pause) is not gone: its attempt may
still complete, after its lease expired and another worker took the thread.
Fencing by attempt number (the ledger refuses its late result) cannot stop
that late effect; only not repeating the attempt can.
"""

from __future__ import annotations

import functools
import os
import socket
import uuid
from pathlib import Path

__all__ = ["new_worker_id", "owner_is_gone"]


@functools.cache
def _scope() -> str:
    """``<boot id>/<pid namespace inode>`` of this process; ``"-"`` parts where unreadable."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        boot = "-"
    try:
        ns = os.readlink("/proc/self/ns/pid")  # "pid:[4026531836]"
        pidns = "".join(ch for ch in ns if ch.isdigit()) or "-"
    except OSError:
        pidns = "-"
    return f"{boot}/{pidns}"


def new_worker_id() -> str:
    """Return an id unique to this process: ``host:pid:nonce:scope`` (see the module docstring)."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}:{_scope()}"


def owner_is_gone(owner: str | None) -> bool:
    """Whether ``owner`` (a worker id) names a process proven to have ended.

    Proven only when the id was made on this host, in this boot, in this PID
    namespace (same ``scope``, readable), and no process has its pid. Anything
    else is presumed alive: another host, container or boot, an id without a
    scope (made before scopes existed), a live pid (possibly reused), a pid we
    may not signal.

    Args:
        owner: a worker id, as stored in a lease or as an attempt's ``claimed_by``.

    Returns:
        ``True`` only if the process cannot be running.
    """
    if not owner:
        return False
    parts = owner.split(":")
    if len(parts) < 3 or parts[0] != socket.gethostname() or not parts[1].isdigit():
        return False
    scope = ":".join(parts[3:])
    if scope != _scope() or "-" in scope.split("/"):
        return False
    try:
        os.kill(int(parts[1]), 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False
