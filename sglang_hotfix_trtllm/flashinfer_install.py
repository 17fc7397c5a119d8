"""The FlashInfer a new Python process of this environment would import, read from its files and
metadata, never imported: its version and folder for ``status``, and what its kernel sources say
where a record's verdict depends on them (issue 50). Standard library only."""

import os
import re

from . import source
from .record import Verdict

DISTRIBUTION = "flashinfer-python"
PACKAGE = "flashinfer"
# FlashInfer's warp-specialised Hopper fmha_v2 template, as shipped in its wheel for the JIT build.
FMHA_V2_DMA = os.path.join("data", "csrc", "fmha_v2", "fmha", "warpspec", "dma.h")


class Installed:
    """``version`` (None where unread), ``folder`` (the package's, None where not installed or
    unreadable); ``problem``: why a FlashInfer that is there cannot be read (a namespace package, no
    source), None otherwise; ``pinned``: not an installed FlashInfer but the version a release pins
    (the release tables, ``tools/scan_releases.py``), which has no folder."""

    __slots__ = ("version", "folder", "pinned", "problem")

    def __init__(self, version, folder, pinned=False, problem=None):
        self.version, self.folder, self.pinned, self.problem = version, folder, pinned, problem

    @property
    def present(self):
        return self.pinned or self.folder is not None or self.problem is not None

    def text(self):
        version = self.version or "(version unknown)"
        if self.pinned:
            return "FlashInfer %s (the release's pin)" % self.version
        if self.problem is not None:
            return "FlashInfer %s (%s)" % (version, self.problem)
        if self.folder is None:
            return "FlashInfer: not installed"
        return "FlashInfer %s at %s" % (version, self.folder)


def installed():
    located = source.locate(PACKAGE)
    if located.path is None:
        if located.package_found or source.distribution(DISTRIBUTION).version:
            # there, but its __init__.py cannot be read (sourceless, a namespace package): present,
            # with the metadata's version if any (none: its verdicts cannot tell, never "not installed")
            return Installed(source.distribution(DISTRIBUTION).version, None, problem=_unreadable(located))
        return Installed(None, None)
    folder = os.path.dirname(located.path)
    # the package's file is its __init__.py: named as a module one level down, so that the folder
    # holding the package is found as for any module
    return Installed(source.distribution(DISTRIBUTION, located.path, PACKAGE + ".__init__").version, folder)


def _unreadable(located):
    """Why the FlashInfer that is there cannot be read, in words of FlashInfer's own."""
    if located.reason == source.NAMESPACE_REASON % PACKAGE:
        return "%s is a namespace package (a folder without __init__.py)" % PACKAGE
    if located.package_found:
        return located.reason or "its package cannot be read"
    return "its metadata is installed, its package is not found"


def beside(source_path, module):
    """The FlashInfer installed in the folder that holds the package of ``module`` whose file is
    ``source_path`` (a backend judged on its own, in an image's site-packages): its version from that
    folder's metadata; not installed where that folder has no ``flashinfer`` package (or the path is
    not the module's)."""
    layout = os.path.join(*module.split(".")) + ".py"
    if not source_path or not os.path.realpath(source_path).endswith(os.sep + layout):
        return Installed(None, None)  # a file of its own, outside a package folder: nothing beside it
    init = os.path.join(source.install_root(source_path, module), PACKAGE, "__init__.py")
    if not os.path.isfile(init):
        return Installed(None, None)
    return Installed(source.distribution(DISTRIBUTION, init, PACKAGE + ".__init__").version, os.path.dirname(init))


def _release(version):
    """(major, minor, patch) of a version string, or None."""
    found = re.match(r"(\d+)\.(\d+)\.(\d+)", version or "")
    return tuple(int(part) for part in found.groups()) if found else None


# A public version as FlashInfer publishes them (0.6.17, 0.6.15.post1, 0.7.0rc2, 0.6.16+cu130): the
# standard library has no version parser, and the package must not need ``packaging``.
_VERSION = re.compile(r"(\d+)\.(\d+)\.(\d+)((?:a|b|rc)\d+|\.dev\d+)?(?:\.post\d+)?(?:\+\S*)?$")


def has_release(version, first):
    """True where FlashInfer ``version`` is ``first`` or later, False where it is older, None where it
    cannot be told: a version that is not a plain release, or a pre-release (rc, dev) of ``first``
    itself, which may or may not carry what ``first`` shipped."""
    mine, theirs = _VERSION.match(version or ""), _VERSION.match(first)
    if mine is None or theirs is None:
        return None
    base = tuple(int(part) for part in mine.groups()[:3])
    wanted = tuple(int(part) for part in theirs.groups()[:3])
    if base != wanted:
        return base > wanted
    return None if mine.group(4) else True


def judge_kernel_fix(first_fixed, reference, found=None):
    """(verdict, why) for a bug in FlashInfer's own kernel code that the SGLang code reaches (a
    record whose ``classify`` says ``unrepairable`` where the route is there): ``fixed`` where
    ``found`` (the installed FlashInfer unless given; a release's pin for the release tables) is
    ``first_fixed`` or later, ``not-applicable`` where no FlashInfer is installed (no FlashInfer
    kernel runs), ``unrepairable`` where it is older, or where its version cannot be read (never
    "all is well" for what cannot be told). ``reference``: the fix ("FlashInfer PR #4161")."""
    found = found or installed()
    if not found.present:
        return Verdict.NOT_APPLICABLE, "FlashInfer is not installed: no FlashInfer kernel runs here"
    newer = has_release(found.version, first_fixed)
    if newer:
        where = "FlashInfer %s, the release's pin" if found.pinned else "the installed FlashInfer %s"
        return Verdict.FIXED, "fixed in %s (%s, first in FlashInfer %s)" % (
            where % found.version,
            reference,
            first_fixed,
        )
    if newer is None:
        return Verdict.UNREPAIRABLE, (
            "cannot tell whether %s has %s (first in FlashInfer %s): its version is not one to compare"
            % (found.text(), reference, first_fixed)
        )
    return Verdict.UNREPAIRABLE, "%s has the bug; %s fixed it in FlashInfer %s" % (found.text(), reference, first_fixed)


def fmha_v2_leaves_its_tile_counter(found=None):
    """(True, why) where the installed FlashInfer's fmha_v2 leaves its tile counter in the
    workspace's first 4 bytes after a launch (``atomicAdd`` on ``tile_id_counter_ptr``: 0.6.18 to
    0.7.1), (False, why) where it wraps it back to 0 (``atomicInc``: 0.7.2 on), (None, why) where
    neither the kernel source nor the version can tell. Reads the kernel source FlashInfer ships for
    its JIT build; the version string decides only where that file is absent."""
    found = found or installed()
    if not found.present:
        return None, "FlashInfer is not installed"
    if found.folder is None:  # there, but unreadable (``Installed.problem``): only its version can tell
        return _tile_counter_by_version(found, "no fmha_v2 source read")
    path = os.path.join(found.folder, FMHA_V2_DMA)
    try:
        text = source.read_text(path)
    except (OSError, UnicodeDecodeError, ValueError):
        text = None
    if text is not None:
        if re.search(r"atomicInc\(\s*params\.tile_id_counter_ptr", text):
            return False, "%s wraps its fmha_v2 tile counter back to 0 (%s)" % (found.text(), path)
        if re.search(r"atomicAdd\(\s*tile_id_counter_ptr", text):
            return True, "%s leaves its fmha_v2 tile counter in the workspace (%s)" % (found.text(), path)
        return None, "%s: neither counter update found in %s" % (found.text(), path)
    return _tile_counter_by_version(found, "no %s" % path)


def _tile_counter_by_version(found, unread):
    """``fmha_v2_leaves_its_tile_counter`` where no kernel source was read (``unread`` says which):
    0.7.2 wraps the counter back to 0."""
    release = _release(found.version)
    if release is None:
        return None, "%s: %s and no version to read" % (found.text(), unread)
    return release < (0, 7, 2), "%s, by its version (%s)" % (found.text(), unread)
