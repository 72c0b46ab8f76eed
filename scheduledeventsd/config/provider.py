"""Which cloud the configuration means: the `provider` setting, and `auto`'s answer read from the
machine's own DMI data (never the network).

Here, not in providers.py, so that the configuration imports nothing above it: providers.py
builds the metadata client from a Config (issue 27: the two imported each other).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from pathlib import Path

DMI_DIR = Path("/sys/class/dmi/id")
# Azure's VMs carry this chassis asset tag (Hyper-V hosts elsewhere do not).
AZURE_ASSET_TAG = "7783-7084-3265-9085-8269-3286-77"


class Provider(str, enum.Enum):
    AZURE = "azure"
    AWS = "aws"
    GCP = "gcp"

    @property
    def can_approve(self) -> bool:
        """Only Azure takes an early start through the metadata service (AWS has none; Google
        Cloud's is the Compute API's, with credentials this daemon does not hold)."""
        return self is Provider.AZURE


DEFAULT_URLS = {
    Provider.AZURE: "http://169.254.169.254/metadata/scheduledevents",
    Provider.AWS: "http://169.254.169.254",
    Provider.GCP: "http://metadata.google.internal/computeMetadata/v1",
}


@dataclass(frozen=True)
class Detected:
    provider: Provider
    why: str  # what in the DMI data said so (check-config prints it)


def detect(dmi_dir: Path = DMI_DIR) -> Detected:
    """The cloud the DMI data names; Azure (the reference) when it names none."""
    fields = {name: _read(dmi_dir / name) for name in _FIELDS}
    vendor, product = fields["sys_vendor"], fields["product_name"]
    bios, version = fields["bios_vendor"], fields["product_version"]
    if vendor == "Google" or product == "Google Compute Engine":
        return Detected(Provider.GCP, f"{_shown(dmi_dir, 'sys_vendor')}={vendor!r}")
    if vendor.startswith("Amazon EC2") or "amazon" in version.lower() or bios == "Amazon EC2":
        which = "sys_vendor" if vendor.startswith("Amazon") else "product_version"
        return Detected(Provider.AWS, f"{_shown(dmi_dir, which)}={fields[which]!r}")
    if fields["chassis_asset_tag"] == AZURE_ASSET_TAG:
        return Detected(Provider.AZURE, f"{_shown(dmi_dir, 'chassis_asset_tag')} is Azure's")
    if vendor == "Microsoft Corporation":
        return Detected(Provider.AZURE, f"{_shown(dmi_dir, 'sys_vendor')}={vendor!r}")
    named = vendor or "nothing"
    return Detected(Provider.AZURE, f"the DMI data names no cloud (sys_vendor: {named}): Azure")


_FIELDS = (
    "sys_vendor",
    "product_name",
    "product_version",
    "bios_vendor",
    "chassis_asset_tag",
)


def _read(path: Path) -> str:
    """One DMI field, "" when absent or unreadable (containers, other kernels)."""
    try:
        return path.read_text(encoding="utf-8", errors="replace")[:256].strip()
    except (OSError, ValueError):
        return ""


def _shown(dmi_dir: Path, name: str) -> str:
    return str(dmi_dir / name)
