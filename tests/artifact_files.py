"""A small real artifact, and the archive edits the crafted-artifact tests make.

Used by tests/test_hostile_artifact.py and tests/test_artifact_manifest.py: `record_scaled`
records a model with one weight under two call groups and saves its artifact; `entries` and
`write_entries` read an archive's entries and write them back as torch's PT2 writer does
(stored, aligned), so that an edited archive differs from `save`'s only by the edit.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch.export.pt2_archive import PT2ArchiveWriter

import capture
import replay

__all__ = ["Scaled", "record_scaled", "entries", "write_entries", "reseal"]

_WRITER_MADE = {".data/version", ".data/serialization_id", "byteorder"}


class Scaled(torch.nn.Module):
    """One weight, two call groups: ``g0`` without a mask, ``g1`` with one."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(3, 3)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        y = self.proj(x)
        return y if mask is None else y * mask


def record_scaled(root: Path) -> tuple[Path, Path]:
    """Records `Scaled` (model name ``scaled``) and saves its artifact: ``(store, artifact)``."""
    torch.manual_seed(0)
    model = Scaled()
    with capture.Recorder(model, root / "store", name="scaled"), torch.no_grad():
        for b in (2, 3, 4):
            model(torch.randn(b, 3))
        for b in (2, 3):
            model(torch.randn(b, 3), mask=torch.ones(b, 3))
    path = root / "scaled.pt2"
    replay.export(model, root / "store", probes=0).save(path)
    return root / "store", path


def entries(path: Path) -> dict[str, bytes]:
    """Every entry of an archive, by its name under the root folder."""
    import zipfile

    with zipfile.ZipFile(path) as z:
        root = z.namelist()[0].split("/")[0]
        return {n[len(root) + 1 :]: z.read(n) for n in z.namelist()}


def reseal(content: dict[str, bytes]) -> None:
    """Rewrites the manifest's digests to describe `content` as it now is: what an attacker who
    edits the archive also does (a digest identifies a file; it is not a signature), so the
    checks behind the digests are what the edit meets."""
    import json

    from replay.runtime.digests import digest_bytes
    from replay.runtime.pt2.archive import MANIFEST

    try:
        manifest = json.loads(content[MANIFEST])
    except (KeyError, ValueError, RecursionError):
        return
    if not isinstance(manifest, dict) or not isinstance(manifest.get("digests"), dict):
        return
    markers = {"archive_format", "archive_version", MANIFEST, *_WRITER_MADE}
    manifest["digests"] = {
        name: digest_bytes(data) for name, data in content.items() if name not in markers
    }
    content[MANIFEST] = json.dumps(manifest).encode()


def write_entries(path: Path, content: dict[str, bytes], *, sealed: bool = True) -> Path:
    """Writes entries as `save` does (torch's PT2 writer adds its own format records), the
    manifest's digests rewritten to describe them (`reseal`) unless `sealed` is False."""
    if sealed:
        content = dict(content)
        reseal(content)
    with open(path, "wb") as f, PT2ArchiveWriter(f) as writer:
        for name, data in content.items():
            if name not in _WRITER_MADE:
                writer.write_bytes(name, data)
    return path
