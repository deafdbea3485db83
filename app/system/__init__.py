"""The system feature module: liveness and readiness probes."""
