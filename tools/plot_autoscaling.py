"""Draw an autoscaling timeline written by e2e/test_real_autoscaling.py: engine replicas (desired and
ready) and the deployment's queue depth over time, with the loop's events marked.

    pip install matplotlib   # only this script needs it
    python tools/plot_autoscaling.py .devcluster/autoscaling-timeline.json \
        docs/autoscaling-timeline.png
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def plot(timeline: Path, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    data = json.loads(timeline.read_text())
    samples = data["samples"]
    t = [s["t"] for s in samples]
    fig, (top, bottom) = plt.subplots(2, 1, sharex=True, figsize=(9, 5.5), height_ratios=(1, 1.3))
    top.step(t, [s["replicas"] for s in samples], where="post", label="replicas (HPA)", color="tab:blue")
    top.step(t, [s["ready"] for s in samples], where="post", label="ready", color="tab:green", ls="--")
    top.set_ylabel("engine replicas")
    top.set_ylim(0, data["maxReplicas"] + 0.5)
    top.set_yticks(range(0, data["maxReplicas"] + 1))
    top.legend(loc="upper right")
    queue = [(s["t"], s["queue"]) for s in samples if s["queue"] is not None]
    bottom.plot([q[0] for q in queue], [q[1] for q in queue], color="tab:red", label="requests waiting (sum)")
    bottom.axhline(data["targetQueueDepth"], color="tab:gray", ls=":", label="target per pod")
    bottom.set_ylabel("queue depth")
    bottom.set_xlabel("seconds since load start")
    bottom.legend(loc="upper right")
    for what, at in sorted(data["marks"].items(), key=lambda kv: kv[1]):
        for ax in (top, bottom):
            ax.axvline(at, color="black", alpha=0.25, lw=0.8)
        top.annotate(what, (at, data["maxReplicas"] + 0.45), rotation=90, va="top", ha="right", fontsize=7)
    fig.suptitle(f"Queue-depth autoscaling on the dev cluster's real node ({data['clients']} clients)")
    fig.tight_layout()
    fig.savefig(out, dpi=110)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    plot(Path(sys.argv[1]), Path(sys.argv[2]))
