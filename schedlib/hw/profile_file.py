"""Reading hardware profile files from disk: YAML or JSON text to plain data to a validated profile.

Profile files are user-editable and may sit on a shared search path, so reading them is strict and
never executes anything: YAML goes through a ``yaml.SafeLoader`` subclass, JSON through ``json.loads``.
Every way a file can be wrong (not UTF-8, bad syntax, a key given twice, absurd nesting) ends in a
:class:`ProfileError` that names the file, and the line where there is one.
"""

from __future__ import annotations

import builtins
import functools
import json
import os
import re
import stat
from pathlib import Path
from typing import Any

import yaml
from yaml.constructor import ConstructorError

from schedlib.errors import ProfileError
from schedlib.hw.profile import SUFFIXES, HardwareProfile, validate

_MERGE_TAG = "tag:yaml.org,2002:merge"
# The shipped profiles are under 4 KiB; a cap far above that still refuses /dev/zero or a stray dump
# before it is read into memory.
MAX_PROFILE_BYTES = 1 << 20
_KINDS = {stat.S_IFDIR: "a directory", stat.S_IFIFO: "a named pipe", stat.S_IFCHR: "a character device",
          stat.S_IFBLK: "a block device", stat.S_IFSOCK: "a socket"}


class StrictLoader(yaml.SafeLoader):
    """SafeLoader that refuses a mapping key given twice: PyYAML would silently keep the last value,
    so an edit appended below an existing field would quietly override it."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == _MERGE_TAG:  # `<<: *base` may legitimately repeat keys of the base
                continue
            key = self.construct_object(key_node, deep=True)
            try:
                first = seen.get(key)
            except TypeError:  # unhashable key: the base class reports it with its position
                continue
            if first is not None:
                problem = f"duplicate key {key!r}, first given on line {first}"
                raise ConstructorError("while constructing a mapping", node.start_mark, problem, key_node.start_mark)
            seen[key] = key_node.start_mark.line + 1
        return super().construct_mapping(node, deep=deep)

    def construct_object(self, node: yaml.Node, deep: bool = False) -> Any:
        # Scalar constructors raise plain ValueError for e.g. `2001-13-45` or `!!int x`; give them a line.
        try:
            return super().construct_object(node, deep=deep)
        except (ValueError, TypeError, OverflowError) as exc:
            raise ConstructorError(None, None, f"bad value: {exc}", node.start_mark) from exc


# Numbers as YAML 1.2 reads them, which is what people write: PyYAML's YAML 1.1 rules take `1e4` and
# `3.35e3` for strings (an exponent needs a dot and a sign there) and read `2:12` as 132 (base 60).
_INT_TAG, _FLOAT_TAG = "tag:yaml.org,2002:int", "tag:yaml.org,2002:float"
StrictLoader.yaml_implicit_resolvers = {
    first: [(tag, rx) for tag, rx in resolvers if tag not in (_INT_TAG, _FLOAT_TAG)]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
StrictLoader.add_implicit_resolver(_INT_TAG, re.compile(r"^(?:[-+]?(?:0|[1-9][0-9]*)|0x[0-9a-fA-F]+)$"),
                                    list("-+0123456789"))
StrictLoader.add_implicit_resolver(
    _FLOAT_TAG,
    re.compile(r"^(?:[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$"),
    list("-+0123456789."))


def _json_object(path: Path, pairs: builtins.list[tuple[str, Any]]) -> dict[str, Any]:
    """``json.loads`` hook refusing a key given twice (it would keep the last, as YAML would)."""
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ProfileError(f"{path}: invalid JSON (duplicate key {key!r} in one object)")
        out[key] = value
    return out


def _decode(path: Path, data: bytes) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise ProfileError(
            f"{path}: line {line}: not UTF-8 text (byte 0x{data[exc.start]:02x} at offset {exc.start}); "
            "profile files must be UTF-8 YAML or JSON"
        ) from None


def _read_bytes(path: Path) -> bytes:
    """The bytes of a regular file of at most :data:`MAX_PROFILE_BYTES`.

    An explicit path may name anything: a named pipe would block ``open`` or ``read`` forever and
    ``/dev/zero`` would fill memory.  So the file is opened without blocking (a FIFO opens at once
    with no writer), checked through its descriptor (so a file swapped in after a path check cannot
    slip past), and read only one byte beyond the cap.
    """
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0) | getattr(os, "O_BINARY", 0)
    fd = os.open(path, flags)
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            kind = _KINDS.get(stat.S_IFMT(mode), "not a plain file")
            raise ProfileError(f"{path}: is not a regular file ({kind}), so it cannot be a hardware profile")
        chunks, size = [], 0
        while size <= MAX_PROFILE_BYTES:  # a regular file may still grow while it is read
            chunk = os.read(fd, MAX_PROFILE_BYTES + 1 - size)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    finally:
        os.close(fd)
    if size > MAX_PROFILE_BYTES:
        raise ProfileError(f"{path}: is larger than {MAX_PROFILE_BYTES} bytes, not a hardware profile")
    return b"".join(chunks)


def offending_line(text: str, line: int) -> str:
    """``: '<the line>'`` for a parse error at 0-based ``line`` of ``text``; nothing past its end or when the
    line is blank (an error at the end of the file has no line to show)."""
    lines = text.splitlines()
    bad = lines[line].strip() if 0 <= line < len(lines) else ""
    return f": {bad!r}" if bad else ""


def parse_file(path: Path) -> Any:
    """Read a profile file into plain data (safe YAML loading / ``json.loads``; never executes code).

    Raises :class:`ProfileError` for anything but a regular file of at most :data:`MAX_PROFILE_BYTES`.
    """
    try:
        text = _decode(path, _read_bytes(path))
    except OSError as exc:
        raise ProfileError(f"{path}: cannot read hardware profile: {exc.strerror or exc}") from exc
    try:
        if path.suffix.lower() == ".json":
            return json.loads(text, object_pairs_hook=functools.partial(_json_object, path))
        return yaml.load(text, Loader=StrictLoader)  # a SafeLoader subclass: builds plain data only
    except json.JSONDecodeError as exc:
        raise ProfileError(f"{path}: line {exc.lineno}: invalid JSON ({exc.msg})"
                           + offending_line(text, exc.lineno - 1)) from exc
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        lineno = mark.line + 1 if mark is not None else 0
        problem = getattr(exc, "problem", None) or str(exc)
        raise ProfileError(f"{path}: line {lineno}: invalid YAML ({problem})"
                           + offending_line(text, lineno - 1)) from exc
    except ValueError as exc:  # json.loads on e.g. an integer of more digits than int() accepts
        raise ProfileError(f"{path}: invalid JSON ({exc})") from exc
    except RecursionError:
        # Both parsers recurse once per nesting level; no profile nests more than three deep.
        raise ProfileError(f"{path}: nested too deeply to be a hardware profile") from None


@functools.lru_cache(maxsize=128)
def _load_cached(path: str, _mtime_ns: int, _size: int) -> HardwareProfile:
    file = Path(path)
    try:
        return validate(parse_file(file), str(file), stem=file.stem.lower())
    except RecursionError:  # repr() of a deeply nested but parseable value in an error message
        raise ProfileError(f"{file}: nested too deeply to be a hardware profile") from None


def load_file(path: str | os.PathLike[str]) -> HardwareProfile:
    """Load and validate one profile file (cached until the file changes).

    The file's key is its stem in lowercase: lookups by name are case-insensitive, so ``H100.yaml``
    holds the profile ``h100`` (and on case-insensitive file systems the stem's case is not even stable).
    """
    file = Path(path)
    if file.suffix.lower() not in SUFFIXES:
        raise ProfileError(f"{file}: a hardware profile must end in one of {builtins.list(SUFFIXES)}")
    try:
        st = file.stat()
    except OSError as exc:
        raise ProfileError(f"{file}: no such hardware profile file ({exc.strerror or exc})") from exc
    return _load_cached(str(file), st.st_mtime_ns, st.st_size)
