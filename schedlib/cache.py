"""Per-user cache directories (compiled emulator libraries, compile reports, tuning databases).

Order of precedence: ``$SCHEDLIB_CACHE_DIR``, then ``$XDG_CACHE_HOME/schedlib``, then ``~/.cache/schedlib``.
Nothing in a cache is ever executed as Python: only compiled kernels built from our own sources and JSON.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path


def cache_root() -> Path:
    """The per-user cache root, created on first use."""
    env = os.environ.get("SCHEDLIB_CACHE_DIR")
    if env:
        root = Path(env)
    else:
        xdg = os.environ.get("XDG_CACHE_HOME")
        root = (Path(xdg) if xdg else Path.home() / ".cache") / "schedlib"
    root.mkdir(parents=True, exist_ok=True)
    return root


def cache_dir(kind: str) -> Path:
    """A sub-directory of the cache root for one kind of artifact (e.g. ``"emulator"``)."""
    path = cache_root() / kind
    path.mkdir(parents=True, exist_ok=True)
    return path


def content_hash(*parts: str | bytes) -> str:
    """A stable hex digest of the given parts, used as a cache key."""
    digest = hashlib.sha256()
    for part in parts:
        data = part.encode() if isinstance(part, str) else part
        digest.update(len(data).to_bytes(8, "little"))
        digest.update(data)
    return digest.hexdigest()[:32]
