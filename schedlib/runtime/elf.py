"""A cheap integrity check of cached ELF files (emulator libraries, cubins) before they are used.

A file cut short (a full disk, a killed copy) can keep intact headers: ``dlopen`` then maps segments past the
end of the file and the process dies of SIGBUS on first touch, and nvdisasm or the CUDA driver reject it on
every call.  Checking that the file is as long as every segment and section its headers describe catches
that without reading the contents.
"""

from __future__ import annotations

import struct
from pathlib import Path
from typing import BinaryIO

PT_LOAD = 1
SHT_NOBITS = 8  # .bss-like sections occupy no bytes in the file


def elf_problem(path: Path) -> str | None:
    """Why ``path`` is not a complete ELF file, or None when its headers fit in it."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(64)
            size = fh.seek(0, 2)
            if len(head) < 52 or head[:4] != b"\x7fELF":
                return f"is not an ELF file ({size} bytes, no ELF magic)"
            is64, order = head[4] == 2, "<" if head[5] == 1 else ">"
            if is64 and len(head) < 64:
                return f"is cut short ({size} bytes, an incomplete ELF header)"
            fmt = f"{order}16xHHIQQQIHHHHHH" if is64 else f"{order}16xHHIIIIIHHHHHH"
            _, _, _, _, phoff, shoff, _, _, phentsize, phnum, shentsize, shnum, _ = struct.unpack_from(fmt, head)
            tables = _read(fh, phoff, phentsize * phnum, size), _read(fh, shoff, shentsize * shnum, size)
    except OSError as exc:
        return f"cannot be read ({exc.strerror or exc})"
    if tables[0] is None or tables[1] is None:
        return f"is cut short ({size} bytes, smaller than its own header tables)"
    for i in range(phnum):  # program headers: what dlopen maps
        if is64:
            ptype, _, offset, _, _, filesz = struct.unpack_from(f"{order}IIQQQQ", tables[0], i * phentsize)
        else:
            ptype, offset, _, _, filesz = struct.unpack_from(f"{order}IIIII", tables[0], i * phentsize)
        if ptype == PT_LOAD and offset + filesz > size:
            return f"is cut short ({size} bytes; a loaded segment ends at byte {offset + filesz})"
    for i in range(shnum):  # section headers: what nvdisasm and the driver read
        if is64:
            _, stype, _, _, offset, sec_size = struct.unpack_from(f"{order}IIQQQQ", tables[1], i * shentsize)
        else:
            _, stype, _, _, offset, sec_size = struct.unpack_from(f"{order}IIIIII", tables[1], i * shentsize)
        if stype != SHT_NOBITS and offset + sec_size > size:
            return f"is cut short ({size} bytes; section {i} ends at byte {offset + sec_size})"
    return None


def _read(fh: BinaryIO, offset: int, length: int, size: int) -> bytes | None:
    if length == 0:
        return b""
    if offset + length > size:
        return None
    fh.seek(offset)
    return fh.read(length)
