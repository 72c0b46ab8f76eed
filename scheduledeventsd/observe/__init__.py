"""What the daemon shows of itself: health and status (observer, report), Prometheus metrics,
the HTTP endpoint, webhooks, and the telemetry that feeds them from the loop."""
