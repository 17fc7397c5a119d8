"""The records: one file per upstream fix (``pr26521.py``, ``pr25103.py``), each with
its release table, and CPU probes for ``verify`` (``*_probe.py``); ``catalog``
lists them. Everything generic (detect, decide, patch, report) is in the
package above: a new fix is one new file here and one line in ``catalog``.
"""
