"""The published releases a hotfix knows, as data (written by tools/scan_releases.py).

Standard library only. The file is read on first use, not at import, so the
startup module never pays for it. A missing or damaged file gives an empty
table: detection then falls back to the structural analysis alone, which is
what produced the table in the first place.
"""

import json
import os
from collections.abc import Mapping

from .record import Verdict


class ReleaseTable(Mapping):
    """fingerprint -> (verdict, releases sharing that fingerprint, oldest first)."""

    def __init__(self, filename):
        self.path = os.path.join(os.path.dirname(os.path.abspath(__file__)), filename)
        self._by_fingerprint = None
        self._by_verdict = {}  # (fingerprint, verdict) -> releases, oldest first
        self._rows = ()
        self.problem = None  # why the file could not be read, if it could not

    def _load(self):
        if self._by_fingerprint is not None:
            return self._by_fingerprint
        table = {}
        try:
            with open(self.path, encoding="utf-8") as handle:
                self._rows = tuple(json.load(handle)["releases"])
            by_verdict = {}
            for row in self._rows:
                verdict, releases = table.get(row["fingerprint"], (Verdict(row["verdict"]), ()))
                table[row["fingerprint"]] = (verdict, releases + (row["release"],))
                key = (row["fingerprint"], Verdict(row["verdict"]))
                by_verdict[key] = by_verdict.get(key, ()) + (row["release"],)
            self._by_verdict = by_verdict
        except (OSError, ValueError, KeyError, TypeError) as error:
            self.problem = "%s: %s: %s" % (self.path, type(error).__name__, error)
            table, self._rows, self._by_verdict = {}, (), {}  # a damaged table is empty, rows and mapping alike
        self._by_fingerprint = table
        return table

    @property
    def rows(self):
        """The table's rows, oldest release first (read on first use, as the mapping is); () when
        the file cannot be read."""
        self._load()
        return self._rows

    def releases_for(self, fingerprint, verdict):
        """The releases whose code has this fingerprint and gets this verdict (a record may judge
        one method's code by what else the module holds: pr19107's write is 0.5.6.post1's to
        0.5.9's, affected only in 0.5.9)."""
        self._load()
        return self._by_verdict.get((fingerprint, verdict), ())

    def __getitem__(self, fingerprint):
        return self._load()[fingerprint]

    def __iter__(self):
        return iter(self._load())

    def __len__(self):
        return len(self._load())
