"""Host helpers: child processes and their guard, process facts, CPU sets, run files, redaction,
capped reads, the metrics HTTP endpoint."""
