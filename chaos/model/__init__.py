"""The leaf model: what every room shares and nothing of ours is imported by it but itself.

``context`` (the run context a fault sees), ``observations`` (stream records, samples, notes),
``errors`` (the exception family), ``units`` and ``params`` (parameter schemas), ``events`` (the
run's event stream) and ``outcome`` (what a finished run says next).
"""
