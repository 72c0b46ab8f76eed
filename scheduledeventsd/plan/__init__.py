"""`scheduledeventsd plan`: a maintenance wave replayed over a whole fleet on the daemon's own
engine, on a simulated clock, before it happens (issue 30).

    fleet.py     FLEET.yaml to frozen dataclasses, every problem named by file and key path
    world.py     the simulated parts: the metadata documents, hook runs, slots, drains, peers
    timeline.py  what was seen happen to each VM's event, as the loop saw it
    run.py       the discrete-event loop: `engine.step` per VM, its effects carried out
    report.py    rows and summary as data (the JSON shape), and the text and JSON renderings
    svg.py       the JSON drawn as one SVG: a lane per VM, windows, slots, NotBefore
    axis.py      the SVG's time axis: idle days cut short, round UTC ticks
"""
