"""Maintainer tool: classify every published SGLang release, and ship the result.

    python tools/scan_releases.py --cache DIR [--releases V1,V2,...] [--write]

For each SGLang release from 0.5.1 on (or the ones named), it fetches the
release (``pip download --no-deps``), keeps only the files the hotfixes and
their tests read (each record's target module, and ``forward_batch_info.py``)
under ``DIR/<release>/``, and classifies each record's target source with the
record's *structural* analysis (never with the shipped table it is about to
write). It loops over the package's catalog; for each record that ships a
release table it prints one row per release, and with ``--write`` rewrites

* that table (e.g. ``sglang_hotfix_trtllm/records/pr26521_releases.json``:
  fingerprint -> verdict and releases), and
* for a record of FlashInfer's own kernel bug, each row's verdict judged with the FlashInfer that
  release pins (its metadata's ``Requires-Dist``, kept as ``DIR/<release>/flashinfer-pin``), and
  that pin in the row, and
* then, through ``tools/docs_tables.py``, every generated block of the docs (the
  README's records and status-by-release tables, each record's table in
  ``docs/records.md``).

Nothing from SGLang is committed: fetched files stay in the cache folder the
caller names. The index is the one pip is configured with; upload dates come
from its JSON simple API (PEP 691/700) when it offers them, else they are
left empty.

Run it with the test environment's Python (it needs ``packaging``, and the
installed ``sglang_hotfix_trtllm`` for the analysis).
"""

import argparse
import ast
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile
import urllib.request
import zipfile

from packaging.version import Version

REPO = pathlib.Path(__file__).resolve().parent.parent
FIRST_RELEASE = Version("0.5.1")
# What the tests read beside the records' own modules (the release's
# ForwardMode, and its SpeculativeAlgorithm).
EXTRA_FILES = ("sglang/srt/model_executor/forward_batch_info.py", "sglang/srt/speculative/spec_info.py")


def records():
    """The catalog's records that ship a release table."""
    from sglang_hotfix_trtllm.records import catalog

    return [h for h in catalog.HOTFIXES if getattr(h.known_fingerprints, "path", None)]


def module_file(hotfix):
    return hotfix.module.replace(".", "/") + ".py"


def kept_files():
    return sorted({module_file(h) for h in records()} | set(EXTRA_FILES))


def _pip(*args, capture=True):
    return subprocess.run([sys.executable, "-m", "pip"] + list(args), check=True, capture_output=capture, text=True)


def list_releases():
    """Published releases from 0.5.1 on, oldest first, as the index lists them."""
    out = _pip("index", "versions", "sglang", "--pre").stdout
    match = re.search(r"Available versions:\s*(.+)", out)
    if not match:
        raise RuntimeError("cannot read the release list from `pip index versions sglang`:\n" + out)
    versions = [Version(v.strip()) for v in match.group(1).split(",") if v.strip()]
    return [str(v) for v in sorted(versions) if v >= FIRST_RELEASE and not v.is_prerelease]


def _index_url():
    for key in ("PIP_INDEX_URL",):
        if os.environ.get(key):
            return os.environ[key]
    try:
        configured = _pip("config", "get", "global.index-url").stdout.strip()
        if configured:
            return configured
    except subprocess.CalledProcessError:
        pass
    from pip._internal.models.index import PyPI  # pip's own default, not named here

    return PyPI.simple_url


def upload_dates():
    """release -> earliest upload date (YYYY-MM-DD) of its files, where the index says."""
    url = _index_url().rstrip("/") + "/sglang/"
    request = urllib.request.Request(url, headers={"Accept": "application/vnd.pypi.simple.v1+json"})
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            data = json.load(response)
    except Exception as error:
        print("upload dates unavailable (%s); leaving them empty" % error, file=sys.stderr)
        return {}
    dates = {}
    for entry in data.get("files", []):
        when = entry.get("upload-time")
        match = re.match(r"sglang-([^-]+)(?:-|\.tar)", entry.get("filename", ""))
        if when and match:
            release = match.group(1)
            dates[release] = min(dates.get(release, when), when)
    return {release: when[:10] for release, when in dates.items()}


def release_dir(cache, release):
    return pathlib.Path(cache) / release


def download_wheel(release, folder):
    """The release's wheel (the cp311 manylinux one every release publishes), downloaded into ``folder``."""
    _pip(
        "download",
        "--no-deps",
        "--quiet",
        "--only-binary=:all:",
        "--python-version",
        "3.11",
        "--implementation",
        "cp",
        "--abi",
        "cp311",
        "--platform",
        "manylinux_2_34_x86_64",
        "-d",
        str(folder),
        "sglang==" + release,
    )
    (wheel,) = pathlib.Path(folder).glob("sglang-*.whl")
    return wheel


def keep_files(wheel, cache, release):
    """From the release's ``wheel``, the files the hotfix reads, into the cache; then its marker."""
    folder = release_dir(cache, release)
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        for member in kept_files():
            if member in names:
                target = folder / member
                target.parent.mkdir(parents=True, exist_ok=True)
                with archive.open(member) as source, open(target, "wb") as out:
                    shutil.copyfileobj(source, out)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / ".complete").write_text("\n".join([release] + kept_files()))
    return folder


def fetch(cache, release):
    """Download one release and keep the files the hotfix reads; cached."""
    folder = release_dir(cache, release)
    marker = folder / ".complete"
    # The marker lists the files kept: a cache made when fewer were kept is fetched again.
    if marker.exists() and marker.read_text().split("\n")[1:] == kept_files():
        return folder
    with tempfile.TemporaryDirectory() as download:
        return keep_files(download_wheel(release, download), cache, release)


FLASHINFER = re.compile(r"^flashinfer[-_]python(?:\[[^\]]*\])?\s*==\s*([^\s;,]+)", re.I)


def pinned_flashinfer(cache, release):
    """The FlashInfer the release pins (its metadata's ``Requires-Dist: flashinfer_python==X``; 0.5.1
    to 0.5.2 pin it in their ``srt`` extra), or None; cached beside the release's files. pip reads
    the release's metadata from the index (``--dry-run --report``: nothing is installed)."""
    kept = release_dir(cache, release) / "flashinfer-pin"
    if kept.exists():
        return kept.read_text().strip() or None
    with tempfile.TemporaryDirectory() as folder:
        report = os.path.join(folder, "report.json")
        _pip(
            "install",
            "--dry-run",
            "--no-deps",
            "--ignore-installed",
            "--quiet",
            "--report",
            report,
            "sglang==" + release,
        )
        with open(report, encoding="utf-8") as handle:
            (item,) = json.load(handle)["install"]
    pins = {m.group(1) for m in map(FLASHINFER.match, item["metadata"].get("requires_dist") or []) if m}
    if len(pins) > 1:
        raise RuntimeError("sglang %s pins several FlashInfer versions: %s" % (release, sorted(pins)))
    pin = pins.pop() if pins else None
    kept.parent.mkdir(parents=True, exist_ok=True)
    kept.write_text(pin or "")
    return pin


def classify(cache, release, hotfix):
    """(verdict, fingerprint, reason) from the record's structural analysis alone; for a record of
    FlashInfer's own kernel bug (``Hotfix.flashinfer_fix``) whose code reaches the kernel, judged
    with the FlashInfer the release pins (what `status` says where pip installed the release)."""
    path = release_dir(cache, release) / module_file(hotfix)
    if not path.exists():
        return "not-applicable", None, "no %s module" % hotfix.module
    result = hotfix.classify(ast.parse(path.read_text(encoding="utf-8")))
    verdict, reason = result.verdict, result.reason
    if hotfix.flashinfer_fix is not None and verdict.value == "unrepairable":
        verdict, reason = with_pin(hotfix, pinned_flashinfer(cache, release))
    return verdict.value, result.fingerprint, reason


def with_pin(hotfix, pin):
    """(verdict, reason) of a reached FlashInfer kernel bug with the release's pinned FlashInfer."""
    from sglang_hotfix_trtllm.flashinfer_install import Installed, judge_kernel_fix
    from sglang_hotfix_trtllm.record import Verdict

    fix = hotfix.flashinfer_fix
    if not pin:  # no `flashinfer_python==X` read from the release's metadata: cannot tell, still reported
        return Verdict.UNREPAIRABLE, "cannot tell which FlashInfer the release pins (none read from its metadata)"
    return judge_kernel_fix(fix.first, fix.reference, Installed(pin, None, pinned=True))


def scan(cache, releases, dates, hotfix):
    rows = []
    for release in releases:
        fetch(cache, release)
        verdict, fingerprint, reason = classify(cache, release, hotfix)
        rows.append(
            {
                "release": release,
                "date": dates.get(release),
                "verdict": verdict,
                "fingerprint": fingerprint,
                "reason": reason,
            }
        )
        if hotfix.flashinfer_fix is not None:  # the pin its verdict was judged with (the docs show it)
            rows[-1]["flashinfer"] = pinned_flashinfer(cache, release)
        print(
            "%-8s %-14s %-10s %-15s %-22s %s"
            % (hotfix.name, release, dates.get(release) or "-", verdict, fingerprint, reason),
            flush=True,
        )
    return rows


def table_data(rows, hotfix):
    return {
        "about": "Written by tools/scan_releases.py from SGLang's published releases; do not edit by hand.",
        "hotfix": hotfix.name,
        "releases": [
            {k: row[k] for k in ("release", "date", "verdict", "fingerprint", "flashinfer") if k in row} for row in rows
        ],
    }


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cache", required=True, help="folder for fetched release files")
    parser.add_argument("--releases", help="comma-separated releases (default: all from 0.5.1 on)")
    parser.add_argument("--write", action="store_true", help="rewrite the shipped tables and the docs")
    arguments = parser.parse_args(argv)
    releases = arguments.releases.split(",") if arguments.releases else list_releases()
    dates = upload_dates()
    for hotfix in records():
        rows = scan(arguments.cache, releases, dates, hotfix)
        counts = {}
        for row in rows:
            counts[row["verdict"]] = counts.get(row["verdict"], 0) + 1
        print(
            "%s: %d releases: %s"
            % (hotfix.name, len(rows), ", ".join("%d %s" % (n, v) for v, n in sorted(counts.items())))
        )
        if arguments.write:
            table = pathlib.Path(hotfix.known_fingerprints.path)
            table.write_text(json.dumps(table_data(rows, hotfix), indent=1) + "\n", encoding="utf-8")
            print("wrote %s" % table.relative_to(REPO))
    if arguments.write:  # the docs' tables come from the shipped tables just written
        import docs_tables

        return docs_tables.main([])
    return 0


if __name__ == "__main__":
    # Run as a tool: the checkout's package, not an installed copy (the tables live beside its records).
    sys.path.insert(0, str(REPO))
    sys.exit(main())
