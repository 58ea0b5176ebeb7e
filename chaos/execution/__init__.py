"""The run: the runner and what keeps a run safe and recoverable (journal, watchdog, rollback,
halt conditions, the target allow-list, credentials, preflight), what it measures (telemetry, the
Toxiproxy it places, verify; a target's metrics are ``chaos.targets.scraper``'s), and its dry run,
coverage, budgets and shipped experiments.

Named ``execution``, not ``run``: ``chaos.run`` is the front door's function, and a subpackage of that
name would replace it as an attribute of ``chaos`` the moment it was imported.
"""
