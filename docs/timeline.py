"""Draw the life of one Reboot as scheduledeventsd handles it: docs/reboot-timeline.svg.

    .venv/bin/python docs/timeline.py

Times are the typical ones from Microsoft's documentation (a 15 minute approval window, about
7 s of impact, `Started` for some minutes before the event leaves the document); the stages and
their order are the daemon's (README, "Lifecycle").
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

OUT = Path(__file__).with_name("reboot-timeline.svg")

# (start s, end s, row, label, colour)
SPANS = [
    (0, 62, 0, "Scheduled (15 min notice)", "#c6dbef"),
    (62, 69, 0, "", "#fd8d3c"),
    (69, 300, 0, "Started: the reboot (~7 s), then listed for minutes", "#fdd0a2"),
    (1, 60, 1, "before: drain, checkpoint", "#74c476"),
    (75, 95, 1, "after: undrain", "#9e9ac8"),
]
# (at s, row, label)
MARKS = [
    (0.5, 0, "detected within a poll"),
    (60, 2, "approved (POST) as the last hook exits: maintenance starts now, not in 15 min"),
    (75, 1, "daemon up on a new boot_id: reboot_detected"),
    (300, 0, "left the document: over; after-hooks already ran, never twice"),
]
ROWS = ["IMDS", "hooks", "approval"]


def main() -> None:
    fig, ax = plt.subplots(figsize=(10, 2.8))
    for start, end, row, label, colour in SPANS:
        ax.barh(row, end - start, left=start, height=0.5, color=colour, edgecolor="#555")
        ax.text(start + 2, row, label, va="center", fontsize=8)
    for at, row, label in MARKS:
        ax.plot([at], [row - 0.3], marker="v", color="#333")
        ax.text(at, row - 0.4, label, fontsize=7, ha="left" if at < 250 else "right")
    ax.set_yticks(range(len(ROWS)), ROWS)
    ax.set_xlim(-5, 310)
    ax.set_ylim(2.5, -0.9)
    ax.set_xlabel("seconds since the event appeared (typical times)")
    ax.set_title("One Reboot, approved early after its hooks, then undrained after the reboot")
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    fig.savefig(OUT, metadata={"Date": None})
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
