"""Every SGLang release the tests read, fetched once at the start of a run, several at a time.

On a clean clone the release cache is empty: each test that first asks for a release downloads its
wheel (about 28 MB) while holding that release's lock, and ``fp8_cases.extra_file`` downloaded the
same wheel again for the files it reads beside the backend. Two test processes then spend minutes
waiting on the network, one wheel at a time. Here each wheel is downloaded once, six at a time,
before the tests start, and both what ``scan_releases.fetch`` keeps and the files ``extra_file``
reads are taken from it, under the same locks the tests take (``conftest.exclusive``), so a test
process that asks meanwhile waits for the one download rather than starting its own.
"""

import concurrent.futures
import pathlib
import tempfile
import zipfile

import fp8_cases
import release_selection
import scan_releases
import workspace_cases
from conftest import exclusive

# The files beside the backend that the tests' harnesses read (``fp8_cases.extra_file``).
EXTRA_MEMBERS = (
    fp8_cases.ATTENTION_UTILS,
    "sglang/kernels/ops/attention/utils.py",  # canonicalize_stride from 0.5.16
    fp8_cases.CP_BASE,
    fp8_cases.CP_ZIGZAG,
    fp8_cases.FLASHINFER_BACKEND,
    fp8_cases.KV_QUANT_METHOD,
    workspace_cases.RUNTIME_CONTEXT,
    workspace_cases.PAGED_VIEW,
) + tuple(fp8_cases.RELEASE_CLASSES.values())


def releases():
    """Every release some record's shipped table names."""
    names = set()
    for hotfix in scan_releases.records():
        names |= set(release_selection.table(hotfix))
    return sorted(names)


def _missing(release):
    marker = release_selection.RELEASES_CACHE / release / ".complete"
    return not (marker.exists() and marker.read_text().split("\n")[1:] == scan_releases.kept_files())


def _fetch(release):
    with exclusive("release-" + release), exclusive("fp8-extra-" + release):
        if not _missing(release):
            return
        with tempfile.TemporaryDirectory() as download:
            wheel = scan_releases.download_wheel(release, download)
            scan_releases.keep_files(wheel, release_selection.RELEASES_CACHE, release)
            with zipfile.ZipFile(wheel) as archive:
                names = set(archive.namelist())
                for member in EXTRA_MEMBERS:
                    target = fp8_cases.EXTRA_CACHE / release / member
                    if member in names and not target.is_file():
                        target.parent.mkdir(parents=True, exist_ok=True)
                        staging = target.with_suffix(".partial")
                        staging.write_bytes(archive.read(member))
                        staging.replace(target)


def fetch_all(workers=6):
    """Fetch every release not in the cache yet; returns how many were fetched. A failed download
    is left to the test that needs it (which then fails with pip's message)."""
    wanted = [r for r in releases() if _missing(r)]
    if not wanted:
        return 0
    with concurrent.futures.ThreadPoolExecutor(workers) as pool:
        for future in [pool.submit(_fetch, release) for release in wanted]:
            try:
                future.result()
            except Exception:
                pass
    return len(wanted)


if __name__ == "__main__":
    print("fetched %d releases into %s" % (fetch_all(), pathlib.Path(release_selection.RELEASES_CACHE)))
