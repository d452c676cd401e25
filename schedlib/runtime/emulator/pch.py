"""The emulator headers precompiled once per flag set, cached beside the libraries (50 to 80 MB each).

``-include`` of the cached copy makes g++ load the parsed headers instead of parsing them (0.1-0.4 s of a
1-2.4 s build).  g++ checks that a precompiled header matches the build's options and parses the real one
when it does not, so the copy never changes what is compiled; but a damaged copy can fail every build (a
truncated ``.gch``: "cannot read PCH file") or slow each one (a missing one rebuilt and thrown away every
time), so a copy is checked before use (its manifest: the content hash of its headers and the size of its
``.gch``), replaced when it does not match, and discarded when a build that used it fails.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from schedlib.cache import cache_dir, content_hash
from schedlib.runtime.emulator.workdirs import make_work_dir

PCH_NAME = "sl_cuda_emu.h.gch"
MANIFEST = "manifest"


def header_flags(gxx: str, flags: list[str], headers: list[str], identity: str, header_dir: Path) -> list[str]:
    """Where a build finds the emulator headers: a checked cached copy with them precompiled for ``flags``, or
    ``-I{header_dir}`` (the package's own) where that cannot be made.  ``headers``: the texts of the package's
    headers ("name\\nbody"), which the copy must hold exactly."""
    ready = pch_dir(flags, headers, identity)
    if not _intact(ready, headers):
        fresh = _precompile(gxx, flags, headers, ready.parent)
        if fresh is None:
            return [f"-I{header_dir}"]  # a compiler that cannot precompile: every build parses the headers
        _swap_in(fresh, ready, headers)
        if not _intact(ready, headers):
            return [f"-I{header_dir}"]  # lost a race to a copy that does not check out: parse this time
    # the kernel's own #include "sl_cuda_emu.h" must find the same file, so #pragma once skips it
    return [f"-I{ready}", "-include", "sl_cuda_emu.h"]


def pch_dir(flags: list[str], headers: list[str], identity: str) -> Path:
    key = content_hash(*headers, " ".join(flags), identity)
    return cache_dir("emulator-headers") / key[:24]


def uses_pch(cmd: list[str]) -> Path | None:
    """The precompiled-header directory a build command uses, if any."""
    for arg in cmd:
        if arg.startswith("-I") and (Path(arg[2:]) / PCH_NAME).is_file():
            return Path(arg[2:])
    return None


def discard(ready: Path) -> None:
    """Move a copy a build failed with out of the way (a rename first, so no build picks it up meanwhile)."""
    if not ready.exists():
        return
    away = make_work_dir(ready.parent, ".stale-")
    try:
        os.replace(ready, away / "old")
    except OSError:
        pass  # already replaced or removed by a concurrent process
    shutil.rmtree(away, ignore_errors=True)


def _intact(ready: Path, headers: list[str]) -> bool:
    """Whether ``ready`` holds this package's headers and the complete precompiled form its manifest records."""
    manifest = _manifest_of(ready)
    return manifest is not None and manifest == _expected(ready, headers)


def _expected(ready: Path, headers: list[str]) -> str | None:
    pch = ready / PCH_NAME
    try:
        size = pch.stat().st_size
    except OSError:
        return None
    return f"{content_hash(*_texts_in(ready, headers))} {size}"


def _texts_in(ready: Path, headers: list[str]) -> list[str]:
    """The package's headers as the copy holds them; an unreadable copy hashes differently."""
    out = []
    for text in headers:
        name = text.partition("\n")[0]
        try:
            out.append(f"{name}\n{(ready / name).read_text()}")
        except (OSError, ValueError):
            out.append(f"{name}\n<missing>")
    return [*out, content_hash(*headers)]  # and what the package holds, so an edited copy never matches


def _manifest_of(ready: Path) -> str | None:
    try:
        text = (ready / MANIFEST).read_text().strip()
    except (OSError, ValueError):
        return None
    return text


def _precompile(gxx: str, flags: list[str], headers: list[str], root: Path) -> Path | None:
    """A fresh directory holding the headers, their precompiled form and its manifest, or None."""
    work = make_work_dir(root, ".headers-")
    try:
        for text in headers:  # the very texts the key hashes, not a second read of the package
            name, _, body = text.partition("\n")
            (work / name).write_text(body)
        options = [f for f in flags if f != "-shared"]  # a link option: not part of a header's compilation
        cmd = [gxx, *options, "-x", "c++-header", "sl_cuda_emu.h", "-o", PCH_NAME]
        proc = subprocess.run(cmd, cwd=work, capture_output=True, text=True, timeout=600, check=False)
        if proc.returncode != 0 or not (work / PCH_NAME).is_file():
            shutil.rmtree(work, ignore_errors=True)
            return None
        expected = _expected(work, headers)
        (work / MANIFEST).write_text(f"{expected}\n")
        return work
    except (OSError, subprocess.TimeoutExpired):
        shutil.rmtree(work, ignore_errors=True)
        return None


def _swap_in(fresh: Path, ready: Path, headers: list[str]) -> None:
    """Publish ``fresh`` as ``ready``: the old copy is renamed away first (a rename cannot replace a
    non-empty directory), then removed.  A concurrent process that publishes first wins; ours is dropped."""
    if ready.exists():
        if _intact(ready, headers):
            shutil.rmtree(fresh, ignore_errors=True)  # a concurrent process just published a good copy: use it
            return
        discard(ready)
    try:
        os.replace(fresh, ready)
    except OSError:
        pass  # a concurrent build published an equivalent copy first
    shutil.rmtree(fresh, ignore_errors=True)
