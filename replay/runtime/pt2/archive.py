"""The artifact's archive as data: every entry checked against what `save` writes, before any read.

An artifact is torch's PT2 archive layout (``torch.export.pt2_archive``), one zip file whose
entries sit under one root folder::

    <root>/archive_format, archive_version, byteorder, .data/version, .data/serialization_id
    <root>/extra/capture_manifest.json              the manifest (`replay.runtime.manifest`)
    <root>/models/<program>.json                    each program's graph (torch's JSON schema)
    <root>/data/sample_inputs/<program>.pt          empty: example inputs are not shipped
    <root>/data/weights/<program>_weights_config.json     per program: parameter/buffer name ->
    <root>/data/constants/<program>_constants_config.json     record, dtype, sizes, strides, offset
    <root>/data/weights/weight_<n>                  raw bytes of one storage, written ONCE and
    <root>/data/constants/tensor_<n>                  named by every program that uses it
    <root>/data/aotinductor/<program>/...           AOTInductor builds (``save(aoti=True)`` only)

`Archive.open` reads the zip's central directory with `zipfile` (nothing is decompressed or
unpickled) and refuses, with one `ArtifactError` naming the entry: duplicate or unsafe names,
compressed or encrypted entries (capture stores every entry as is, so declared sizes are real
sizes and weights can be memory-mapped), entries whose data runs past the end of the file,
links and special files, bytes before the first entry.
`Archive.read` checks an entry's declared size against a cap *before* reading it, and its CRC
after. `check_layout` compares the whole entry list with what the manifest and the payload
configs say `save` wrote: an unknown file (a pickle, an ``opaque_obj_0``, a legacy ``.pt``
weights file, AOTInductor files in an artifact saved without them) is refused by name.
Needs no torch.
"""

from __future__ import annotations

import os
import re
import struct
import zipfile
import zlib
from collections.abc import Iterable
from dataclasses import dataclass
from typing import BinaryIO

from replay.runtime.guards import ArtifactError

__all__ = [
    "Archive",
    "Entry",
    "ARCHIVE_FORMAT",
    "ARCHIVE_VERSION",
    "BYTEORDER",
    "ZIP_VERSION",
    "SERIALIZATION_ID",
    "MANIFEST",
    "MODELS",
    "SAMPLE_INPUTS",
    "WEIGHTS_DIR",
    "CONSTANTS_DIR",
    "WEIGHTS_CONFIG",
    "CONSTANTS_CONFIG",
    "WEIGHT_PREFIX",
    "CONSTANT_PREFIX",
    "AOTI_DIR",
    "PROGRAM_CAP",
    "CONFIG_CAP",
]

# Entry names under the root, as torch 2.13's `torch.export.pt2_archive.constants` spell them
# (tests/test_compat.py checks they still do).
ARCHIVE_FORMAT = "archive_format"
ARCHIVE_VERSION = "archive_version"
BYTEORDER = "byteorder"
ZIP_VERSION = ".data/version"
SERIALIZATION_ID = ".data/serialization_id"
MANIFEST = "extra/capture_manifest.json"
MODELS = "models/{}.json"
SAMPLE_INPUTS = "data/sample_inputs/{}.pt"
WEIGHTS_DIR = "data/weights/"
CONSTANTS_DIR = "data/constants/"
WEIGHTS_CONFIG = "data/weights/{}_weights_config.json"
CONSTANTS_CONFIG = "data/constants/{}_constants_config.json"
WEIGHT_PREFIX = "weight_"
CONSTANT_PREFIX = "tensor_"
AOTI_DIR = "data/aotinductor/"

PROGRAM_CAP = 1024 * 2**20
"""Largest program JSON read (1 GiB declared size)."""
CONFIG_CAP = 256 * 2**20
"""Largest payload config read (256 MiB declared size)."""
_SMALL_CAP = 256
_SMALL = {
    ARCHIVE_FORMAT: (b"pt2",),
    ARCHIVE_VERSION: (b"0",),
    BYTEORDER: (b"little",),
}
_RECORD = re.compile(r"(weight|tensor)_[0-9]{1,9}\Z")
_AOTI_FILE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.+-]{0,199}\Z")
_LOCAL_HEADER = struct.Struct("<4s5H3I2H")
_LOCAL_MAGIC = b"PK\x03\x04"


@dataclass(frozen=True)
class Entry:
    """One stored entry of the archive.

    Attributes:
        name: Its name under the root (``models/decode.json``).
        offset: Where its bytes start in the file.
        size: How many bytes it holds.
        crc: Its CRC-32, from the central directory.
        header: Where its local header starts.
    """

    name: str
    offset: int
    size: int
    crc: int
    header: int = 0


class Archive:
    """An artifact's zip archive, its entries checked (`open`); bytes read with bounds (`read`).

    Attributes:
        path: The file.
        root: The folder every entry sits under.
        entries: Name under the root -> `Entry`.

    Example:
        >>> archive = Archive.open("model.pt2")  # doctest: +SKIP
        >>> sorted(archive.entries)[:2]  # doctest: +SKIP
        ['.data/serialization_id', '.data/version']
    """

    def __init__(self, path: str, root: str, entries: dict[str, Entry]) -> None:
        self.path = path
        self.root = root
        self.entries = entries

    @classmethod
    def open(cls, path: str | os.PathLike[str]) -> Archive:
        """Reads and checks the archive's entry list.

        Raises:
            ArtifactError: No file, not a zip archive, or an entry capture does not write in
                that form (named).
        """
        target = os.fspath(path)
        if not os.path.isfile(target):
            raise ArtifactError(f"no artifact at {target}")
        try:
            with open(target, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                with zipfile.ZipFile(f) as z:
                    infos = z.infolist()
                entries = [_entry(f, info, size, target) for info in infos]
        except (zipfile.BadZipFile, zipfile.LargeZipFile, OSError, ValueError, EOFError) as e:
            raise ArtifactError(f"{target} is not a PT2 archive: {str(e)[:200]}") from None
        if entries and min(e.header for _, e in entries) != 0:
            raise ArtifactError(
                f"{target} is not a PT2 archive as capture writes it: it holds data before its "
                "first entry"
            )
        roots = {name.split("/", 1)[0] for name, _ in entries}
        if len(roots) != 1:
            raise ArtifactError(
                f"{target} is not a PT2 archive: its entries sit under {len(roots)} folders, "
                "not one"
            )
        root = roots.pop()
        table: dict[str, Entry] = {}
        for name, entry in entries:
            inner = name[len(root) + 1 :]
            if not inner:
                raise ArtifactError(f"{target}: the entry {name!r} is not a file")
            if inner in table:
                raise ArtifactError(f"{target}: the entry {name} is in the archive twice")
            table[inner] = Entry(inner, entry.offset, entry.size, entry.crc, entry.header)
        return cls(target, root, table)

    def name(self, inner: str) -> str:
        """``<path>:<root>/<inner>``: how messages name an entry."""
        return f"{self.path}:{self.root}/{inner}"

    def read(self, inner: str, cap: int) -> bytes:
        """The bytes of one entry, its declared size checked against `cap` first.

        Raises:
            ArtifactError: The entry is missing, larger than `cap`, or its CRC is wrong.
        """
        entry = self.entries.get(inner)
        if entry is None:
            raise ArtifactError(f"{self.path} lacks {self.root}/{inner}")
        if entry.size > cap:
            raise ArtifactError(
                f"{self.name(inner)} declares {entry.size} bytes, more than the {cap} an "
                "artifact's file of that kind may hold; it is not read"
            )
        with open(self.path, "rb") as f:
            f.seek(entry.offset)
            data = f.read(entry.size)
        if len(data) != entry.size or zlib.crc32(data) != entry.crc:
            raise ArtifactError(f"{self.name(inner)} is damaged (its checksum does not match)")
        return data

    def check_small_files(self) -> None:
        """Checks torch's format markers (``archive_format`` = pt2, ...).

        Raises:
            ArtifactError: One is missing or says something else.
        """
        for inner, allowed in _SMALL.items():
            if self.read(inner, _SMALL_CAP) not in allowed:
                raise ArtifactError(f"{self.name(inner)} is not what a PT2 archive holds there")
        for inner in (ZIP_VERSION, SERIALIZATION_ID):
            self.read(inner, _SMALL_CAP)

    def check_layout(self, expected: Iterable[str], aoti_programs: Iterable[str] = ()) -> None:
        """Refuses any entry that is not one of `expected` (or an AOTInductor file of one of
        `aoti_programs`), and any expected entry that is missing.

        Raises:
            ArtifactError: Names the first unknown or missing entry.
        """
        wanted = set(expected)
        aoti = {f"{AOTI_DIR}{p}/" for p in aoti_programs}
        missing = sorted(wanted - set(self.entries))
        if missing:
            raise ArtifactError(f"{self.path} lacks {self.root}/{missing[0]}")
        for inner in sorted(self.entries):
            if inner in wanted:
                continue
            folder, _, base = inner.rpartition("/")
            if f"{folder}/" in aoti and _AOTI_FILE.match(base):
                continue
            raise ArtifactError(
                f"{self.name(inner)} is not a file capture writes in an artifact; it is not "
                "read (an artifact holds only its manifest, program graphs, raw weights"
                + (" and AOTInductor builds)" if aoti else ")")
            )
        for program in aoti_programs:
            if not any(name.startswith(f"{AOTI_DIR}{program}/") for name in self.entries):
                raise ArtifactError(
                    f"{self.path} says it holds AOTInductor builds, none for {program}"
                )

    @staticmethod
    def is_record(inner: str) -> bool:
        """True for a raw tensor record name (``data/weights/weight_3``)."""
        folder, _, base = inner.rpartition("/")
        return f"{folder}/" in (WEIGHTS_DIR, CONSTANTS_DIR) and bool(_RECORD.match(base))


def _entry(f: BinaryIO, info: zipfile.ZipInfo, size: int, target: str) -> tuple[str, Entry]:
    """The checked location of one zip entry's bytes."""
    name = info.filename
    if (
        not name
        or name.startswith("/")
        or "\\" in name
        or "\x00" in name
        or any(part in ("", ".", "..") for part in name.split("/"))
    ):
        raise ArtifactError(f"{target}: the entry name {name[:100]!r} is not safe; not read")
    if (info.external_attr >> 16) & 0o170000 not in (0, 0o100000):
        raise ArtifactError(
            f"{target}: the entry {name} is a link or a special file, not a regular file; "
            "capture never writes that"
        )
    if info.flag_bits & 0x1:
        raise ArtifactError(f"{target}: the entry {name} is encrypted; capture never writes that")
    if info.compress_type != zipfile.ZIP_STORED or info.compress_size != info.file_size:
        raise ArtifactError(
            f"{target}: the entry {name} is compressed; capture stores every entry as is "
            "(declared sizes are real sizes), so it is not read"
        )
    f.seek(info.header_offset)
    header = f.read(_LOCAL_HEADER.size)
    if len(header) != _LOCAL_HEADER.size:
        raise ArtifactError(f"{target}: the entry {name} runs past the end of the file")
    fields = _LOCAL_HEADER.unpack(header)
    name_len, extra_len = fields[9], fields[10]
    encoding = "utf-8" if info.flag_bits & 0x800 else "cp437"
    if fields[0] != _LOCAL_MAGIC or f.read(name_len) != info.orig_filename.encode(encoding):
        raise ArtifactError(f"{target}: the entry {name} has a damaged local header")
    offset = info.header_offset + _LOCAL_HEADER.size + name_len + extra_len
    if offset + info.file_size > size:
        raise ArtifactError(f"{target}: the entry {name} runs past the end of the file")
    return name, Entry(name, offset, info.file_size, info.CRC, info.header_offset)
