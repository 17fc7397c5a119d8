"""The plugin's wheel, built as pip builds it for users, for the carries (tools/gpu_carry.py,
tools/e2e_carry.py), the benchmarks and the tests: one recipe.

``build(source, out)`` runs ``pip wheel`` on ``source`` into ``out`` (old plugin wheels there
removed first) and returns the wheel; ``from_checkout(out)`` builds from a copy of the checkout's
files (``checkout_copy``), so that no ``build/`` or egg-info is written into the checkout.
"""

import pathlib
import shutil
import subprocess
import sys
import tempfile

REPO = pathlib.Path(__file__).resolve().parent.parent
PATTERN = "sglang_hotfix_trtllm-*.whl"


def checkout_copy(folder, repo=REPO):
    """A copy of the checkout's files (tracked, and untracked but not ignored) in ``folder``; the
    checkout itself where git cannot list its files."""
    listed = subprocess.run(
        ["git", "-C", str(repo), "ls-files", "-z", "--cached", "--others", "--exclude-standard"], capture_output=True
    )
    if listed.returncode != 0:
        return repo
    folder = pathlib.Path(folder)
    for name in filter(None, listed.stdout.decode().split("\0")):
        source = repo / name
        if source.is_file():  # a file deleted in the work tree but still in the index is skipped
            (folder / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, folder / name)
    return folder


def build(source, out):
    """``pip wheel`` of ``source`` (a folder holding the plugin) into ``out``; returns the wheel."""
    out = pathlib.Path(out).resolve()  # pip runs in ``out``: a relative path would land below it
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob(PATTERN):
        old.unlink()
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(out), str(source)],
        check=True,
        timeout=300,
        cwd=str(out),
    )
    (wheel,) = out.glob(PATTERN)
    return wheel


def from_checkout(out, repo=REPO):
    """The checkout's plugin as a wheel in ``out``, built from a scratch copy of its files."""
    with tempfile.TemporaryDirectory() as scratch:
        return build(checkout_copy(pathlib.Path(scratch, "source"), repo), out)
