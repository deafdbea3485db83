"""A SaaS developer's own module, as docs/jobs.md writes one: a route that queues a job, and the job.

Loaded by the tracing tests into a real API (``create_app``, the project's
app with this module mounted) and a real worker (``--module
tests.tracing.saas_example:MODULE``). Neither says a word about traces.
"""

from __future__ import annotations

import logging

import msgspec
from litestar import Litestar, post
from litestar.di import NamedDependency
from litestar.params import FromPath

from app.core.module import ApiPart, FeatureModule
from app.core.resources import Resources
from app.core.settings import get_settings
from app.queue.job import Job
from app.queue.queues import QueueName

logger = logging.getLogger(__name__)


class SendInvoiceReminderJobData(msgspec.Struct, frozen=True):
    invoice_id: int


class SendInvoiceReminderJob(Job[SendInvoiceReminderJobData]):
    queue = QueueName.DEFAULT

    async def handle(self, data: SendInvoiceReminderJobData) -> None:
        logger.info("Reminded about invoice %s.", data.invoice_id)


@post("/invoices/{invoice_id:int}/remind", status_code=202)
async def remind(invoice_id: FromPath[int], resources: NamedDependency[Resources]) -> dict[str, bool]:
    job_id = await resources.queue.add(SendInvoiceReminderJob, SendInvoiceReminderJobData(invoice_id=invoice_id))
    return {"queued": job_id is not None}


MODULE = FeatureModule(name="invoices", api=ApiPart(route_handlers=[remind]), jobs=[SendInvoiceReminderJob])


def create_app() -> Litestar:
    """``uvicorn --factory tests.tracing.saas_example:create_app``: the project's API with this module mounted."""
    from app.asgi import build_app
    from app.runtime import API_MODULES

    return build_app(get_settings(), [*API_MODULES, MODULE])
