"""Values that matter beyond their range: special token counts, recorded and put back,
and device value ranges read by the writer thread instead of the serving thread."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

import capture
from capture.analysis.groups import analyze
from capture.record.segment import Segment
from capture.record.tokens import special_token_ids
from capture.record.value_ranges import DeviceRanges
from replay.inputs import rebuild as rb
from replay.inputs import select

IMAGE, START, END = 90, 91, 92


class Captioner(torch.nn.Module):
    """Counts its image tokens, as Qwen2-VL does: features and tokens must agree."""

    def __init__(self) -> None:
        super().__init__()
        self.config = SimpleNamespace(
            image_token_id=IMAGE,
            vision_start_token_id=START,
            vision_end_token_id=END,
            bos_token_id=1,
            pad_token_id=0,
        )

    def forward(self, input_ids: torch.Tensor, image_features: torch.Tensor) -> torch.Tensor:
        n = int((input_ids == IMAGE).sum())
        if n != image_features.shape[0]:
            raise ValueError(f"image tokens {n} != features {image_features.shape[0]}")
        return image_features.sum() + input_ids.float().mean()


def _ids(batch: int, length: int, images: int) -> torch.Tensor:
    ids = torch.randint(3, 80, (batch, length), generator=torch.Generator().manual_seed(length))
    flat = ids.view(-1)
    flat[1], flat[2 : 2 + images], flat[2 + images] = START, IMAGE, END
    return ids


CALLS = [(1, 12, 4), (2, 12, 6), (2, 20, 9)]


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("tokens")
    model = Captioner()
    with capture.Recorder(model, path, name="m", flush_seconds=3600), torch.no_grad():
        for batch, length, images in CALLS:
            model(_ids(batch, length, images), torch.ones(images, 3))
    return path


def test_special_ids_come_from_the_config_without_the_generic_ones() -> None:
    # Attribute-name order; bos and pad are generic (generation handles them).
    assert special_token_ids(Captioner()) == (IMAGE, END, START)


def test_a_model_without_config_counts_nothing() -> None:
    assert special_token_ids(torch.nn.Linear(2, 2)) == ()


def test_counts_are_recorded_after_the_value_ranges(root: Path) -> None:
    with capture.open_store(root) as store:
        value = store.query(
            "SELECT value FROM structures WHERE path = 'args[0]' OR path = 'kwargs[''input_ids'']'"
        ).to_pylist()[0]["value"]
        rows = store.query("SELECT int_min, int_max FROM calls ORDER BY ts").to_pylist()
    where = json.loads(value)["counts"]
    counts = [[row["int_max"][where[str(i)]] for i in (IMAGE, END, START)] for row in rows]
    # per call, how many of each special id production sent.
    assert counts == [[4, 1, 1], [6, 1, 1], [9, 1, 1]]


def test_a_rebuilt_input_holds_the_recorded_special_tokens(root: Path) -> None:
    with capture.open_store(root) as store:
        (group,) = analyze(store, "m")
        ranges = select.value_ranges(store, group)
    for sizes, found in ranges.items():
        args, kwargs = rb.rebuild(group.structure, sizes, found)
        ids = args[0] if args else kwargs["input_ids"]
        features = args[1] if len(args) > 1 else kwargs["image_features"]
        # eager accepts the rebuilt input (Qwen2-VL refuses ids without image tokens).
        assert int((ids == IMAGE).sum()) == features.shape[0]
        assert (int((ids == START).sum()), int((ids == END).sum())) == (1, 1)
        Captioner()(ids, features)


def test_device_ranges_are_read_by_the_segment() -> None:
    tensors = [torch.tensor([[5, IMAGE, 7]]), torch.zeros(0, dtype=torch.int64)]
    table = torch.tensor([IMAGE, END])
    deferred: Any = DeviceRanges(tensors, [0, 1], [(0, (IMAGE, END), table)])
    segment = Segment()
    segment.add((1, 0, "s", None, (1, 3, 0), None, deferred, deferred, 10, None, None))
    table_ = segment.calls_tables("m", "h", 1)
    (calls,) = table_.values()
    # The writer thread resolves the deferred read: ranges, empty tensor, then the counts.
    assert calls.column("int_min").to_pylist() == [[5, None, 1, 0]]
    assert calls.column("int_max").to_pylist() == [[IMAGE, None, 1, 0]]


@pytest.mark.gpu
def test_cuda_value_ranges_need_no_sync_on_the_recording_thread(tmp_path: Path) -> None:
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    model = Captioner().cuda()
    with capture.Recorder(model, tmp_path, name="m", value_ranges="all") as rec:
        model(_ids(2, 12, 6).cuda(), torch.ones(6, 3, device="cuda"))
    rows = capture.open_store(tmp_path).query("SELECT int_max FROM calls").to_pylist()
    assert rec.stats()["recorded"] == 1 and rows[0]["int_max"][1:] == [6, 1, 1]
