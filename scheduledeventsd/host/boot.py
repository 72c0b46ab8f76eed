"""Which boot this is, as the kernel numbers it."""

from __future__ import annotations

BOOT_ID = "/proc/sys/kernel/random/boot_id"


def boot_id(path: str = BOOT_ID) -> str:
    """Which boot this is: a different one than when an event's hooks started means the VM
    rebooted (or was redeployed) meanwhile."""
    try:
        with open(path, encoding="ascii") as f:
            return f.read().strip()
    except (OSError, UnicodeDecodeError):
        return ""
