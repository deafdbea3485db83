"""What one injected fault did: when it began, and what it showed."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class FaultRecord:
    name: str
    at: float  # run seconds when it began
    note: str = ""
    ok: bool = True  # False: the fault exposed a finding (e.g. a worker that did not stop on SIGTERM)
