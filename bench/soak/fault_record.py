"""What one injected fault did: when it began, how long until the faulty part served again, what it showed."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class FaultRecord:
    name: str
    at: float  # run seconds when it began
    healed_after: float  # seconds until the faulty part served again
    note: str = ""
    ok: bool = True  # False: the fault exposed a finding (e.g. a worker that did not stop on SIGTERM)
