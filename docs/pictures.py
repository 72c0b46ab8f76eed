"""Draw the pictures of the explanation pages: one maintenance on each cloud
(docs/clouds-timeline.svg) and a tier's hand-off of its one concurrency slot
(docs/fleet-handoff.svg).

    .venv/bin/python docs/pictures.py

The notice times are each cloud's documented ones (Azure: 15 minutes for a Reboot; AWS: 2
minutes for a spot interruption; Google Cloud: 60 seconds for a live migration); the stages and
their order are the daemon's (docs/reference/lifecycle.md, docs/explanation/choosing-when.md).
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

HERE = Path(__file__).parent
NOTICE, HOOKS, GO, AFTER = "#c6dbef", "#74c476", "#fd8d3c", "#9e9ac8"

# One maintenance per cloud, in seconds since the notice appeared:
# (row label, [(start, end, label, colour)], [(at, label)])
CLOUDS = [
    (
        "Azure Reboot",
        [
            (0, 320, "Scheduled: NotBefore at 900 s, off the chart", NOTICE),
            (1, 60, "before-hooks", HOOKS),
            (60, 70, "", GO),
            (75, 110, "after", AFTER),
        ],
        [(60, "approved: starts now, not at NotBefore")],
    ),
    (
        "AWS spot",
        [
            (0, 120, "instance-action: stop in 2 min", NOTICE),
            (1, 40, "before-hooks", HOOKS),
            (120, 130, "", GO),
        ],
        [(120, "AWS stops it at its time (no approval)")],
    ),
    (
        "Google Cloud migration",
        [
            (0, 60, "MIGRATE: ~60 s", NOTICE),
            (0.5, 20, "before", HOOKS),
            (60, 70, "", GO),
            (72, 90, "after", AFTER),
        ],
        [(0.5, "long-poll: seen at once")],
    ),
]

# A tier of three VMs, one slot, a weekend window opening at 0 (minutes):
# (VM, [(start, end, label, colour)])
FLEET = [
    ("vm-1", [(0, 4, "drain", HOOKS), (4, 6, "reboot", GO), (6, 8, "undrain", AFTER)]),
    (
        "vm-2",
        [
            (0, 8, "waits for the slot", NOTICE),
            (8, 12, "drain", HOOKS),
            (12, 14, "reboot", GO),
            (14, 16, "undrain", AFTER),
        ],
    ),
    (
        "vm-3",
        [
            (0, 16, "waits for the slot", NOTICE),
            (16, 20, "drain", HOOKS),
            (20, 22, "reboot", GO),
            (22, 24, "undrain", AFTER),
        ],
    ),
]


def bars(ax: plt.Axes, rows: list[tuple[str, list[tuple[float, float, str, str]]]]) -> None:
    for row, (_, spans) in enumerate(rows):
        for start, end, label, colour in spans:
            ax.barh(row, end - start, left=start, height=0.5, color=colour, edgecolor="#555")
            if label:
                ax.text(start + (end - start) * 0.02, row, label, va="center", fontsize=7)
    ax.set_yticks(range(len(rows)), [name for name, _ in rows])
    ax.invert_yaxis()
    ax.grid(axis="x", alpha=0.3)


def clouds() -> None:
    """Each cloud on two lanes: its notice above, what the daemon and the cloud do below."""
    fig, ax = plt.subplots(figsize=(10, 3.0))
    for row, (_, spans, marks) in enumerate(CLOUDS):
        for start, end, label, colour in spans:
            lane = row - 0.18 if colour == NOTICE else row + 0.18
            ax.barh(lane, end - start, left=start, height=0.32, color=colour, edgecolor="#555")
            if label:
                ax.text(start + 2, lane, label, va="center", fontsize=7)
        for at, label in marks:
            ax.plot([at], [row - 0.45], marker="v", color="#333")
            ax.text(at + 3, row - 0.45, label, fontsize=7, va="center")
    ax.set_yticks(range(len(CLOUDS)), [name for name, _, _ in CLOUDS])
    ax.invert_yaxis()
    ax.grid(axis="x", alpha=0.3)
    ax.set_xlim(0, 320)
    ax.set_xlabel("seconds since the notice appeared (documented notice times)")
    ax.set_title(
        "One maintenance on each cloud: hooks first; Azure alone can be asked to start now"
    )
    fig.tight_layout()
    fig.savefig(HERE / "clouds-timeline.svg", metadata={"Date": None})


def fleet() -> None:
    fig, ax = plt.subplots(figsize=(10, 2.2))
    bars(ax, FLEET)
    ax.set_xlim(0, 25)
    ax.set_xlabel("minutes since the window opened (concurrency: group web, max 1)")
    ax.set_title("A tier hands its one slot on: the next VM starts when the last one is back")
    fig.tight_layout()
    fig.savefig(HERE / "fleet-handoff.svg", metadata={"Date": None})


def main() -> None:
    clouds()
    fleet()
    print(f"wrote {HERE / 'clouds-timeline.svg'} and {HERE / 'fleet-handoff.svg'}")


if __name__ == "__main__":
    main()
