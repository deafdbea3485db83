"""Job and cron base classes.

A job is a class: its name is the class name, its queue is a class attribute,
its data is a typed structure (msgspec Struct or dataclass) validated when the
job is read back, and ``handle(data)`` does the work. Dependencies arrive in
the :class:`JobContext` the worker (or the sync driver) builds.

Retries are declared once, as class attributes (``retry_limit``,
``backoff_base_seconds``, ``backoff_cap_seconds``, ``timeout_seconds``); a
value may name a setting instead (``FromSetting("webhook_retry_limit")``), and
``add(..., retry_limit=...)`` overrides the limit for one job.

Tenants of one queue are served in turn (``app.queue.fairness``): a job names
its tenant with ``add(..., tenant_key=...)``, or the class names the field of
its data that holds it (``tenant_field = "workspace_id"``). A job without one
shares the queue's anonymous tenant.
"""

from __future__ import annotations

import typing
from dataclasses import dataclass
from datetime import datetime
from typing import Any, ClassVar, Generic, TypeVar

import msgspec

from app.core import setting_types
from app.core.resources import Resources
from app.core.settings import Settings
from app.queue.queues import QueueName

DataT = TypeVar("DataT")

DEFAULT_RETRY_LIMIT = 5
DEFAULT_BACKOFF_BASE_SECONDS = 5.0
DEFAULT_BACKOFF_CAP_SECONDS = 3600.0
DEFAULT_TIMEOUT_SECONDS = 300

UNLIMITED_RETRIES = 1_000_000
"""A ``retry_limit`` that never runs out, for a job that schedules its own retries and ends itself (a Stripe
sync), and arq's own count of tries (our limits travel with each job). No job lives that long: its queued key
expires after ``app.queue.retry.MAX_EXPIRES_SECONDS`` whatever its limit, and recovery queues its work again."""


@dataclass(frozen=True)
class FromSetting:
    """A class attribute read from a setting when the job runs (e.g. ``FromSetting("webhook_retry_limit")``)."""

    field: str

    def resolve(self, settings: Settings) -> Any:
        return getattr(settings, self.field)


@dataclass(frozen=True)
class RetryPolicy:
    retry_limit: int = DEFAULT_RETRY_LIMIT
    backoff_base_seconds: float = DEFAULT_BACKOFF_BASE_SECONDS
    backoff_cap_seconds: float = DEFAULT_BACKOFF_CAP_SECONDS
    timeout_seconds: int = DEFAULT_TIMEOUT_SECONDS


@dataclass(frozen=True)
class JobContext:
    """What a running job gets: shared resources and who it is."""

    resources: Resources
    job_id: str
    attempt: int
    retry_limit: int
    queue_name: str
    trace_context: str | None = None
    """The trace it continues (tracing on): the one it was queued in, or its inbox event's."""


def _value(value: Any, settings: Settings) -> Any:
    return value.resolve(settings) if isinstance(value, FromSetting) else value


class Job(Generic[DataT]):
    """Base of every job. Subclass as ``class MyJob(Job[MyJobData])`` and set ``queue``."""

    queue: ClassVar[str] = QueueName.DEFAULT
    retry_limit: ClassVar[int | FromSetting] = DEFAULT_RETRY_LIMIT
    backoff_base_seconds: ClassVar[float | FromSetting] = DEFAULT_BACKOFF_BASE_SECONDS
    backoff_cap_seconds: ClassVar[float | FromSetting] = DEFAULT_BACKOFF_CAP_SECONDS
    timeout_seconds: ClassVar[int | FromSetting] = DEFAULT_TIMEOUT_SECONDS
    data_type: ClassVar[type[Any]]
    tenant_field: ClassVar[str | None] = None
    """The field of the job's data that says whose work it is (a workspace id...): tenants are served in turn."""
    fair: ClassVar[bool] = True
    """False: a job asked for now is placed by the time it was asked for, not its tenant's turn (the Stripe
    syncs, each queued for its reservation of the API budget)."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        for base in getattr(cls, "__orig_bases__", ()):
            if typing.get_origin(base) is not None and issubclass(typing.get_origin(base), Job):
                (arg,) = typing.get_args(base)
                if not isinstance(arg, TypeVar):
                    cls.data_type = arg

    def __init__(self, context: JobContext) -> None:
        self.context = context
        self.resources = context.resources

    @classmethod
    def name(cls) -> str:
        return cls.__name__

    @classmethod
    def retry_policy(cls, settings: Settings) -> RetryPolicy:
        """The class attributes, with settings read where they name one."""
        return RetryPolicy(
            retry_limit=_value(cls.retry_limit, settings),
            backoff_base_seconds=_value(cls.backoff_base_seconds, settings),
            backoff_cap_seconds=_value(cls.backoff_cap_seconds, settings),
            timeout_seconds=_value(cls.timeout_seconds, settings),
        )

    @classmethod
    def tenant_of(cls, encoded: Any) -> str | None:
        """The tenant named by ``tenant_field`` in the job's encoded data (None: the queue's anonymous tenant)."""
        if cls.tenant_field is None or not isinstance(encoded, dict):
            return None
        value = encoded.get(cls.tenant_field)
        return None if value is None else str(value)

    @classmethod
    def encode_data(cls, data: DataT) -> Any:
        if not isinstance(data, cls.data_type):
            raise TypeError(f"{cls.name()} takes {cls.data_type.__name__}, got {type(data).__name__}")
        return msgspec.to_builtins(data)

    @classmethod
    def decode_data(cls, raw: Any) -> DataT:
        """Validate queued data against the job's data type (raises ``msgspec.ValidationError``)."""
        return typing.cast(DataT, msgspec.convert(raw, cls.data_type, strict=False))

    async def handle(self, data: DataT) -> None:
        raise NotImplementedError


class CronTick(msgspec.Struct, frozen=True):
    """The data of a cron run: which tick (UTC) it is for."""

    slot: datetime


class CronJob(Job[CronTick]):
    """A job run on a 5-field cron pattern read in UTC: set ``pattern``, or ``pattern = FromSetting(...)``.

    A pattern written on the class is checked when the class is defined (at
    import), so a typo fails the start, not the first tick; one read from a
    setting is checked with the settings.
    """

    queue: ClassVar[str] = QueueName.CRON
    pattern: ClassVar[str | FromSetting]

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if not hasattr(cls, "pattern"):
            raise TypeError(f'{cls.__name__} must set `pattern = "<5-field cron>"` or `pattern = FromSetting(...)`.')
        if "pattern" in cls.__dict__ and isinstance(cls.pattern, str):
            setting_types.cron_pattern(f"{cls.__name__}.pattern", cls.pattern)

    @classmethod
    def schedule(cls, settings: Settings) -> str:
        """The pattern to run on (already checked, with the class or with the settings)."""
        return str(_value(cls.pattern, settings))
