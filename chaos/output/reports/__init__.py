"""What people bring to a postmortem: report.html, run comparisons, history pages.

One module per view, each a pure function from a run's report dict (and observations) to HTML:
``verdicts``, ``distributions``, ``timeline``, ``waterfall``, ``faults``, ``environment``; ``page``
assembles report.html (with any view registered as a panel, ``page.panel``), ``compare`` and
``history`` are pages over several runs. Plotting (``plot``)
uses matplotlib, imported only when a figure is drawn: importing this package loads nothing heavy.
"""
