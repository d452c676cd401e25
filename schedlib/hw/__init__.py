"""Hardware profiles for the carver: what a GPU can hold (per-SM limits) and how fast it goes.

Use :func:`load` for a named or file profile, :func:`detect` for the GPU that is present, and
:func:`resolve` where an API accepts a profile, a name, a path or ``"auto"``.  Profiles are found in
``$SCHEDLIB_HWPROFILE_PATH`` (searched first, so users can add or shadow profiles), then in the
installed ``schedlib/_hwprofiles`` or, in a source checkout, the repository's ``hwprofiles/``.
"""

from __future__ import annotations

import builtins
import os
import warnings
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
    normalize_name,
    validate,
)
from schedlib.hw.profile_file import load_file, parse_file

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
    "is_auto",
    "list",
    "load",
    "load_file",
    "profile_dirs",
    "resolve",
    "validate",
]


def profile_dirs() -> builtins.list[Path]:
    """Existing directories searched for profiles, in search order.  An entry of ``$SCHEDLIB_HWPROFILE_PATH``
    that is not a directory is skipped with a :class:`ProfileWarning` (a typo there would otherwise hide the
    user's profiles without a word)."""
    dirs = [Path(p) for p in os.environ.get(ENV_PATH, "").split(os.pathsep) if p.strip()]
    for d in dirs:
        if not d.is_dir():
            warnings.warn(f"${ENV_PATH} names {d}, which is not a directory; no profiles are read from it",
                          ProfileWarning, stacklevel=2)
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


def _skip(file: Path, exc: ProfileError) -> None:
    # One broken file in a shared profile directory must not hide every other profile.
    warnings.warn(f"skipped a hardware profile that does not load: {exc}", ProfileWarning, stacklevel=4)


def _valid_profiles() -> dict[str, HardwareProfile]:
    """Key -> profile for every file on the search path that loads; the others are skipped with a warning."""
    out: dict[str, HardwareProfile] = {}
    for key, file in _profile_files().items():
        try:
            out[key] = load_file(file)
        except ProfileError as exc:
            _skip(file, exc)
    return out


def list() -> builtins.list[str]:
    """Keys :func:`load` finds by name, sorted: shipped profiles plus those on ``$SCHEDLIB_HWPROFILE_PATH``.

    A file that does not load is left out with a :class:`ProfileWarning` naming it and its error
    (loading it by key or path still raises that error).  Named ``list`` for the ``schedlib.hw.list()``
    API; this module uses ``builtins.list`` where it means the type.
    """
    return sorted(_valid_profiles())


def all_profiles() -> builtins.list[HardwareProfile]:
    """Every valid profile on the search path (detection matches a device against these); invalid
    files are skipped with a :class:`ProfileWarning`."""
    return builtins.list(_valid_profiles().values())


def _find_alias(wanted: str, files: dict[str, Path]) -> Path | None:
    """The file whose name or an alias normalizes to ``wanted``; a light parse, so an unreadable file
    is skipped with a warning while a matching but invalid one is returned to report its error.  Where
    several answer to it, the first in search order, with a :class:`ProfileWarning` naming them all."""
    found = []
    for file in files.values():
        try:
            raw = parse_file(file)
        except ProfileError as exc:
            _skip(file, exc)
            continue
        if isinstance(raw, Mapping):
            aliases = raw.get("aliases")
            names = [raw.get("name"), *(aliases if isinstance(aliases, builtins.list) else [])]
            if any(isinstance(n, str) and normalize_name(n) == wanted for n in names):
                found.append(file)
    if len(found) > 1:
        ambiguous(wanted, [str(f) for f in found])
    return found[0] if found else None


def ambiguous(name: str, origins: builtins.list[str]) -> None:
    """Warn that several profiles answer to ``name``: a profile copied from a shipped one keeps its aliases,
    and would otherwise take the shipped one's name (and ``detect()``'s match for that GPU) without a word."""
    warnings.warn(f"{len(origins)} hardware profiles answer to {name!r}: {', '.join(origins)}; using the first "
                  f"(search order).  Remove the name from the 'name'/'aliases' of the others (a copied profile "
                  f"keeps its original's aliases) to make the choice explicit", ProfileWarning, stacklevel=4)


def load(name_or_path: str | os.PathLike[str]) -> HardwareProfile:
    """A validated profile by key ("h100"), alias ("NVIDIA H100 80GB HBM3", case-insensitive) or file path.

    Raises :class:`ProfileError` naming file, field and value for an invalid file, listing the known
    keys for an unknown name, and naming the argument when it is neither a string nor a path.
    """
    text = os.fspath(name_or_path) if isinstance(name_or_path, (str, os.PathLike)) else None
    if not isinstance(text, str):  # None, numbers, bytes paths: as resolve() says
        raise ProfileError(
            f"load(): argument name_or_path={name_or_path!r}: expected a profile key or alias, "
            f"or a .yaml/.yml/.json path"
        )
    looks_like_path = Path(text).suffix.lower() in SUFFIXES or "/" in text or os.sep in text
    if not isinstance(name_or_path, str) or looks_like_path:
        try:
            return load_file(text)
        except ProfileError:
            # a bare "h100.yaml" is read relative to the working directory; say how to name the shipped one
            stem = Path(text).stem.lower()
            if Path(text).name == text and not Path(text).exists() and stem in _profile_files():
                raise ProfileError(f"{text}: no such file in the working directory; the profile {stem!r} on the "
                                   f"search path is loaded by its key: load({stem!r})") from None
            raise
    files = _profile_files()
    wanted = normalize_name(text)
    match = files.get(wanted) or _find_alias(wanted, files)
    if match is not None:
        return load_file(match)
    searched = ", ".join(str(d) for d in profile_dirs()) or "<none>"
    raise ProfileError(
        f"unknown hardware profile {text!r}: known keys are {sorted(files)} (searched {searched}; "
        f"pass a .yaml/.yml/.json path or add directories to ${ENV_PATH})"
    )


def is_auto(target: object) -> bool:
    """Whether ``target`` asks for the present GPU: "auto" in any spelling (" AUTO " too)."""
    return isinstance(target, str) and target.strip().lower() == "auto"


def resolve(target: str | os.PathLike[str] | HardwareProfile) -> HardwareProfile:
    """Turn whatever a user passed as a target into a profile: a profile passes through unchanged,
    ``"auto"`` detects the present GPU, anything else is a key, alias or file path for :func:`load`."""
    if isinstance(target, HardwareProfile):
        return target
    if is_auto(target):
        return detect()
    if isinstance(target, (str, os.PathLike)):
        return load(target)
    raise ProfileError(
        f"resolve(): argument target={target!r}: expected a HardwareProfile, a profile key or alias, "
        f"a .yaml/.yml/.json path, or 'auto'"
    )
