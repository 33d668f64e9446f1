"""``stapo report``: the paper's table (table.py) and figures from the score summaries and training metrics
(results.py reads runs/ and scores/), one figure registry (kinds.py), the comparison, cost and across-seed parts.

Plug-ins: the modules below declare their figure kinds in stapo.report.kinds when the package is imported, so the
registry is complete whichever module asks first.
"""

from stapo.report import comparison, cost, figures  # noqa: F401  (plug-in list: they fill stapo.report.kinds)
