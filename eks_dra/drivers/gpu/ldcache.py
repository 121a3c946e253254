"""/etc/ld.so.cache of a driver root: read (what nvcdi's ldcache locator reads) and, for fixtures, write.

Format (glibc `elf/cache.c`, "new" format 1.1, the only one glibc >= 2.32 writes): a 48-byte header
(`glibc-ld.so.cache` `1.1`, entry count, string-table size, flags, extension offset, 3 unused words),
then 24-byte entries (int32 flags, uint32 key, uint32 value, uint32 osversion, uint64 hwcap), then the
strings; key and value are offsets from the header's start. An old-format ("ld.so-1.7.0") block may come
first; it is skipped, as nvidia-container-toolkit's `internal/ldcache` does. Entry flags: bits 0-7 the
type (1 = ELF, 3 = ELF libc6), bits 8-15 the architecture (0x0300 x86-64, 0x0a00 AArch64, ...).
"""

from __future__ import annotations

import re
import struct
from dataclasses import dataclass
from pathlib import Path

CACHE_PATH = Path("etc/ld.so.cache")
_OLD_MAGIC = b"ld.so-1.7.0"
_NEW_MAGIC = b"glibc-ld.so.cache1.1"
_HEADER = struct.Struct("<20sIIB3xI12x")
_ENTRY = struct.Struct("<iIIIQ")
_OLD_ENTRY = 12
FLAG_ELF_LIBC6 = 0x0003
ARCH_X86_64, ARCH_AARCH64 = 0x0300, 0x0A00
_ARCH_BITS = {0x0300: 64, 0x0A00: 64, 0x0500: 64, 0x0000: 32, 0x0800: 32, 0x0900: 32}
_ENDIAN_LITTLE = 2  # cache_file_new_flags_endian_little


class LdCacheError(ValueError):
    """The file is not an ld.so.cache this reader understands."""


@dataclass(frozen=True)
class CacheEntry:
    name: str  # the soname, e.g. libcuda.so.1
    path: str  # absolute path as the root sees it, e.g. /usr/lib64/libcuda.so.1
    bits: int  # 64 or 32


def read(path: Path) -> list[CacheEntry]:
    """The ELF entries of a cache file, in file order. Raises OSError or LdCacheError."""
    data = path.read_bytes()
    start = 0
    if data.startswith(_OLD_MAGIC):
        count, = struct.unpack_from("<I", data, len(_OLD_MAGIC) + 1)
        start = len(_OLD_MAGIC) + 1 + 4 + count * _OLD_ENTRY
        start += -start % 8
    if len(data) < start + _HEADER.size:
        raise LdCacheError(f"{path}: too short for an ld.so.cache header")
    magic, count, _strings, _flags, _ext = _HEADER.unpack_from(data, start)
    if magic != _NEW_MAGIC:
        raise LdCacheError(f"{path}: not a glibc ld.so.cache (format 1.1)")
    out = []
    for i in range(count):
        pos = start + _HEADER.size + i * _ENTRY.size
        if pos + _ENTRY.size > len(data):
            raise LdCacheError(f"{path}: entry {i} lies past the end of the file")
        flags, key, value, _, _ = _ENTRY.unpack_from(data, pos)
        bits = _ARCH_BITS.get(flags & 0xFF00)
        if not flags & 0x0001 or bits is None:
            continue
        out.append(CacheEntry(_cstring(data, start + key), _cstring(data, start + value), bits))
    return out


def _cstring(data: bytes, offset: int) -> str:
    end = data.find(b"\0", offset)
    if offset >= len(data) or end < 0:
        raise LdCacheError("string offset outside the file")
    return data[offset:end].decode(errors="replace")


def _libcmp_key(name: str) -> list:
    """glibc's _dl_cache_libcmp order: digit runs compare as numbers and sort before other characters."""
    return [(0, int(part), "") if part.isdigit() else (1, 0, part) for part in re.findall(r"\d+|\D", name)]


def write(path: Path, entries: list[tuple[str, str]], arch: int = ARCH_X86_64) -> None:
    """Write (soname, path) pairs as a format-1.1 cache, sorted as ldconfig sorts them (descending)."""
    ordered = sorted(entries, key=lambda e: _libcmp_key(e[0]), reverse=True)
    strings = bytearray()
    offsets: dict[str, int] = {}
    base = _HEADER.size + len(ordered) * _ENTRY.size

    def offset(text: str) -> int:
        if text not in offsets:
            offsets[text] = base + len(strings)
            strings.extend(text.encode() + b"\0")
        return offsets[text]

    body = b"".join(_ENTRY.pack(FLAG_ELF_LIBC6 | arch, offset(name), offset(target), 0, 0)
                    for name, target in ordered)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(_HEADER.pack(_NEW_MAGIC, len(ordered), len(strings), _ENDIAN_LITTLE, 0) + body + strings)
