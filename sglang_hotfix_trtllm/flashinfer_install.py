"""The FlashInfer a new Python process of this environment would import, read from its files and
metadata, never imported: its version and folder for ``status``, and what its kernel sources say
where a record's verdict depends on them (issue 50). Standard library only."""

import os
import re

from . import source

DISTRIBUTION = "flashinfer-python"
PACKAGE = "flashinfer"
# FlashInfer's warp-specialised Hopper fmha_v2 template, as shipped in its wheel for the JIT build.
FMHA_V2_DMA = os.path.join("data", "csrc", "fmha_v2", "fmha", "warpspec", "dma.h")


class Installed:
    """``version`` (None where unread), ``folder`` (the package's, None where not installed)."""

    __slots__ = ("version", "folder")

    def __init__(self, version, folder):
        self.version, self.folder = version, folder

    def text(self):
        if self.folder is None:
            return "FlashInfer: not installed"
        return "FlashInfer %s at %s" % (self.version or "(version unknown)", self.folder)


def installed():
    located = source.locate(PACKAGE)
    if located.path is None:
        return Installed(None, None)
    folder = os.path.dirname(located.path)
    # the package's file is its __init__.py: named as a module one level down, so that the folder
    # holding the package is found as for any module
    return Installed(source.distribution(DISTRIBUTION, located.path, PACKAGE + ".__init__").version, folder)


def _release(version):
    """(major, minor, patch) of a version string, or None."""
    found = re.match(r"(\d+)\.(\d+)\.(\d+)", version or "")
    return tuple(int(part) for part in found.groups()) if found else None


def fmha_v2_leaves_its_tile_counter(found=None):
    """(True, why) where the installed FlashInfer's fmha_v2 leaves its tile counter in the
    workspace's first 4 bytes after a launch (``atomicAdd`` on ``tile_id_counter_ptr``: 0.6.18 to
    0.7.1), (False, why) where it wraps it back to 0 (``atomicInc``: 0.7.2 on), (None, why) where
    neither the kernel source nor the version can tell. Reads the kernel source FlashInfer ships for
    its JIT build; the version string decides only where that file is absent."""
    found = found or installed()
    if found.folder is None:
        return None, "FlashInfer is not installed"
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
    release = _release(found.version)
    if release is None:
        return None, "%s: no fmha_v2 source (%s) and no version to read" % (found.text(), path)
    leaves = release < (0, 7, 2)
    return leaves, "%s, by its version (no %s)" % (found.text(), path)
