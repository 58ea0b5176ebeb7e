"""The builtin streaming stack: engine (``chaos.stack.engine``), OpenAI server, metrics, admin API.

Importing this package starts nothing and imports neither torch nor starlette; import the
submodules (``chaos.stack.server``, ``chaos.stack.serve``, ``chaos.stack.admin``) you need. The admin API's
client, which faults and the runner use, is ``chaos.admin.client``.
"""
