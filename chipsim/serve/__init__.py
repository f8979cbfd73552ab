"""Many requests served (workload.requests > 0): when they arrive (arrivals), what each step runs (scheduler), the
requests' progress as the engine runs the steps (server) and what a run reports (metrics)."""
