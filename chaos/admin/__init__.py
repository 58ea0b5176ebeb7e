"""The admin API's client side: ``client`` (``AdminClient``, the lease a fault holds and renews, the
token's proof and ``recognise``, which decides whether a server may be sent the token at all). The
builtin stack (``chaos.stack.admin``) and the vLLM middleware serve the API; the ``server.*`` and
``kv.*`` faults and the builtin target speak it.
"""
