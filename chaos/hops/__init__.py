"""The hops of an experiment's path between the load and the target: the embedded stream hop
(``streamhop``, an SSE-aware proxy that stream faults act on and that taps what it relays), the
real gateways a run starts itself (``gateways``), their processes (``process``) and the stream
hop's control API client (``client``)."""
