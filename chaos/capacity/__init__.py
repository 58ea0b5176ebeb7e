"""Capacity under fault: the highest load that still meets every SLA, in the baseline and with each
fault in force (``streamchaos capacity``). ``search`` decides the next level (pure), ``probes``
builds and runs one probe as a real experiment run, ``run`` walks the cases within the budget,
``report`` writes what was found."""
