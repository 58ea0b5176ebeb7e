"""The GPU as streamchaos uses it: ``nvml`` (clocks, power limits and telemetry through pynvml, errors
translated) and ``burner`` (the bounded helper processes of the non-invasive throttle backends: a
CPU or GPU co-tenant, a SIGSTOP duty cycle). The ``gpu.*`` faults and the runner's GPU telemetry use
them. Importing this package imports neither (pynvml only where NVML is wanted).
"""
