"""The executors of the gates' effects: each declares the effects it carries out (`EFFECTS`) and the
settings it is made from; the daemon dispatches an effect of theirs by its type through
`Executors`, remakes an executor when a reload changes its settings, and stops them all at the
end. Wiring a new gate's executor (a class under coordination/) is one line in `WIRED`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Optional, Protocol, Union

from ..config import Config, Pacemaker
from ..engine import (
    AcquireSlot,
    AskCluster,
    CheckCluster,
    ClusterHeld,
    ClusterMark,
    DrainNode,
    GateAnswered,
    HoldSlot,
    Message,
    Record,
    ReleaseSlot,
    RestoreNode,
    SlotFailed,
    StopDraining,
)
from ..host.hooks import ProcessRunner
from . import wiring

if TYPE_CHECKING:
    from ..coordination.drainer import Drainer
    from ..coordination.peers import EtcdCoordinator


@dataclass(frozen=True)
class Context:
    """What an executor is made from: the configuration in force, the daemon's inbox (each
    answer is a message), its hook runner, and etcd's coordinator (its lease) when configured."""

    config: Config
    send: Callable[[Message], None]
    runner: ProcessRunner
    coordinator: Optional[EtcdCoordinator] = None
    say: Optional[Callable[[Record], None]] = None  # a record logged now (the daemon's `_do`)


class Executor(Protocol):
    EFFECTS: ClassVar[tuple[type, ...]]  # the effects it carries out, off the loop

    def __init__(self, context: Context) -> None: ...

    @staticmethod
    def settings(config: Config) -> object:
        """What it is made from: a reload that changes it makes a new one."""

    def do(self, effect: Any) -> None: ...  # noqa: ANN401 - one of EFFECTS

    def stop_all(self) -> None: ...


class Cluster:
    """The Pacemaker drain (coordination/drainer), and the restore of a mark of this daemon's
    once cluster.pacemaker is reloaded away (a drainer made for the mark)."""

    EFFECTS: ClassVar[tuple[type, ...]] = (
        CheckCluster,
        DrainNode,
        StopDraining,
        RestoreNode,
        AskCluster,
    )

    def __init__(self, context: Context) -> None:
        self.context = context
        self.drainer = wiring.drainer(context.config, context.runner, context.send)
        self.restorer: Optional[Drainer] = None  # a mark of ours with no pacemaker configured

    @staticmethod
    def settings(config: Config) -> object:
        return config.cluster

    def do(
        self, effect: Union[CheckCluster, DrainNode, StopDraining, RestoreNode, AskCluster]
    ) -> None:
        if isinstance(effect, RestoreNode):
            if effect.mark is not None:
                self._restorer_for(effect.mark).restore_later(effect.event_id, effect.mark)
            return
        drainer = self.drainer
        if drainer is None:
            detail = "no cluster.pacemaker configured"
            if isinstance(effect, DrainNode):
                self.context.send(ClusterHeld(effect.event.event_id, "tool_failed", detail))
            elif isinstance(effect, AskCluster):
                self.context.send(GateAnswered(effect.run, None, detail=detail))
        elif isinstance(effect, AskCluster):
            drainer.ask(effect)
        elif isinstance(effect, CheckCluster):
            drainer.check()
        elif isinstance(effect, DrainNode):
            drainer.drain(effect)
        else:
            drainer.stop(effect.event_id)

    def _restorer_for(self, mark: ClusterMark) -> Drainer:
        """The drainer, or (`cluster.pacemaker` reloaded away) one made for the mark."""
        if self.drainer is not None:
            return self.drainer
        if self.restorer is None:
            settings = Pacemaker(method=mark.method, attribute=mark.attribute)
            context = self.context
            self.restorer = wiring.drainer_for(settings, context.runner, context.send)
        return self.restorer

    def stop_all(self) -> None:
        """A drain under way stops being watched (its event is held at its deadline); the mark
        stays until its event is over, restored by the new drainer (same node)."""
        for drainer in (self.drainer, self.restorer):
            if drainer is not None:
                drainer.stop_all()


class Slots:
    """The concurrency slots (coordination/slots), under the coordinator's lease. A reload that
    changes them makes a new keeper: the engine asks again through it for every slot asked for
    or held (AcquireSlot follows the reload), a held one taken back at once under its own lease
    while the old lease (not revoked) still keeps it; not held under hold_max: nothing would
    renew that lease, and a slot in keys the new settings do not use would block them as long.
    One held through a maintenance stays on the hold lease (renewed) and is taken back there
    (AcquireSlot `hold`): a daemon killed after the reload keeps it held. A reload that removes
    `concurrency` leaves no keeper: the engine's ReleaseSlot then swaps the daemon's lease back
    to `ttl` without the slot keys nobody holds (it was renewed for as long as the daemon lived)."""

    EFFECTS: ClassVar[tuple[type, ...]] = (AcquireSlot, ReleaseSlot, HoldSlot)

    def __init__(self, context: Context) -> None:
        self.send = context.send
        self.say = context.say
        self.keeper = wiring.slot_keeper(context.config, context.send, context.coordinator)
        self.coordinator = context.coordinator

    @staticmethod
    def settings(config: Config) -> object:
        return (config.coordination, config.concurrency)

    def do(self, effect: Union[AcquireSlot, ReleaseSlot, HoldSlot]) -> None:
        if isinstance(effect, HoldSlot):
            if self.keeper is not None and effect.alive:
                self.keeper.keep(effect.event_id, effect.seconds)
            elif self.keeper is not None:
                self._held(effect, *self.keeper.hold(effect.event_id, effect.seconds))
        elif isinstance(effect, ReleaseSlot):
            if self.keeper is not None:
                self.keeper.release(effect.event_id)
            elif self.coordinator is not None:  # a reload removed concurrency: no keeper
                self.coordinator.lease.drop_unheld()
        elif self.keeper is None:
            self.send(SlotFailed(effect.event.event_id, "internal", "no etcd configured"))
        else:
            self.keeper.acquire(effect)

    def _held(self, effect: HoldSlot, keys: tuple[str, ...], error: str) -> None:
        """Say the stop's hold once etcd has the key on the hold lease, or loudly that it could
        not (the slot, and that it is lost within ttl): never `slot_held` for a hold that failed."""
        record = effect.on_failed if error else effect.on_held
        if record is not None and self.say is not None:
            fields = {**record.fields, "slots": list(keys), "error": error} if error else None
            self.say(record if fields is None else Record(record.level, record.what, fields))

    def stop_all(self) -> None:
        if self.keeper is not None:
            self.keeper.stop_all()


# Every executor the daemon wires, in the order a reload remakes them.
WIRED: tuple[type[Executor], ...] = (Cluster, Slots)


class Executors:
    """The executors in force, by the effect types they carry out."""

    def __init__(self, context: Context, wired: tuple[type[Executor], ...] = WIRED) -> None:
        self.wired = wired
        self.running = [kind(context) for kind in wired]
        self._index()

    def _index(self) -> None:
        self.by_effect = {kind: x for x in self.running for kind in x.EFFECTS}

    def carries(self, effect: object) -> bool:
        return type(effect) in self.by_effect

    def do(self, effect: object) -> None:
        self.by_effect[type(effect)].do(effect)

    def reload(self, old: Config, context: Context) -> None:
        """Each executor whose settings the reload changed is stopped and made anew."""
        for i, kind in enumerate(self.wired):
            if kind.settings(context.config) != kind.settings(old):
                self.running[i].stop_all()
                self.running[i] = kind(context)
        self._index()

    def stop_all(self) -> None:
        for executor in reversed(self.running):
            executor.stop_all()
