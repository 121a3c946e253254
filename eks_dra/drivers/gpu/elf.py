"""The one ELF fact the GPU driver needs: a shared library's DT_SONAME; and the fixture's minimal libraries.

`soname()` reads the dynamic section through the section headers (SHT_DYNAMIC and its linked string
table), as Go's debug/elf `DynString(DT_SONAME)` does in nvidia-container-toolkit's soname-symlink logic.
`shared_object()` writes the smallest ELF64 shared object that glibc's ldconfig and Go's debug/elf both
accept: one PT_LOAD covering the file, a PT_DYNAMIC with DT_STRTAB/DT_STRSZ/DT_SONAME, and section
headers for .dynstr, .dynamic and .shstrtab. It has no code: fixture host trees only. Its load segment
sits at virtual address 1, not page-aligned with its file offset, so that dlopen() refuses it cleanly
("ELF load command address/offset not page-aligned") instead of mapping a library without symbol
tables; ldconfig only uses the segment to translate DT_STRTAB.
"""

from __future__ import annotations

import struct
from pathlib import Path

EM_X86_64, EM_AARCH64 = 62, 183
_ET_DYN, _PT_LOAD, _PT_DYNAMIC = 3, 1, 2
_SHT_STRTAB, _SHT_DYNAMIC = 3, 6
_DT_NULL, _DT_STRTAB, _DT_STRSZ, _DT_SONAME = 0, 5, 10, 14
_EHDR, _PHDR, _SHDR = 64, 56, 64
_BASE = 1  # virtual address of file offset 0 (see the module docstring)


def soname(path: Path | str) -> str | None:
    """DT_SONAME of an ELF64 little-endian shared object; None when the file is not one or has none."""
    try:
        data = Path(path).read_bytes()
    except OSError:
        return None
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        return None
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", data, 0x3A)
    try:
        sections = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)]
        for _, kind, _, _, offset, size, link, _, _, entsize in sections:
            if kind != _SHT_DYNAMIC:
                continue
            strtab_offset = sections[link][4]
            for pos in range(offset, offset + size, entsize or 16):
                tag, value = struct.unpack_from("<qQ", data, pos)
                if tag == _DT_NULL:
                    break
                if tag == _DT_SONAME:
                    start = strtab_offset + value
                    return data[start:data.index(b"\0", start)].decode()
    except (struct.error, IndexError, ValueError, UnicodeDecodeError):
        return None
    return None


def shared_object(name: str, machine: int = EM_X86_64) -> bytes:
    """A code-free ELF64 shared object whose DT_SONAME is `name`."""
    dynstr = b"\0" + name.encode() + b"\0"
    shstrtab = b"\0.dynstr\0.dynamic\0.shstrtab\0"
    dynstr_off = _EHDR + 2 * _PHDR
    dynamic_off = (dynstr_off + len(dynstr) + 7) & ~7
    dynamic = struct.pack("<qQqQqQqQ", _DT_STRTAB, _BASE + dynstr_off, _DT_STRSZ, len(dynstr), _DT_SONAME, 1,
                          _DT_NULL, 0)
    shstrtab_off = dynamic_off + len(dynamic)
    shoff = (shstrtab_off + len(shstrtab) + 7) & ~7
    size = shoff + 4 * _SHDR
    ident = b"\x7fELF" + bytes([2, 1, 1, 0]) + bytes(8)
    ehdr = ident + struct.pack("<HHIQQQIHHHHHH", _ET_DYN, machine, 1, 0, _EHDR, shoff, 0, _EHDR, _PHDR, 2, _SHDR, 4, 3)
    phdrs = (struct.pack("<IIQQQQQQ", _PT_LOAD, 4, 0, _BASE, _BASE, size, size, 0x1000)
             + struct.pack("<IIQQQQQQ", _PT_DYNAMIC, 6, dynamic_off, _BASE + dynamic_off, _BASE + dynamic_off,
                           len(dynamic), len(dynamic), 8))
    shdrs = (bytes(_SHDR)
             + struct.pack("<IIQQQQIIQQ", 1, _SHT_STRTAB, 2, _BASE + dynstr_off, dynstr_off, len(dynstr), 0, 0, 1, 0)
             + struct.pack("<IIQQQQIIQQ", 9, _SHT_DYNAMIC, 3, _BASE + dynamic_off, dynamic_off, len(dynamic), 1, 0, 8,
                           16)
             + struct.pack("<IIQQQQIIQQ", 18, _SHT_STRTAB, 0, 0, shstrtab_off, len(shstrtab), 0, 0, 1, 0))
    out = bytearray(size)
    out[0:_EHDR] = ehdr
    out[_EHDR:dynstr_off] = phdrs
    out[dynstr_off:dynstr_off + len(dynstr)] = dynstr
    out[dynamic_off:dynamic_off + len(dynamic)] = dynamic
    out[shstrtab_off:shstrtab_off + len(shstrtab)] = shstrtab
    out[shoff:] = shdrs
    return bytes(out)
