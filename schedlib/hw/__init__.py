"""Hardware profiles for the carver: what a GPU can hold (per-SM limits) and how fast it goes.

Use :func:`load` for a named or file profile, :func:`detect` for the GPU that is present, and
:func:`resolve` where an API accepts a profile, a name, a path or ``"auto"``.  Profiles are found in
``$SCHEDLIB_HWPROFILE_PATH`` (searched first, so users can add or shadow profiles), then in the
installed ``schedlib/_hwprofiles`` or, in a source checkout, the repository's ``hwprofiles/``.
"""

from __future__ import annotations

import builtins
import os
from collections.abc import Mapping
from pathlib import Path

from schedlib.errors import ProfileError
from schedlib.hw.detect import ARCH_TABLE, ArchTraits, ProfileWarning, detect
from schedlib.hw.profile import (
    ENV_PATH,
    SUFFIXES,
    Bandwidth,
    HardwareProfile,
    PeakTflops,
    TransactionBytes,
    load_file,
    normalize_name,
    parse_file,
    validate,
)

__all__ = [
    "ARCH_TABLE",
    "ArchTraits",
    "Bandwidth",
    "HardwareProfile",
    "PeakTflops",
    "ProfileError",
    "ProfileWarning",
    "TransactionBytes",
    "all_profiles",
    "detect",
    "list",
    "load",
    "load_file",
    "profile_dirs",
    "resolve",
    "validate",
]


def profile_dirs() -> builtins.list[Path]:
    """Existing directories searched for profiles, in search order."""
    dirs = [Path(p) for p in os.environ.get(ENV_PATH, "").split(os.pathsep) if p.strip()]
    package = Path(__file__).resolve().parent.parent
    installed, checkout = package / "_hwprofiles", package.parent / "hwprofiles"
    dirs.append(installed if installed.is_dir() else checkout)
    return [d for d in dirs if d.is_dir()]


def _profile_files() -> dict[str, Path]:
    """Key (file stem) -> file for every profile on the search path; earlier directories win."""
    found: dict[str, Path] = {}
    for directory in profile_dirs():
        for file in sorted(directory.iterdir()):
            if file.suffix.lower() in SUFFIXES and file.is_file():
                found.setdefault(file.stem.lower(), file)
    return found


def list() -> builtins.list[str]:
    """Keys :func:`load` finds by name, sorted: shipped profiles plus those on ``$SCHEDLIB_HWPROFILE_PATH``.

    Named ``list`` for the ``schedlib.hw.list()`` API; this module uses ``builtins.list`` where it
    means the type.
    """
    return sorted(_profile_files())


def all_profiles() -> builtins.list[HardwareProfile]:
    """Every profile on the search path, validated (detection matches a device against these)."""
    return [load_file(path) for path in _profile_files().values()]


def load(name_or_path: str | os.PathLike[str]) -> HardwareProfile:
    """A validated profile by key ("h100"), alias ("NVIDIA H100 80GB HBM3", case-insensitive) or file path.

    Raises :class:`ProfileError` naming file, field and value for an invalid file, or listing the
    known keys for an unknown name.
    """
    text = os.fspath(name_or_path)
    looks_like_path = Path(text).suffix.lower() in SUFFIXES or "/" in text or os.sep in text
    if not isinstance(name_or_path, str) or looks_like_path:
        return load_file(text)
    files = _profile_files()
    wanted = normalize_name(text)
    if wanted in files:
        return load_file(files[wanted])
    for file in files.values():  # alias lookup: a light parse, full validation only for the match
        raw = parse_file(file)
        if isinstance(raw, Mapping):
            names = [raw.get("name"), *(raw.get("aliases") or [])]
            if any(isinstance(n, str) and normalize_name(n) == wanted for n in names):
                return load_file(file)
    searched = ", ".join(str(d) for d in profile_dirs()) or "<none>"
    raise ProfileError(
        f"unknown hardware profile {text!r}: known keys are {sorted(files)} (searched {searched}; "
        f"pass a .yaml/.yml/.json path or add directories to ${ENV_PATH})"
    )


def resolve(target: str | os.PathLike[str] | HardwareProfile) -> HardwareProfile:
    """Turn whatever a user passed as a target into a profile: a profile passes through unchanged,
    ``"auto"`` detects the present GPU, anything else is a key, alias or file path for :func:`load`."""
    if isinstance(target, HardwareProfile):
        return target
    if isinstance(target, str) and target.strip().lower() == "auto":
        return detect()
    if isinstance(target, (str, os.PathLike)):
        return load(target)
    raise ProfileError(
        f"resolve(): argument target={target!r}: expected a HardwareProfile, a profile key or alias, "
        f"a .yaml/.yml/.json path, or 'auto'"
    )
