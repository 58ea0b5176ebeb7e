"""The leaf model: what every room shares and nothing of ours is imported by it but itself.

``context`` (the run context a fault sees), ``observations`` (stream records, samples, notes),
``errors`` (the exception family), ``units`` and ``params`` (parameter schemas), ``client_rules``
(what client faults install and the load generator draws request plans from), ``experiment`` (the
typed spec), ``verdict``, ``engines`` (engine profiles), ``allowlist``, ``bounded_json``, ``outcome``
(what a finished run says next) and ``request_ids`` (the load's UUID-shaped X-Request-Ids and the record
ids they stand for). The run's event stream is ``chaos.execution.events``.
"""
