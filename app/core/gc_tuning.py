"""The garbage collector of a long-running process (an API process, a worker), set once it has started.

Each delivery or job allocates a few hundred container objects (a decoded event
is a tree of dicts and lists). With CPython's default thresholds (700, 10, 10)
that starts a young collection every few requests, and the older generations
hold everything imported and built at start-up (modules, the app and its
routes, SQLAlchemy's mappers): about 200,000 objects, walked again at each
collection of the older generations. Two standard remedies (see ``gc.freeze``
in the Python docs):

- :func:`gc.freeze` moves what exists once start-up is done into a permanent
  generation that no collection walks;
- a larger young generation (:data:`GEN0_THRESHOLD`), so collections run about
  ten times less often; each still frees what a request left in cycles.

Measured with ``make bench BENCH_ARGS="--phases intake"``: the intake's CPU per
request fell from about 600 to 466 us (bench/README.md, "Latest full run").
"""

from __future__ import annotations

import gc

GEN0_THRESHOLD = 7_000
"""Allocations (minus deallocations) of container objects between young collections: CPython's 700 x 10.
At a few hundred bytes each that is a few MB at most between collections."""


def settle_after_start_up() -> None:
    """Freeze what start-up built and collect less often: call once, when the process is ready to serve."""
    gc.collect()  # what start-up left in cycles goes now, not frozen with the rest
    gc.freeze()
    _, gen1, gen2 = gc.get_threshold()
    gc.set_threshold(GEN0_THRESHOLD, gen1, gen2)
