"""Which published releases a release test runs on, and where their files are.

``SGLANG_HOTFIX_RELEASES`` = ``all`` (default: every release in the record's
shipped table), ``quick`` (the test's own short list: one per code variant,
plus the first and last of each verdict), or a comma-separated list. Fetched
files are cached under ``.cache/releases`` (or ``$SGLANG_HOTFIX_TEST_CACHE/releases``).
"""

import os

from packaging.version import Version

import scan_releases
from conftest import CACHE

RELEASES_CACHE = CACHE / "releases"


def table(hotfix):
    """release -> row of the record's shipped table ({} when it cannot be read)."""
    return {row["release"]: row for row in hotfix.known_fingerprints.rows} if len(hotfix.known_fingerprints) else {}


def selected(shipped, quick):
    choice = os.environ.get("SGLANG_HOTFIX_RELEASES", "all").strip()
    if choice == "all":
        return sorted(shipped, key=Version)
    if choice == "quick":
        return list(quick)
    return [r.strip() for r in choice.split(",") if r.strip()]


def release_dir(release):
    return scan_releases.fetch(RELEASES_CACHE, release)
