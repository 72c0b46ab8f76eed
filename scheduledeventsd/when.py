"""Moved to scheduledeventsd.engine.gates.window; this name keeps working for older imports."""

from __future__ import annotations

from .engine.gates.window import WINDOW_LEAD, Held, fast_hooks, hold, lead, window_lead

__all__ = ["WINDOW_LEAD", "Held", "fast_hooks", "hold", "lead", "window_lead"]
