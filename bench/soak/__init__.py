"""``make soak``: thousands of signed deliveries through real faults, then the count of lost and twice-applied.

See ``bench/soak/README.md``. Entry point: ``python -m bench.soak [--events N] [--short]``.
"""
