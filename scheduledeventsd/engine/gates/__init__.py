"""The gates an event passes, in order, before its before-hooks: window, slot, drain."""
