"""The worker's HTTP surface: health, the REST API and metrics."""
