"""Real gateways a run starts in its path, one module per kind (``base.GATEWAY_KINDS``)."""
