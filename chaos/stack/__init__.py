"""The builtin streaming stack: engine (``chaos.stack.engine``), OpenAI server, metrics, admin API.

Importing this package starts nothing and imports neither torch nor starlette; import the
submodules (``chaos.stack.server``, ``chaos.stack.serve``, ``chaos.stack.admin_client``) you need.
"""
