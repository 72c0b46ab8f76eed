"""Which name this VM has in an event's Resources.

On scale sets Resources holds `<scaleset>_<instance>`, which the hostname is not (the
hostname of instance 13 ends in `00000D`), so IMDS is asked first and the hostname is only
a fallback that the caller must warn about.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass
from typing import Optional

from .imds import ImdsError, MetadataClient


@dataclass(frozen=True)
class Identity:
    name: str
    source: str  # config | imds | hostname
    problem: str = ""  # why IMDS could not tell, when source is hostname


def resolve(configured: Optional[str], client: MetadataClient) -> Identity:
    if configured:
        return Identity(configured, "config")
    try:
        return Identity(client.fetch_vm_name(), "imds")
    except ImdsError as e:
        return hostname(str(e))


def hostname(problem: str) -> Identity:
    """The last resort, with the reason IMDS could not tell (the caller warns)."""
    return Identity(socket.gethostname(), "hostname", problem)
