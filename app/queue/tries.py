"""Tries given back: a wait that spends no attempt (``RetryLater.spends_attempt`` False) is not counted as a try.

arq counts every run of a job as a try (``job_try``), waits included. The
worker gives a wait's try back by counting it in a key of our own beside the
job (``<namespace>tries-given-back:<job id>``): the job's attempt is arq's try
less what was given back, so a job that waits for a held upstream a thousand
times still has every one of its retries. The key is read only from a job's
second run on, and deleted when the job ends.
"""

from __future__ import annotations

import contextlib
import logging

from redis.asyncio import Redis
from redis.exceptions import RedisError

from app.queue.errors import RetryLater
from app.queue.retry import MAX_EXPIRES_SECONDS

logger = logging.getLogger(__name__)


def waited_without_attempt(exc: BaseException | None) -> bool:
    """Whether ``exc`` (or the error a retry was raised from) is a wait that spends no attempt."""
    while exc is not None:
        if isinstance(exc, RetryLater):
            return not exc.spends_attempt
        exc = exc.__cause__
    return False


class GivenBackTries:
    def __init__(self, redis: Redis, namespace: str) -> None:
        self.redis = redis
        self.namespace = namespace

    def _key(self, job_id: str) -> str:
        return f"{self.namespace}tries-given-back:{job_id}"

    async def count(self, job_id: str) -> int:
        """Tries of the job given back so far (0 when Redis cannot tell: the try then counts)."""
        try:
            return int(await self.redis.get(self._key(job_id)) or 0)
        except (RedisError, OSError, ValueError):
            return 0

    async def give_back(self, job_id: str) -> None:
        try:
            key = self._key(job_id)
            async with self.redis.pipeline(transaction=True) as pipe:
                pipe.incr(key)
                pipe.expire(key, int(MAX_EXPIRES_SECONDS))
                await pipe.execute()
        except (RedisError, OSError) as exc:
            logger.warning("Could not give back the try of job %s (%s): it counts as an attempt.", job_id, exc)

    async def forget(self, job_id: str) -> None:
        with contextlib.suppress(RedisError, OSError):  # it expires by itself
            await self.redis.delete(self._key(job_id))
