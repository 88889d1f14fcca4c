"""Draw an autoscaling timeline written by e2e/test_real_journey.py: engine replicas (desired and
ready) and the deployment's queue depth over time, with the loop's events marked.

    python tools/plot_autoscaling.py docs/autoscaling-timeline.json docs/autoscaling-timeline.png

The events are labelled in a band above the plots, each label on the first row where its box overlaps
no other label's (events at the same second share one label); drawing fails rather than write a
figure whose labels overlap or leave it. matplotlib is one of the `test` extras
(tests/test_plot_autoscaling.py draws the committed timeline).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

#: Events closer than this (seconds) share a label: "HPA decision" and "new pod scheduled" often do.
SAME_TIME = 0.5
LABEL_ROWS = 5
#: Display pixels kept free around each label box.
PAD = 3.0


class LabelsOverlap(ValueError):
    """The events' labels cannot all be placed without overlapping within LABEL_ROWS rows."""


def events(marks: dict[str, float]) -> list[tuple[float, str]]:
    """The marks in time order, those within SAME_TIME of the previous one joined into one label."""
    grouped: list[tuple[float, list[str]]] = []
    for what, at in sorted(marks.items(), key=lambda kv: (kv[1], kv[0])):
        if grouped and at - grouped[-1][0] < SAME_TIME:
            grouped[-1][1].append(what)
        else:
            grouped.append((at, [what]))
    return [(at, " + ".join(names)) for at, names in grouped]


def plot(timeline: Path, out: Path) -> list[Any]:
    """Draw ``timeline`` into ``out``; returns the labels' boxes (display coordinates, matplotlib Bbox)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    data = json.loads(timeline.read_text())
    samples = data["samples"]
    t = [s["t"] for s in samples]
    fig, (band, top, bottom) = plt.subplots(
        3, 1, sharex=True, figsize=(10, 7), height_ratios=(0.8, 1, 1.3), layout="constrained"
    )
    top.step(t, [s["replicas"] for s in samples], where="post", label="replicas (HPA)", color="tab:blue")
    top.step(t, [s["ready"] for s in samples], where="post", label="ready", color="tab:green", ls="--")
    top.set_ylabel("engine replicas")
    top.set_ylim(0, data["maxReplicas"] + 0.5)
    top.set_yticks(range(0, data["maxReplicas"] + 1))
    top.legend(loc="lower right")
    queue = [(s["t"], s["queue"]) for s in samples if s["queue"] is not None]
    bottom.plot([q[0] for q in queue], [q[1] for q in queue], color="tab:red", label="requests waiting (sum)")
    bottom.axhline(data["targetQueueDepth"], color="tab:gray", ls=":", label="target per pod")
    bottom.set_ylabel("queue depth")
    bottom.set_xlabel("seconds since load start")
    bottom.legend(loc="upper right")
    band.set_ylim(0, LABEL_ROWS)
    band.axis("off")
    fig.suptitle(f"Queue-depth autoscaling on the dev cluster's real node ({data['clients']} clients)")
    fig.canvas.draw()  # the layout is fixed from here on: label boxes are measured against it
    boxes = _place_labels(fig, band, events(data["marks"]))
    for at, _ in events(data["marks"]):
        for ax in (top, bottom):
            ax.axvline(at, color="black", alpha=0.25, lw=0.8)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return boxes


def _place_labels(fig: Any, band: Any, marks: list[tuple[float, str]]) -> list[Any]:
    """Each label on the first row (from the bottom of the band) where it overlaps no placed label and
    stays inside the band's width, left-aligned at its time or, near the right edge, right-aligned."""
    renderer = fig.canvas.get_renderer()
    area = band.get_window_extent(renderer)
    placed: list[Any] = []
    for at, text in marks:
        label = band.text(at, 0, f" {text} ", fontsize=8, va="bottom", clip_on=False)
        box = _first_free_row(label, renderer, area, placed)
        if box is None:
            raise LabelsOverlap(f"no free row for the label {text!r} at {at:.1f} s in {LABEL_ROWS} rows")
        row_y = label.get_position()[1]
        band.plot([at, at], [0, row_y], color="black", alpha=0.25, lw=0.8)
        placed.append(box)
    return placed


def _first_free_row(label: Any, renderer: Any, area: Any, placed: list[Any]) -> Any | None:
    at = label.get_position()[0]
    for row in range(LABEL_ROWS):
        for align in ("left", "right"):
            label.set_position((at, row + 0.15))
            label.set_horizontalalignment(align)
            box = label.get_window_extent(renderer).expanded(1, 1).padded(PAD)
            inside = box.x0 >= area.x0 - PAD and box.x1 <= area.x1 + PAD
            if inside and not any(box.overlaps(other) for other in placed):
                return box
    return None


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    plot(Path(sys.argv[1]), Path(sys.argv[2]))
