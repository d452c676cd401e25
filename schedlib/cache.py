"""Per-user cache directories (compiled emulator libraries, compile reports, tuning databases).

Order of precedence: ``$SCHEDLIB_CACHE_DIR``, then ``$XDG_CACHE_HOME/schedlib``, then ``~/.cache/schedlib``.
Nothing in a cache is ever executed as Python, but compiled emulator libraries are dlopen'ed, so
whoever can write into the cache can run code as the user: the directories are created private
(mode 0o700) and a directory owned by someone else, or writable by group or others, is refused.
"""

from __future__ import annotations

import hashlib
import os
import stat
from pathlib import Path

from schedlib.errors import SchedlibError


def _root_and_origin() -> tuple[Path, str]:
    env = os.environ.get("SCHEDLIB_CACHE_DIR")
    if env:
        return Path(env), "$SCHEDLIB_CACHE_DIR"
    xdg = os.environ.get("XDG_CACHE_HOME")
    if xdg:
        return Path(xdg) / "schedlib", "$XDG_CACHE_HOME"
    try:
        home = Path.home()
    except RuntimeError:  # no $HOME and no passwd entry for this uid (a container run as an arbitrary uid)
        raise SchedlibError("no schedlib cache directory: $SCHEDLIB_CACHE_DIR and $XDG_CACHE_HOME are unset, and "
                            "this user has no home directory ($HOME unset, no passwd entry); set "
                            "SCHEDLIB_CACHE_DIR to a private folder") from None
    return home / ".cache" / "schedlib", "the default ~/.cache/schedlib"


def _private_dir(path: Path, origin: str) -> Path:
    """Create ``path`` (mode 0o700) if needed and check nobody but this user can write into it."""
    where = f"schedlib cache directory {path} (from {origin})"
    try:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
        st = path.stat()
    except FileExistsError:
        raise SchedlibError(f"{where} cannot be used: it exists and is not a directory") from None
    except OSError as exc:
        raise SchedlibError(f"{where} cannot be created: {exc.strerror or exc}") from None
    if not stat.S_ISDIR(st.st_mode):
        raise SchedlibError(f"{where} cannot be used: it is not a directory")
    getuid = getattr(os, "getuid", None)  # POSIX only; elsewhere ownership and modes mean something else
    if getuid is None:
        return path
    if st.st_uid != getuid():
        raise SchedlibError(
            f"{where} is owned by uid {st.st_uid}, not by you (uid {getuid()}): compiled libraries in it are "
            f"loaded into this process, so it must be yours; choose another directory"
        )
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise SchedlibError(
            f"{where} is writable by group or others (mode {stat.S_IMODE(st.st_mode):#o}): compiled libraries "
            f"in it are loaded into this process; run `chmod go-w {path}` or choose another directory"
        )
    return path


def cache_root() -> Path:
    """The per-user cache root, created (private) on first use.

    Raises :class:`SchedlibError` naming the directory and the variable it came from when it cannot
    be created or is not safe to load compiled code from.
    """
    return _private_dir(*_root_and_origin())


def cache_dir(kind: str) -> Path:
    """A sub-directory of the cache root for one kind of artifact (e.g. ``"emulator"``)."""
    root, origin = _root_and_origin()
    _private_dir(root, origin)
    return _private_dir(root / kind, origin)


def content_hash(*parts: str | bytes) -> str:
    """A stable hex digest of the given parts, used as a cache key."""
    digest = hashlib.sha256()
    for part in parts:
        data = part.encode() if isinstance(part, str) else part
        digest.update(len(data).to_bytes(8, "little"))
        digest.update(data)
    return digest.hexdigest()[:32]
