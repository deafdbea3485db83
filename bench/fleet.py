"""The product's processes a phase runs against: it asks the run's fleet for them rather than starting them.

A phase says what it needs, and the fleet starts what is missing::

    url = await run.fleet.api()                                    # the API (a launcher: another kind)
    workers = await run.fleet.workers(2, queues=STRIPE_QUEUES)     # 2 workers serving these queues, polling
    ...
    await run.fleet.release_workers()                              # done with them (the next phase may differ)

Workers are of one kind at a time (the queues they serve, the launcher that
runs them): asking for another kind stops the running ones first, so no
worker of an earlier phase takes a later phase's jobs; asking for the same
kind keeps them and starts more up to ``count``. Every process gets the run's
settings (``Run.env``, which point Stripe at the run's stub, ``run.stripe``).

In a run that keeps its processes (``--smoke``: ``Mode.keep_processes``),
each is started once, when a phase first needs it, and stopped at the end:
every worker serves the queues the phases use (``KEPT_QUEUES``, so one kind
fits every phase; a phase asking for another queue has them started again
with it), a request for more workers adds them, and the releases are no-ops.
Its figures then come from processes that served earlier phases, which a
smoke run does not read. A phase whose jobs no worker may take queues them
where no worker looks (``Run.unserved``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field

from app.identity.jobs import IDENTITY_QUEUE
from app.queue.queues import QueueName
from app.testing.processes import free_port
from bench.processes import Managed, Processes

KEPT_QUEUES = (
    *(str(queue) for queue in (QueueName.WEBHOOK_CLERK, QueueName.WEBHOOK_STRIPE, QueueName.STRIPE_SYNC)),
    IDENTITY_QUEUE,
)
"""What a kept worker serves at first: the queues the phases' jobs use (each queue served costs an idle worker CPU
in polls; not the crons', whose ticks on their own schedule would disturb the crons phase)."""


@dataclass(frozen=True)
class WorkerKind:
    queues: tuple[str, ...] | None  # None: every queue of the modules it loads
    launcher: tuple[str, ...]
    env: tuple[tuple[str, str], ...] = ()  # settings of its own over the run's (the outage's shrunk retries)


@dataclass
class Fleet:
    processes: Processes
    env: Mapping[str, str]
    keep: bool
    api_workers: int
    wait_ready: Callable[[list[Managed], str], Awaitable[None]]
    """Until every worker given is polling the queue given (``Run``: a ping job on that queue)."""
    apis: dict[tuple[tuple[str, ...], tuple[tuple[str, str], ...]], tuple[str, Managed]] = field(default_factory=dict)
    running: list[Managed] = field(default_factory=list)
    kind: WorkerKind | None = None

    async def api(self, launcher: Sequence[str] = (), env: Mapping[str, str] | None = None) -> str:
        """The base URL of the API run by ``launcher`` (``python -m`` arguments; none: the product as shipped) with
        ``env`` over the run's settings, started if it is not running."""
        key = _api_key(launcher, env)
        if key not in self.apis:
            name = "api" + (f"-{_launched_module(key[0])}" if key[0] else "") + ("-env" if key[1] else "")
            settings = {**self.env, **dict(key[1])}
            self.apis[key] = await asyncio.to_thread(
                self.processes.start_uvicorn, "api", name, "app.asgi:create_app", settings, self.api_workers, key[0]
            )
        return self.apis[key][0]

    def api_process(self, launcher: Sequence[str] = (), env: Mapping[str, str] | None = None) -> Managed:
        return self.apis[_api_key(launcher, env)][1]

    async def release_api(self) -> None:
        """Done with the APIs: stopped (their connections are not needed any more), unless the run keeps them."""
        if self.keep:
            return
        for _, managed in self.apis.values():
            await asyncio.to_thread(self.processes.stop, managed)
        self.apis.clear()

    async def workers(
        self,
        count: int = 1,
        queues: Sequence[str] | None = None,
        launcher: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
    ) -> list[Managed]:
        """At least ``count`` workers (exactly, unless the run keeps its processes) serving ``queues`` (None:
        every queue), run by ``launcher`` with ``env`` over the run's settings, polling; returns every running
        one. Other settings are another kind of worker: a kept one is started again with them."""
        if self.keep:  # the kept workers' queues, and any other asked for (None: those)
            served = self.kind.queues if self.kind is not None and self.kind.queues else KEPT_QUEUES
            queues = (*served, *(queue for queue in queues or () if queue not in served))
        kind = WorkerKind(tuple(queues) if queues else None, tuple(launcher), tuple(sorted((env or {}).items())))
        if kind != self.kind:
            await self._stop_all()
            self.kind = kind
        started = []
        while len(self.running) < count:
            name = f"worker{len(self.processes.running) + len(self.processes.stopped) + 1}"
            port = free_port()  # each its own /metrics, which the metrics phase scrapes
            settings = {**self.env, **dict(kind.env), "WORKER_METRICS_PORT": str(port)}
            worker = await asyncio.to_thread(
                self.processes.start_worker,
                name,
                settings,
                ["--module", "bench.jobs:MODULE"],
                kind.launcher,
                kind.queues,
            )
            worker.metrics_url = f"http://127.0.0.1:{port}/metrics"
            started.append(worker)
            self.running.append(worker)
        if started:
            await self.wait_ready(started, kind.queues[0] if kind.queues else str(QueueName.WEBHOOK_CLERK))
        return list(self.running)

    async def release_workers(self) -> None:
        """Done with the workers: stopped, unless the run keeps them."""
        if not self.keep:
            await self._stop_all()

    async def _stop_all(self) -> None:
        for worker in self.running:
            await asyncio.to_thread(self.processes.stop, worker)
        self.running, self.kind = [], None


def _api_key(
    launcher: Sequence[str], env: Mapping[str, str] | None
) -> tuple[tuple[str, ...], tuple[tuple[str, str], ...]]:
    return tuple(launcher), tuple(sorted((env or {}).items()))


def _launched_module(launcher: Sequence[str]) -> str:
    """The last part of the module a launcher runs (``-m bench.from_tree DIR``: ``from_tree``): a log's name."""
    module = launcher[launcher.index("-m") + 1] if "-m" in launcher[:-1] else launcher[-1]
    return module.rsplit(".", 1)[-1]
