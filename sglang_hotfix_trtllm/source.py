"""Find and read an installed module's source without importing its package.

Standard library only. ``importlib.util.find_spec("a.b.c")`` would import
``a`` and ``a.b`` (for SGLang that is torch and more), so only the *top-level*
package is looked up through ``sys.meta_path`` (which imports nothing and
sees editable installs, whether they use a path entry or setuptools' editable
finder), and the rest of the dotted path is resolved as files below the
package's search locations. This is how SGLang's official images are covered:
they install SGLang in editable mode from a source checkout.

Does not cope with: packages served from zip files or by custom loaders that
have no files on disk; those are reported as "source not found".
"""

import importlib.util
import json
import os
import sys

from .record import Value


class Distribution(Value):
    """What the distribution metadata says, for humans only: ``version`` is None
    without metadata; ``install_kind`` is "wheel", "editable" or "unknown"."""

    __slots__ = ("name", "version", "install_kind")


class LocatedSource(Value):
    """``path`` is None when the module's file was not found, and ``reason``
    then says why ("" when found)."""

    __slots__ = ("module", "path", "reason", "package_found")


def locate(module_name):
    """Locate ``module_name``'s ``.py`` file without importing any of its packages.

    If the module is already imported, its own ``__spec__.origin`` is used: that
    is the file that actually ran.
    """
    loaded = sys.modules.get(module_name)
    origin = getattr(getattr(loaded, "__spec__", None), "origin", None)
    if origin and os.path.isfile(origin):
        return LocatedSource(module_name, origin, "", True)

    top, _, rest = module_name.partition(".")
    try:
        spec = importlib.util.find_spec(top)
    except (ImportError, ValueError) as error:
        return LocatedSource(module_name, None, "cannot look up package %r: %s" % (top, error), False)
    if spec is None:
        return LocatedSource(module_name, None, "package %r is not installed" % top, False)
    locations = list(spec.submodule_search_locations or [])
    if not locations:
        return LocatedSource(module_name, None, "%r is a module, not a package" % top, True)

    relative = rest.replace(".", os.sep) + ".py"
    for location in locations:
        candidate = os.path.join(location, relative)
        if os.path.isfile(candidate):
            return LocatedSource(module_name, candidate, "", True)
    return LocatedSource(
        module_name,
        None,
        "%s not found under %s" % (relative, os.pathsep.join(locations)),
        True,
    )


def read_text(path):
    """Read a source file as Python does (PEP 263 encoding, BOM)."""
    import tokenize

    with tokenize.open(path) as handle:
        return handle.read()


def _editable_root(dist):
    """The local folder an editable install points to, or None."""
    try:
        info = json.loads(dist.read_text("direct_url.json") or "{}")
    except (ValueError, OSError):
        return None
    if not info.get("dir_info", {}).get("editable"):
        return None
    url = info.get("url", "")
    if not url.startswith("file://"):
        return None
    from urllib.parse import unquote, urlparse

    return os.path.realpath(unquote(urlparse(url).path))


def install_root(source_path, module):
    """The folder holding the top-level package of ``module``, whose file is
    ``source_path`` (for ``a.b.c`` at ``/x/a/b/c.py``: ``/x``)."""
    root = os.path.realpath(source_path)
    for _ in range(module.count(".") + 1):
        root = os.path.dirname(root)
    return root


def _owns(dist, source_path, module):
    """Whether ``dist`` is the installation ``source_path`` belongs to: its
    metadata sits beside the top-level package, or it is an editable install
    of the folder holding the source."""
    try:
        beside = os.path.realpath(str(dist.locate_file(""))) == install_root(source_path, module)
    except Exception:
        beside = False
    root = _editable_root(dist)
    return beside or (root is not None and os.path.realpath(source_path).startswith(root + os.sep))


def distribution(name, source_path=None, module=None):
    """Version and install kind from the distribution metadata; never raises.

    With ``source_path`` (of ``module``), only metadata belonging to that
    installation counts: an environment can hold an SGLang on PYTHONPATH and
    another in site-packages, and the version of the wrong one would mislead.
    """
    try:
        from importlib import metadata

        dist = metadata.distribution(name)
        if source_path is not None and not _owns(dist, source_path, module):
            dist = next(iter(metadata.distributions(name=name, path=[install_root(source_path, module)])), None)
            if dist is None:
                return Distribution(name, None, "unknown")
    except Exception:
        return Distribution(name, None, "unknown")
    try:
        version = dist.version
    except Exception:
        version = None
    kind = "editable" if _editable_root(dist) is not None else "wheel"
    return Distribution(name, version, kind)
