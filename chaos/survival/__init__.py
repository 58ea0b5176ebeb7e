"""The stream-survival matrix of a path (``streamchaos survival EXPERIMENT``): for each dimension
(first-token hold, mid-stream silence, each with and without keep-alive comments, and the total
duration), the longest duration that still arrives whole and the shortest that is cut, found by
bisection within a time budget, with the hop that cut and how the client saw it.

``search`` the bisection (pure), ``probe`` one request through the path with a rule on its
innermost stream hop, ``run`` the target and the path brought up once, every dimension searched,
``survival.json`` and ``report.html`` written."""
