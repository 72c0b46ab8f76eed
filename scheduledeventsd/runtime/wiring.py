"""What the daemon is built from, chosen by its configuration: the cloud's metadata client, the
etcd coordinator and slot keeper, and the Pacemaker drainer.

Building them here keeps the daemon's loop free of per-cloud and per-cluster choices, and keeps
`providers/` and `coordination/` from reading the whole configuration: each is handed only its
own settings. etcd's and Pacemaker's modules are imported only when configured.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Optional

from ..config import Config, Pacemaker, schema
from ..config.provider import Provider
from ..engine import Message
from ..host.hooks import ProcessRunner

if TYPE_CHECKING:
    from ..coordination.drainer import Drainer
    from ..coordination.peers import EtcdCoordinator
    from ..coordination.slots import SlotKeeper
    from ..providers.imds import MetadataClient


def client_for(config: Config) -> MetadataClient:
    """The provider's client; nothing else in the daemon knows which cloud it is in."""
    md = config.metadata
    if config.provider is Provider.AWS:
        from ..providers.aws import AwsClient  # noqa: PLC0415 - one cloud's client is loaded

        return AwsClient(md.url, md.timeout, md.first_call_timeout, config.vm_name)
    if config.provider is Provider.GCP:
        from ..providers.gcp import GcpClient  # noqa: PLC0415

        return GcpClient(md.url, md.timeout, md.first_call_timeout, config.vm_name)
    from ..providers.imds import ImdsClient  # noqa: PLC0415

    return ImdsClient(md.url, md.api_version, md.timeout, md.first_call_timeout)


def coordinator(config: Config, send: Callable[[Message], None]) -> Optional[EtcdCoordinator]:
    etcd = config.coordination.etcd if config.coordination else None
    if etcd is None:
        return None
    from ..coordination.peers import EtcdCoordinator  # noqa: PLC0415 - only fleets need etcd's client

    # The daemon's one lease (slots and marks) is the coordinator's, of concurrency's ttl.
    ttl = config.concurrency.ttl if config.concurrency else int(schema.number("concurrency.ttl"))
    return EtcdCoordinator(etcd, send, ttl)


def slot_keeper(
    config: Config, send: Callable[[Message], None], coordinator: Optional[EtcdCoordinator]
) -> Optional[SlotKeeper]:
    etcd = config.coordination.etcd if config.coordination else None
    if etcd is None or config.concurrency is None:
        return None
    from ..coordination.slots import SlotKeeper  # noqa: PLC0415 - only fleets need etcd's client

    lease = coordinator.lease if coordinator is not None else None
    return SlotKeeper(etcd, config.concurrency, send, lease)


def drainer(
    config: Config, runner: ProcessRunner, send: Callable[[Message], None]
) -> Optional[Drainer]:
    if config.cluster is None:
        return None
    return drainer_for(config.cluster, runner, send)


def drainer_for(
    settings: Pacemaker, runner: ProcessRunner, send: Callable[[Message], None]
) -> Drainer:
    from ..coordination.drainer import Drainer  # noqa: PLC0415 - only cluster nodes need it

    return Drainer(settings, runner, send)
