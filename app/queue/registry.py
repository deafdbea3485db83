"""Which jobs, crons and queues a process knows: the ones of the feature modules it loads."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from app.core.module import FeatureModule
from app.core.settings import SettingsError
from app.queue.job import CronJob, Job
from app.queue.queues import STARTER_QUEUES, QueueName, queue_names


@dataclass
class JobRegistry:
    modules: list[FeatureModule] = field(default_factory=list)
    jobs: dict[str, type[Job[Any]]] = field(default_factory=dict)
    crons: dict[str, type[CronJob]] = field(default_factory=dict)
    elsewhere: list[FeatureModule] = field(default_factory=list)
    """Modules not loaded here whose queues count as known (jobs waiting there are reported: nothing serves them)."""

    @classmethod
    def from_modules(cls, modules: Iterable[FeatureModule], elsewhere: Iterable[FeatureModule] = ()) -> JobRegistry:
        registry = cls(elsewhere=list(elsewhere))
        for module in modules:
            registry.add_module(module)
        return registry

    def add_module(self, module: FeatureModule) -> None:
        self._check_queues(module)
        self.modules.append(module)
        for job_cls in [*module.jobs, *module.crons]:
            if not (isinstance(job_cls, type) and issubclass(job_cls, Job)):
                raise SettingsError(f"Module {module.name!r} lists {job_cls!r}, which is not a Job class.")
            if job_cls.queue not in STARTER_QUEUES and job_cls.queue not in module.queues:
                raise SettingsError(
                    f"{job_cls.name()} runs on {job_cls.queue!r}, which module {module.name!r} does not declare: "
                    f"add it to the queues of its MODULE, or use one of {', '.join(QueueName)} (app/queue/queues.py)."
                )
            known = self.jobs.get(job_cls.name())
            if known is not None and known is not job_cls:
                raise SettingsError(
                    f"Two job classes are named {job_cls.name()} ({known.__module__} and {job_cls.__module__}): "
                    "a job's name is its class name, so rename one."
                )
            self.jobs[job_cls.name()] = job_cls
            if issubclass(job_cls, CronJob):
                self.crons[job_cls.name()] = job_cls

    def _check_queues(self, module: FeatureModule) -> None:
        """A module's queue is its own: no other loaded module's nor the starter's, and a name ``--queues`` can take."""
        taken = queue_names(self.modules)
        for queue in module.queues:
            if not queue or queue != queue.strip() or "," in queue:
                raise SettingsError(
                    f"Module {module.name!r} declares queue {queue!r}: name it with no comma and no surrounding space "
                    "(--queues takes a comma-separated list), e.g. 'invoices-queue'."
                )
            if queue in taken:
                raise SettingsError(
                    f"Module {module.name!r} declares queue {queue!r}, which is taken already (by the starter or "
                    "another loaded module): give it a name of its own, e.g. after the module."
                )

    def queues(self) -> list[str]:
        """The queues the loaded jobs use: the starter's first, in the order ``QueueName`` lists them, then modules'."""
        used = {job_cls.queue for job_cls in self.jobs.values()}
        return [queue for queue in queue_names(self.modules) if queue in used]

    def known_queues(self) -> list[str]:
        """Every queue of the starter, of the loaded modules and of the modules ``elsewhere``."""
        return queue_names([*self.modules, *self.elsewhere])

    def jobs_on(self, queue: str) -> list[type[Job[Any]]]:
        return [job_cls for job_cls in self.jobs.values() if job_cls.queue == queue]
