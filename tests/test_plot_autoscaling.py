"""tools/plot_autoscaling.py draws docs/autoscaling-timeline.png with labels that never overlap."""

from __future__ import annotations

import importlib.util
import itertools
import json
from pathlib import Path

import pytest

from qwen_devtools.repo import REPO

spec = importlib.util.spec_from_file_location("plot_autoscaling", REPO / "tools" / "plot_autoscaling.py")
assert spec and spec.loader
plot_autoscaling = importlib.util.module_from_spec(spec)
spec.loader.exec_module(plot_autoscaling)
TIMELINE = REPO / "docs" / "autoscaling-timeline.json"


def test_the_committed_timeline_draws_with_disjoint_labels_inside_the_figure(tmp_path: Path) -> None:
    out = tmp_path / "timeline.png"
    boxes = plot_autoscaling.plot(TIMELINE, out)
    assert out.stat().st_size > 10_000
    marks = json.loads(TIMELINE.read_text())["marks"]
    assert len(boxes) == len(plot_autoscaling.events(marks)) >= 5
    for a, b in itertools.combinations(boxes, 2):
        assert not a.overlaps(b), (a, b)


def test_events_at_the_same_second_share_a_label() -> None:
    events = plot_autoscaling.events({"b": 10.7, "a": 10.7, "load stop": 13.7, "load start": 0.0})
    assert events == [(0.0, "load start"), (10.7, "a + b"), (13.7, "load stop")]


def test_labels_that_cannot_be_placed_fail_the_drawing(tmp_path: Path) -> None:
    data = json.loads(TIMELINE.read_text())
    data["marks"] = {f"a rather long event label number {i}": 50 + i for i in range(12)}
    crowded = tmp_path / "crowded.json"
    crowded.write_text(json.dumps(data))
    with pytest.raises(plot_autoscaling.LabelsOverlap):
        plot_autoscaling.plot(crowded, tmp_path / "crowded.png")
