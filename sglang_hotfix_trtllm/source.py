"""Find and read an installed module's source without importing its package.

Standard library only. ``importlib.util.find_spec("a.b.c")`` would import
``a`` and ``a.b`` (for SGLang that is torch and more), so only the *top-level*
package is looked up through ``sys.meta_path`` (which imports nothing and
sees editable installs, whether they use a path entry or setuptools' editable
finder), and the rest of the dotted path is resolved as files below the
package's search locations. This is how SGLang's official images are covered:
they install SGLang in editable mode from a source checkout.

A module found only in a form the analysis cannot read (sourceless ``.pyc``,
a zip, an extension module) is reported as found but without a source, so
that callers can say "unknown", as the import hook will.
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
    """``path`` is the module's ``.py`` file, or None; ``reason`` then says why
    ("" when found). ``package_found``: the top-level package exists.
    ``module_found``: the module itself exists, in whatever form (a module
    found only as ``.pyc``, in a zip or as an extension has ``module_found``
    True and ``path`` None: the hotfix cannot read it, and will not patch it)."""

    __slots__ = ("module", "path", "reason", "package_found", "module_found")


def source_file(origin):
    """(path, None) when ``origin`` (a module's ``__spec__.origin``) is a ``.py``
    file the analysis can read, else (None, why not). The one rule for what is
    analysable: status and the import hook both ask here."""
    if not origin or not isinstance(origin, str):
        return None, "it has no file (origin %r)" % (origin,)
    if not origin.endswith(".py"):
        return None, "it is not loaded from a .py source (%s: sourceless .pyc or compiled module?)" % origin
    if not os.path.isfile(origin):
        return None, "cannot read its source %s: not a file on disk (inside a zip? removed after import?)" % origin
    return origin, None


NAMESPACE_REASON = "%s is a namespace package (a folder without __init__.py), not SGLang's module"


def is_namespace(spec):
    """True for the spec of a namespace package (no file, search locations only):
    at a module's name it holds no code, so there is nothing of SGLang's to
    judge. Status and the import hook both ask here."""
    return (
        spec is not None
        and getattr(spec, "origin", None) is None
        and getattr(spec, "submodule_search_locations", None) is not None
    )


class _NamespaceSpec(Value):
    __slots__ = ("origin", "submodule_search_locations")


def _find_submodule(fullname, locations):
    """The spec ``fullname`` gets from the path-entry finders of ``locations``
    (``sys.path_hooks``: folders, zips), as ``PathFinder`` would find it, but
    without needing the parent package in ``sys.modules`` (namespace packages)."""
    portions = []
    for entry in locations:
        finder = sys.path_importer_cache.get(entry)
        if finder is None:
            for hook in sys.path_hooks:
                try:
                    finder = hook(entry)
                    break
                except ImportError:
                    continue
        if finder is None or not hasattr(finder, "find_spec"):
            continue
        spec = finder.find_spec(fullname)
        if spec is None:
            continue
        if spec.loader is not None:
            return spec
        portions.extend(spec.submodule_search_locations or ())
    return _NamespaceSpec(None, portions) if portions else None


def locate(module_name):
    """Find ``module_name`` as the import system would, without importing any of
    its packages: the top-level package through ``sys.meta_path`` (which sees
    editable installs too), then each submodule through the path-entry finders
    of its parent's search locations (files, zips, namespace packages alike).

    If the module is already imported, its own ``__spec__.origin`` is used: that
    is the file that actually ran.
    """
    loaded = sys.modules.get(module_name)
    spec = getattr(loaded, "__spec__", None)
    if spec is None:
        parts = module_name.split(".")
        try:
            spec = importlib.util.find_spec(parts[0])
        except (ImportError, ValueError) as error:
            return LocatedSource(module_name, None, "cannot look up package %r: %s" % (parts[0], error), False, False)
        if spec is None:
            return LocatedSource(module_name, None, "package %r is not installed" % parts[0], False, False)
        for depth in range(1, len(parts)):
            locations = list(spec.submodule_search_locations or [])
            parent, name = ".".join(parts[:depth]), ".".join(parts[: depth + 1])
            if not locations:
                return LocatedSource(module_name, None, "%r is a module, not a package" % parent, True, False)
            try:
                spec = _find_submodule(name, locations)
            except (ImportError, ValueError, OSError) as error:
                spec = None
                why = "%s: %s" % (type(error).__name__, error)
            else:
                why = "not found under %s" % os.pathsep.join(locations)
            if spec is None:
                return LocatedSource(module_name, None, "%s %s" % (name, why), True, False)
    if is_namespace(spec):
        return LocatedSource(module_name, None, NAMESPACE_REASON % module_name, True, False)
    path, problem = source_file(getattr(spec, "origin", None))
    if path is None:
        return LocatedSource(module_name, None, "%s exists, but %s" % (module_name, problem), True, True)
    return LocatedSource(module_name, path, "", True, True)


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


_remembered = None  # while remembering() is open: a question's key -> its answer


class remembering:
    """While open, ``distribution`` (and any ``remembered`` question) answers each question once:
    the records of one imported module ask about the same distribution (for their log lines and
    metrics samples) and edit methods of the same file (``code_edit.parsed``), and ``status`` asks
    for each record whether the entry point is installed. Closed (the outermost), what was
    answered is let go, and every call reads afresh."""

    def __enter__(self):
        global _remembered
        self._outer = _remembered
        if _remembered is None:
            _remembered = {}
        return self

    def __exit__(self, *exc):
        global _remembered
        _remembered = self._outer


def remembered(key, answer):
    """``answer()``, asked once per ``key`` while a ``remembering()`` context is open."""
    if _remembered is None:
        return answer()
    if key not in _remembered:
        _remembered[key] = answer()
    return _remembered[key]


def distribution(name, source_path=None, module=None):
    """``_distribution``, remembered while a ``remembering()`` context is open."""
    return remembered(("distribution", name, source_path, module), lambda: _distribution(name, source_path, module))


def _distribution(name, source_path=None, module=None):
    """Version and install kind from the distribution metadata; never raises.

    With ``source_path`` (of ``module``), only metadata belonging to that
    installation counts: an environment can hold an SGLang on PYTHONPATH and
    another in site-packages, and the version of the wrong one would mislead.
    """
    try:
        from importlib import metadata

        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            dist = None  # not on this Python's path: the installation beside ``source_path`` may have it
        if source_path is not None and (dist is None or not _owns(dist, source_path, module)):
            dist = next(iter(metadata.distributions(name=name, path=[install_root(source_path, module)])), None)
        if dist is None:
            return Distribution(name, None, "unknown")
    except Exception:
        return Distribution(name, None, "unknown")
    kind = "editable" if _editable_root(dist) is not None else "wheel"
    return Distribution(name, _version(dist), kind)


def _version(dist):
    """``dist.version``, read from the metadata's header lines only. importlib.metadata
    parses the whole file with the email parser: for SGLang's METADATA (its README
    included) that was 95 % of the time ``apply()`` took, four times per import."""
    try:
        text = dist.read_text("METADATA") or dist.read_text("PKG-INFO") or ""
        lines = text.splitlines()
        for line, following in zip(lines, lines[1:] + [""]):
            if not line.strip():
                break  # the headers end at the first empty line
            key, _, value = line.partition(":")
            folded = following[:1] in (" ", "\t")  # a continued header: leave it to the email parser
            if key.lower() == "version" and value.strip() and not folded:
                return value.lstrip(" \t")  # as the email parser: leading blanks go, trailing ones stay
    except Exception:
        pass  # unreadable metadata: the slow, general reading below decides
    try:
        return dist.version
    except Exception:
        return None
