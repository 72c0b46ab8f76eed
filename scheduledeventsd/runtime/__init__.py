"""The daemon: its loop (carrying out the engine's effects), the lanes its IMDS calls travel
on, what it is built from (wiring), its log, systemd's notifications, and the hook rehearsal."""
