"""Which cloud this VM runs in, read from the machine's own DMI data, never from the network.

Azure stays the reference: AWS and Google Cloud notices are mapped at the edge (aws.py, gcp.py)
into the same events, so the engine only learns whether the provider can approve.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

# The provider setting and its detection live with the configuration (which imports nothing
# above it); named here too, where the rest of the daemon looks for them.
from .config.provider import DEFAULT_URLS, DMI_DIR, Detected, Provider, detect

if TYPE_CHECKING:
    from .config import Config
    from .imds import MetadataClient

__all__ = [
    "DEFAULT_URLS",
    "DMI_DIR",
    "DOCUMENTATION",
    "Detected",
    "Provider",
    "client_for",
    "detect",
]

DOCUMENTATION = {
    Provider.AZURE: "https://learn.microsoft.com/azure/virtual-machines/linux/scheduled-events",
    Provider.AWS: "https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/instancedata-data-categories.html",
    Provider.GCP: "https://cloud.google.com/compute/docs/metadata/predefined-metadata-keys",
}


def client_for(config: Config) -> MetadataClient:
    """The provider's client; nothing else in the daemon knows which cloud it is in."""
    md = config.metadata
    if config.provider is Provider.AWS:
        from .aws import AwsClient  # noqa: PLC0415 - only the cloud in use is imported

        return AwsClient(md.url, md.timeout, md.first_call_timeout, config.vm_name)
    if config.provider is Provider.GCP:
        from .gcp import GcpClient  # noqa: PLC0415

        return GcpClient(md.url, md.timeout, md.first_call_timeout, config.vm_name)
    from .imds import ImdsClient  # noqa: PLC0415

    return ImdsClient(md.url, md.api_version, md.timeout, md.first_call_timeout)
