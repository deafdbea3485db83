"""Which jobs and crons a process knows: the ones of the feature modules it loads."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from app.core.module import FeatureModule
from app.core.settings import SettingsError
from app.queue.job import CronJob, Job
from app.queue.queues import QueueName


@dataclass
class JobRegistry:
    modules: list[FeatureModule] = field(default_factory=list)
    jobs: dict[str, type[Job[Any]]] = field(default_factory=dict)
    crons: dict[str, type[CronJob]] = field(default_factory=dict)

    @classmethod
    def from_modules(cls, modules: Iterable[FeatureModule]) -> JobRegistry:
        registry = cls()
        for module in modules:
            registry.add_module(module)
        return registry

    def add_module(self, module: FeatureModule) -> None:
        self.modules.append(module)
        for job_cls in [*module.jobs, *module.crons]:
            if not (isinstance(job_cls, type) and issubclass(job_cls, Job)):
                raise SettingsError(f"Module {module.name!r} lists {job_cls!r}, which is not a Job class.")
            known = self.jobs.get(job_cls.name())
            if known is not None and known is not job_cls:
                raise SettingsError(
                    f"Two job classes are named {job_cls.name()} ({known.__module__} and {job_cls.__module__}): "
                    "a job's name is its class name, so rename one."
                )
            self.jobs[job_cls.name()] = job_cls
            if issubclass(job_cls, CronJob):
                self.crons[job_cls.name()] = job_cls

    def queues(self) -> list[QueueName]:
        """The queues the loaded jobs use, in the order ``QueueName`` declares them."""
        used = {job_cls.queue for job_cls in self.jobs.values()}
        return [queue for queue in QueueName if queue in used]

    def jobs_on(self, queue: str) -> list[type[Job[Any]]]:
        return [job_cls for job_cls in self.jobs.values() if job_cls.queue == queue]
