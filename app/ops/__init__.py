"""The operator's view of the pipeline: /metrics and the /ops page."""
