"""Private working directories inside the cache, and the removal of ones a killed process left behind.

Builds run in ``.build-*`` / ``.headers-*`` directories that are deleted in a ``finally``; a process killed
outright (``kill -9``, the OOM killer, a crashed pytest-xdist worker) never gets there and leaves tens of MB
behind for good.  Each directory records its owner (``pid host``), so a later build can remove those whose
owner is gone, and any older than :data:`STALE_AFTER_S` (an owner on another host cannot be asked).
"""

from __future__ import annotations

import os
import shutil
import socket
import tempfile
import time
from pathlib import Path

STALE_AFTER_S = 3600.0
OWNER_FILE = ".owner"
PREFIXES = (".build-", ".headers-", ".stale-")


def make_work_dir(root: Path, prefix: str) -> Path:
    """A fresh private directory in ``root`` recording this process as its owner; stale siblings are removed."""
    remove_stale(root)
    work = Path(tempfile.mkdtemp(prefix=prefix, dir=root))
    (work / OWNER_FILE).write_text(f"{os.getpid()} {socket.gethostname()}\n")
    return work


def remove_stale(root: Path, now: float | None = None) -> None:
    """Delete working directories in ``root`` whose owning process has died, or older than an hour."""
    now = time.time() if now is None else now
    try:
        entries = list(root.iterdir())
    except OSError:
        return
    for entry in entries:
        if entry.name.startswith(PREFIXES) and entry.is_dir() and _is_stale(entry, now):
            shutil.rmtree(entry, ignore_errors=True)


def _is_stale(path: Path, now: float) -> bool:
    try:
        age = now - path.stat().st_mtime
        owner = (path / OWNER_FILE).read_text().split()
    except (OSError, ValueError):
        owner = []  # not written yet (just created) or never: only its age can tell
        try:
            age = now - path.stat().st_mtime
        except OSError:
            return False  # already gone
    if age > STALE_AFTER_S:
        return True
    if len(owner) == 2 and owner[1] == socket.gethostname() and owner[0].isdigit():
        return not _alive(int(owner[0]))
    return False


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, OverflowError):  # no such process; a pid too large for the OS is none either
        return False
    except OSError:
        return True  # exists, owned by someone else
    return True
