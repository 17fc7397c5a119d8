"""Which published releases a release test runs on, and where their files are:
the one loader of published SGLang releases for the tests.

``SGLANG_HOTFIX_RELEASES`` = ``all`` (default: every release in the record's
shipped table), ``quick`` (the test's own short list: one per code variant,
plus the first and last of each verdict), or a comma-separated list. Fetched
files are cached under ``.cache/releases`` (or ``$SGLANG_HOTFIX_TEST_CACHE/releases``).

``release_dir(release)``: the files the hotfix reads, from the release's wheel.
``installed(release)``: the whole ``sglang`` package installed with ``--no-deps`` into
a cached folder, for a subprocess's PYTHONPATH (a process that imports that release).
"""

import os
import subprocess
import sys

from packaging.version import Version

import scan_releases
from conftest import CACHE, exclusive

RELEASES_CACHE = CACHE / "releases"


def table(hotfix):
    """release -> row of the record's shipped table ({} when it cannot be read)."""
    return {row["release"]: row for row in hotfix.known_fingerprints.rows}


def with_verdict(hotfix, verdict="affected"):
    """The releases the record's shipped table gives ``verdict``, oldest first."""
    return sorted((r for r, row in table(hotfix).items() if row["verdict"] == verdict), key=Version)


def selected(shipped, quick):
    choice = os.environ.get("SGLANG_HOTFIX_RELEASES", "all").strip()
    if choice == "all":
        return sorted(shipped, key=Version)
    if choice == "quick":
        return list(quick)
    return [r.strip() for r in choice.split(",") if r.strip()]


def release_dir(release):
    with exclusive("release-" + release):
        return scan_releases.fetch(RELEASES_CACHE, release)


def installed(release):
    target = CACHE / ("sglang-" + release)
    marker = target / ".complete"
    with exclusive("installed-" + release):
        if marker.exists():
            return target
        subprocess.run(
            [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-compile", "--target", str(target)]
            + ["--upgrade", "sglang==" + release],
            check=True,
            timeout=600,
        )
        marker.write_text(release)
    return target
