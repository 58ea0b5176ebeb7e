"""Docker as streamchaos uses it: ``containers`` (the Docker SDK, lazily: the labels that say which
run a container belongs to, ownership checks, state read back, logs, removal and rollback). Shared by
the docker target, the container faults, the containerised Toxiproxy and rollback.
"""
