"""Toxiproxy as streamchaos uses it: ``server`` (the embedded, API-compatible Toxiproxy; a product of
its own that imports nothing else of ours; ``python -m chaos.toxiproxy.server``) and ``client`` (the
HTTP API through ``toxiproxy-python``, bounded in time, that network faults and the runner's proxy
use). Importing this package imports neither.
"""
