"""The soak's Stripe API: ``app.testing.stripe_stub`` in its own process, started from a state file.

A Stripe outage is this process killed; its successor must come back with the
objects Stripe had (Stripe never forgets a customer), so it loads them before
it listens. It imports first and waits on stdin for the state file's path, so
the driver can start the successor while the outage lasts and have it listen
within milliseconds when the outage ends.

    python -m bench.soak.stripe_server --port N    # then write "<state.json>\\n" to stdin

The state file: ``{"objects": [{...}], "faults": [{"mode": "fail", "path_prefix": ..., "times": null}]}``.
Prints ``waiting`` once imported and ``ready <base url>`` once it serves.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import threading
from pathlib import Path

from app.testing.stripe_stub import StripeStub


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args(argv)
    stub = StripeStub(port=args.port)
    print("waiting", flush=True)
    line = sys.stdin.readline().strip()
    if not line:
        return
    state = json.loads(Path(line).read_text())
    for obj in state.get("objects", []):
        stub.put(obj)
    for fault in state.get("faults", []):
        mode = fault.pop("mode")
        getattr(stub, mode)(**fault)
    with stub:
        print(f"ready {stub.base_url}", flush=True)
        with contextlib.suppress(KeyboardInterrupt):
            threading.Event().wait()


if __name__ == "__main__":
    main()
