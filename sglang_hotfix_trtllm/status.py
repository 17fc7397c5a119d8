"""What ``sglang-hotfix-trtllm status`` reports: the state of this environment,
read from files and metadata only.

Never imports SGLang or torch (a test holds it to that with
``python -X importtime``), so it is fast and safe on any host. It imports
wrapt when the verdict is affected, exactly as the import hook will before
wrapping: a missing or broken wrapt is then reported, not promised away.
"""

import contextlib
import os
import stat
import sys

from . import __version__, detect, engine, launcher, process_state, source, switches
from .record import Verdict
from .records import catalog  # engine imports it already: no cost here

STARTUP_FILE = "sglang_hotfix_trtllm.pth"
EXIT_OK, EXIT_UNPROTECTED, EXIT_ERROR, EXIT_UNKNOWN = 0, 1, 2, 3
EXIT_BAD_PATH = EXIT_UNKNOWN  # a path or process that cannot be examined: nothing can be told of it
EXIT_USAGE = 64  # bad arguments (sysexits' EX_USAGE), never confused with an answer
# How bad each answer is, for one answer across several (records, processes): a known bug left
# unpatched or a refusal outranks "cannot tell", which outranks all is well.
SEVERITY = {EXIT_OK: 0, EXIT_UNKNOWN: 1, EXIT_UNPROTECTED: 2, EXIT_ERROR: 3}


def worst(*codes):
    """The worst of exit statuses, by ``SEVERITY``."""
    return max(codes, key=SEVERITY.__getitem__)


# Bumped when a key of `status --json` changes meaning or goes away (adding keys does not).
# 2: the top level holds the answer across every record (headline, exit_status) and what is the
# same for every record (the environment); each record's own keys only under "hotfixes" (in 1 the
# top level also held the first record's, which a script read as the answer).
FORMAT_VERSION = 2
# The keys of a record's report that describe the environment, not the record: the top level's.
ENVIRONMENT_KEYS = (
    "format_version",
    "plugin_version",
    "plugin_location",
    "sglang_version",
    "sglang_install_kind",
    "sglang_installed",
    "flashinfer_version",
    "flashinfer_location",
    "flashinfer_problem",
    "startup_file",
    "startup_file_active",
    "launcher_active",
    "entry_point_installed",
    "sglang_plugin_framework",
    "switches",
    "switch_problems",
)


def environment_document(reports, headline, code):
    """``status --json``: the answer and the environment at the top level, every record's report
    under "hotfixes"."""
    document = {key: reports[0][key] for key in ENVIRONMENT_KEYS if key in reports[0]}
    document.update(
        headline=headline,
        exit_status=code,
        hotfixes=[{key: value for key, value in r.items() if key != "format_version"} for r in reports],
    )
    return document


def startup_file():
    """(path or None, active): the startup file that arms this environment's processes, and
    whether Python reads it at start (it sits in a site directory). The one beside the package
    this process imported comes first; where that one is not read (a ``--target`` copy first on
    PYTHONPATH) but another install's is (the plugin also installed by pip), that one arms every
    process: its finder loads whichever copy ``sys.path`` finds first."""
    path = os.path.join(launcher.INSTALL_DIR, STARTUP_FILE)
    own = path if os.path.isfile(path) else None
    if own is not None and launcher.in_site_packages(os.path.dirname(own)):
        return own, True
    for folder in launcher.site_dirs():
        candidate = os.path.join(folder, STARTUP_FILE)
        if os.path.isfile(candidate):
            return candidate, True
    return own, False


def _copy_version(folder):
    """The version of the plugin copy in ``folder``: its dist-info's name, else its ``__init__.py``'s
    ``__version__`` line (a copy put on the path by hand has no metadata); None where neither reads."""
    import glob
    import re

    for info in sorted(glob.glob(os.path.join(glob.escape(folder), "sglang_hotfix_trtllm-*.dist-info"))):
        return os.path.basename(info)[len("sglang_hotfix_trtllm-") : -len(".dist-info")]
    try:
        with open(os.path.join(folder, "sglang_hotfix_trtllm", "__init__.py"), encoding="utf-8") as handle:
            found = re.search(r'^__version__ = ["\']([^"\']+)["\']', handle.read(), re.M)
    except (OSError, ValueError):
        return None
    return found.group(1) if found else None


def plugin_copies(path=None):
    """Every copy of this plugin on ``path`` (``sys.path`` by default), in its order, each folder once:
    ``[{"location", "version", "in_site_packages"}]``. Two copies (pip's in site-packages and a
    ``pip install --target`` folder on PYTHONPATH) are both seen by ``importlib.metadata``; a process
    imports the first on its own ``sys.path``, and its startup hook (the ``.pth`` finder) imports the
    startup module and the package the same way: which copy runs depends on each process's path."""
    copies, seen = [], set()
    for entry in sys.path if path is None else path:
        folder = os.path.abspath(entry or os.curdir)
        real = os.path.realpath(folder)
        if real in seen or not os.path.isfile(os.path.join(folder, "sglang_hotfix_trtllm", "__init__.py")):
            continue
        seen.add(real)
        copies.append(
            {
                "location": folder,
                "version": _copy_version(folder),
                "in_site_packages": launcher.in_site_packages(folder),
            }
        )
    return copies


def copies_line(copies):
    """(line, differ) about several copies of the plugin, or (None, False) for one."""
    if len(copies) < 2:
        return None, False
    this = os.path.realpath(launcher.INSTALL_DIR)

    def described(copy):
        where = "site-packages" if copy["in_site_packages"] else "on the path (PYTHONPATH, a --target folder)"
        this_one = os.path.realpath(copy["location"]) == this
        return "%s at %s (%s%s)" % (
            copy["version"] or "(version unknown)",
            shown(copy["location"]),
            where,
            "; this command runs it, as `python -m sglang_hotfix_trtllm` does here" if this_one else "",
        )

    differ = len({copy["version"] for copy in copies}) > 1
    # sys.path[0] is this command's own folder (the script's, or the current one for `python -m`): a
    # process started elsewhere does not search it.
    hook = (plugin_copies(sys.path[1:]) or copies)[0]
    return (
        "%d copies of this plugin%s: %s; a Python process runs the first on its own sys.path, its startup hook "
        "included (one started with this environment's PYTHONPATH: %s %s), so remove all but one "
        "(`pip uninstall sglang-hotfix-trtllm`, or delete the --target folder)"
        % (
            len(copies),
            ", in different versions" if differ else "",
            "; ".join(described(copy) for copy in copies),
            hook["version"] or "(version unknown)",
            shown(hook["location"]),
        ),
        differ,
    )


def launcher_active(environ=None):
    """True when this process runs under ``sglang-hotfix-trtllm run`` (bootstrap on PYTHONPATH)."""
    environ = os.environ if environ is None else environ
    return any(launcher.is_bootstrap_dir(e) for e in environ.get("PYTHONPATH", "").split(os.pathsep))


def entry_point_installed():
    """Whether SGLang's plugin loader would find this plugin's entry point (asked once per
    ``source.remembering()``: every record of one ``status`` asks, and each answer reads the
    metadata of every installed distribution)."""
    return source.remembered("entry_point_installed", _entry_point_installed)


def _entry_point_installed():
    try:
        from importlib.metadata import entry_points

        return any(ep.name == switches.PLUGIN_NAME for ep in entry_points(group="sglang.srt.plugins"))
    except Exception:
        return False


def sglang_has_plugin_framework(hotfix, assessment):
    """SGLang 0.5.11+ ships sglang/srt/plugins: it calls our entry point itself."""
    if not assessment.source_path:
        return False
    root = source.install_root(assessment.source_path, hotfix.module)
    return os.path.isfile(os.path.join(root, "sglang", "srt", "plugins", "__init__.py"))


# Which Python processes a loader covers (``covered_processes`` in the JSON report).
EVERY_PROCESS, UNDER_RUN, SGLANG_LOADER_ONLY, NONE = "every-process", "under-run", "sglang-plugin-loader-only", "none"
THIS_PROCESS = "this-process"  # status --pid: the records patched in that running process
# status --source and the README's release table: code in no environment, judged as if the plugin
# were installed by pip where it runs (not "this environment": a file given by path is in none).
IF_INSTALLED_BY_PIP = "if-installed-by-pip"
# The records this `status` accepts because `--accept` named them (not the variable): the first line
# says which of the two accepted each (cli merges --accept into the variable for the verdicts).
ACCEPTED_BY_ARGUMENT = frozenset()
COVERAGE_WORDS = {
    # What a process recorded when it handled its records, not a look inside it now: a method that
    # code replaced there since (a HookRegistry REPLACE, an assignment) cannot be seen from outside.
    THIS_PROCESS: "each of them was patched in that process when it recorded its state",
    EVERY_PROCESS: "every new Python process of this environment is patched (the startup file arms the hook)",
    UNDER_RUN: "this process's Python children are patched (it runs under `sglang-hotfix-trtllm run`)",
    SGLANG_LOADER_ONLY: (
        "only processes started through SGLang's plugin loader are patched (launch_server, `sglang "
        "serve`, Engine and scheduler processes); any other Python process here, a plain "
        "`python -c 'import sglang...'` say, stays unpatched: start it with "
        "`sglang-hotfix-trtllm run -- COMMAND` to cover it"
    ),
}


def would_patch(decision, startup_active, under_launcher, entry_point, framework):
    """(bool, reason, coverage) for a Python process started now in this
    environment: the import hook's own decision (``engine.decide``), then which
    processes a loader arms the hook in (one of the coverage words above)."""
    if decision.action is not engine.Action.PATCH:
        return False, decision.why, NONE
    if startup_active:
        return True, COVERAGE_WORDS[EVERY_PROCESS], EVERY_PROCESS
    if under_launcher:
        return True, COVERAGE_WORDS[UNDER_RUN], UNDER_RUN
    if entry_point and framework:
        return True, "the startup file is not active: " + COVERAGE_WORDS[SGLANG_LOADER_ONLY], SGLANG_LOADER_ONLY
    return (
        False,
        (
            "no loader is active: %s is not in a site-packages directory and SGLang has no plugin "
            "framework; reinstall into site-packages, or start SGLang with `sglang-hotfix-trtllm run -- ...`"
            % STARTUP_FILE
        ),
        NONE,
    )


def exit_status(verdict, action, patched, accepted=False):
    """The exit status one record gives: its ``verdict``, the engine's ``action`` on it, whether
    it is (or would be) patched, and whether the operator accepted its bug where it cannot be
    repaired (``switches.ACCEPT``: the bug is still named, and does not fail the check)."""
    if accepted and verdict is Verdict.UNREPAIRABLE:
        return EXIT_OK
    if action is engine.Action.DISABLED and verdict is Verdict.UNREPAIRABLE:
        # A bug this hotfix cannot repair, turned off by name: the operator, told what it concerns,
        # says this deployment does not serve it (an embedding model, say). Nothing would run
        # differently with the record on, so the exit status follows the other records.
        return EXIT_OK
    if action in (engine.Action.DISABLED, engine.Action.EXCLUDED):
        # The operator's choice, made before any verdict is acted on (the process
        # stands aside silently whatever the code): not an error to fix.
        bugs = (Verdict.AFFECTED, Verdict.UNKNOWN, Verdict.UNREPAIRABLE)
        return EXIT_UNPROTECTED if verdict in bugs else EXIT_OK
    if action in engine.REFUSALS:
        return EXIT_ERROR  # the import hook will refuse: an error to fix, not a choice made
    if verdict is Verdict.AFFECTED and not patched or verdict is Verdict.UNREPAIRABLE:
        return EXIT_UNPROTECTED
    return EXIT_OK


def of_environment(hotfix, path=None):
    """(report dict, assessment, exit status) for the installed SGLang; with ``path``, for that backend
    file as this environment's processes would import it (an SGLang in the current folder)."""
    if path is None:
        assessment = detect.assess_installed(hotfix)
    else:
        assessment = detect.in_this_environment(hotfix, detect.assess_source(hotfix, path))
    dist = source.distribution(hotfix.distribution, assessment.source_path, hotfix.module)
    current = switches.read()
    decision = engine.decide(hotfix, assessment, current, search_first=current_folder())
    startup, active = startup_file()
    under_launcher = launcher_active()
    entry_point = entry_point_installed()
    framework = sglang_has_plugin_framework(hotfix, assessment)
    patched, why, coverage = would_patch(decision, active, under_launcher, entry_point, framework)
    report = assessment.as_dict()
    report.update(
        {
            "upstream": hotfix.upstream,
            "format_version": FORMAT_VERSION,
            "plugin_version": __version__,
            "plugin_location": launcher.INSTALL_DIR,
            "sglang_version": dist.version if dist.version is not None or path is None else _version_beside(path),
            "sglang_install_kind": dist.install_kind if dist.version is not None else None,
            "startup_file": startup,
            "startup_file_active": active,
            "launcher_active": under_launcher,
            "entry_point_installed": entry_point,
            "sglang_plugin_framework": framework,
            "switches": current.as_dict(),
            "switch_problems": list(current.problems),
            "would_patch": patched,
            "decision": decision.action.value,
            "would_patch_reason": why,
            "covered_processes": coverage,
        }
    )
    report["sglang_installed"] = detect.distribution_installed(hotfix)
    # The FlashInfer a new process would import: the verdicts of encoder_only_mask and xqa_workspace
    # depend on it (their reasons say how).
    from . import flashinfer_install

    found = flashinfer_install.installed()
    report["flashinfer_version"], report["flashinfer_location"] = found.version, found.folder
    report["flashinfer_problem"] = found.problem
    report["accepted"] = hotfix.name in current.accepted_records
    code = exit_status(assessment.verdict, decision.action, patched, report["accepted"])
    if not report["sglang_installed"]:
        # The plugin in a Python without SGLang (another interpreter's pip): nothing here is
        # protected, and saying NOTHING TO DO would pass a Dockerfile's `&& status` check.
        code = EXIT_ERROR
    return report, assessment, code


def _version_beside(path):
    """The version an SGLang package whose backend file is ``path`` states in its own files (a copy in
    a folder has no installed metadata): ``_version.py`` (written by its build), else ``version.py``;
    None where neither states one (a git checkout never built)."""
    import re

    folder = os.path.join(source.install_root(path, catalog.HOTFIXES[0].module), "sglang")
    for name in ("_version.py", "version.py"):
        try:
            with open(os.path.join(folder, name), encoding="utf-8") as handle:
                found = re.search(r'^__version__\s*=\s*(?:version\s*=\s*)?["\']([^"\']+)["\']', handle.read(), re.M)
        except (OSError, ValueError):
            continue
        if found:
            return found.group(1)
    return None


# SGLang packages under the current folder that processes started in a folder import before the
# installed one, and that folder: `python -m ...` and `python script.py` put their own folder first
# on sys.path (``./sglang``, for processes started here); a checkout keeps its package in
# ``python/sglang`` (for processes started in ``./python``; from here, `python -m` does not see it).
CURRENT_FOLDER_PACKAGES = ((("sglang",), ()), (("python", "sglang"), ("python",)))


def current_folder_sglang(installed_path, folder=None):
    """(backend file, package folder, the folder whose processes import it first) of an SGLang
    package under the current folder that is not the installed one judged (``installed_path``), or
    None. Only a regular package (with ``__init__.py``) counts: a namespace portion loses to the
    installed package."""
    folder = folder or current_folder()
    if folder is None:
        return None  # run from a folder that is gone: no SGLang there to judge
    module = catalog.HOTFIXES[0].module
    for parts, started_in in CURRENT_FOLDER_PACKAGES:
        package = os.path.join(folder, *parts)
        backend = os.path.join(package, *module.split(".")[1:]) + ".py"
        if not os.path.isfile(os.path.join(package, "__init__.py")) or not os.path.isfile(backend):
            continue
        if installed_path and os.path.realpath(backend) == os.path.realpath(installed_path):
            continue  # it is what was judged (an editable install of this checkout)
        return backend, package, os.path.join(folder, *started_in)
    return None


def current_folder():
    """``os.getcwd()``, or None where the folder this command runs in is gone (removed after the shell
    entered it): nothing there can be imported, and ``status`` must still answer."""
    try:
        return os.getcwd()
    except OSError:
        return None


def source_exit_status(verdict, accepted=False):
    """The exit status of a source judged on its own (``status --source``, and the README's table
    of what ``status`` says on each release): 2 for code the hotfix would refuse, 1 for a bug it
    recognises but cannot repair (0 where the operator accepts it), 0 otherwise."""
    if accepted and verdict is Verdict.UNREPAIRABLE:
        return EXIT_OK
    return {Verdict.UNKNOWN: EXIT_ERROR, Verdict.UNREPAIRABLE: EXIT_UNPROTECTED}.get(verdict, EXIT_OK)


def of_file(hotfix, path):
    """(report dict, assessment, exit status) for one given source file."""
    assessment = _assessed_in_walk(hotfix, path) if _assessed is not None else detect.assess_source(hotfix, path)
    assessment = detect.beside_its_flashinfer(hotfix, assessment)
    accepted = hotfix.name in switches.read().accepted_records  # --accept counts for a file as for an install
    return assessment.as_dict(), assessment, source_exit_status(assessment.verdict, accepted)


def _assessed_in_walk(hotfix, path):
    """Within ``shared_walks``: the file assessed for every record of the catalog at its first
    question, while its one tree is parsed (``detect`` keeps the last file's tree only, and the
    command asks record by record across every file: without this, an image root's scan parsed
    each file once per record)."""
    key = (path, hotfix.name)
    if key not in _assessed:
        with detect.shared_parses():
            for each in catalog.HOTFIXES if hotfix in catalog.HOTFIXES else (hotfix,):
                _assessed[(path, each.name)] = detect.assess_source(each, path)
    return _assessed[key]


class PathProblem(Exception):
    """``status --source`` was given a path it cannot examine (exit 3)."""


# Folders a scan does not enter: version control and byte-code (no backend there), and the kernel's
# pseudo filesystems of a live root (thousands of entries that vanish or refuse mid-walk).
SKIPPED_FOLDER_NAMES = frozenset((".git", ".hg", ".svn", "__pycache__"))
SKIPPED_FOLDER_PATHS = frozenset(("/proc", "/sys", "/dev"))


def shown(path):
    """A path as one line can carry it, on stdout and stderr alike: as Python writes it where it
    holds a control character (a newline in a folder's name would split the line)."""
    return path if path.isprintable() else ascii(path)


def _kind_of(info):
    """What a file that is neither a regular file nor a folder is, in words."""
    for test, words in (
        (stat.S_ISFIFO, "a FIFO (named pipe)"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
    ):
        if test(info.st_mode):
            return words
    return "not a regular file"


def _link_problem(path):
    """Why ``path``, a link, leads nowhere readable: a loop (a link that leads back to itself, which
    ``os.path.exists`` reports as missing) or a broken link; None when it leads somewhere."""
    import errno

    try:
        os.stat(path)
    except OSError as error:
        if error.errno == errno.ELOOP:
            return "a symbolic link loop (it leads back to itself)"
        return "a broken link (its target %s does not exist)" % shown(os.readlink(path))
    return None


def _is_zip(path):
    try:
        with open(path, "rb") as opened:
            return opened.read(4) == b"PK\x03\x04"
    except OSError:
        return False


def backend_files(hotfix, root):
    """(files, unreadable): every source file of the hotfix's target module under ``root`` (a
    file, or a folder: an image root, a site-packages folder, a checkout, dot-folders such as a
    ``.venv`` included; links to folders are not followed), sorted, and a "PATH: reason" line for
    each folder or backend file under it that cannot be read (a non-root user scanning an image
    root meets mode-700 folders; a broken link; a FIFO). Raises PathProblem when nothing can be
    judged: a bad path, or no readable backend file at all. Cached per root for one command."""
    name = hotfix.module.rpartition(".")[2] + ".py"
    if not root:
        raise PathProblem("an empty path names no file or folder")
    if not os.path.exists(root):
        loop = os.path.islink(root) and _link_problem(root)
        raise PathProblem("%s is %s" % (shown(root), loop) if loop else "no such file or folder: %s" % shown(root))
    if not os.path.isdir(root) and not os.path.isfile(root):  # a FIFO, /dev/null: "Not a directory" said nothing
        raise PathProblem(
            "%s is %s, neither a source file nor a folder: give a %s, or a folder to search"
            % (shown(root), _kind_of(os.stat(root)), name)
        )
    if os.path.isfile(root):
        if not os.access(root, os.R_OK):
            raise PathProblem("cannot read %s: permission denied" % shown(root))
        if not root.endswith(".py"):
            raise PathProblem(
                "%s is not a Python source file: give a %s, or a folder (an image root, a site-packages) to search"
                "%s" % (shown(root), name, " (a wheel is a zip archive: unpack it first)" if _is_zip(root) else "")
            )
        return [root], [], []
    key = (os.path.abspath(root), name)
    readable, unreadable, links = _walked[key] if _walked is not None and key in _walked else _walk(root, name)
    if _walked is not None:
        _walked[key] = readable, unreadable, links
    if not readable:
        where = "; cannot read %s" % unreadable[0] if unreadable else ""
        hint = "; %s" % links[0] if links else ""
        raise PathProblem(
            (
                "no readable %s under %s%s" % (name, shown(root), where)
                if unreadable
                else "no %s under %s" % (name, shown(root))
            )
            + hint
        )
    return list(readable), list(unreadable), list(links)


_walked = None  # within shared_walks(): (root, file name) -> (readable, unreadable)
_assessed = None  # within shared_walks(): (path, record name) -> assessment


@contextlib.contextmanager
def shared_walks():
    """The records of one ``status --source`` share one walk of the tree (a live root changes
    between walks, and every walk of an image root costs seconds), and one parse of each file."""
    global _walked, _assessed
    _walked, _assessed = {}, {}
    try:
        yield
    finally:
        _walked = _assessed = None


def _walk(root, name):
    """Depth first, sub-folders in sorted order (as ``os.walk`` top-down with sorted names), without
    recursion: a tree of any depth is walked (``os.walk`` recurses once per level up to Python 3.11
    and stopped a scan at Python's recursion limit)."""
    found, errors, links, stack = [], [], [], [root]
    while stack:
        folder = stack.pop()
        try:
            with os.scandir(folder) as listing:
                entries = list(listing)
        except OSError as error:
            errors.append(error)
            continue
        subfolders = []
        for entry in entries:
            try:
                is_folder = entry.is_dir(follow_symlinks=False)  # links to folders are not followed
            except OSError:
                is_folder = False
            if is_folder:
                if entry.name not in SKIPPED_FOLDER_NAMES and entry.path not in SKIPPED_FOLDER_PATHS:
                    subfolders.append(entry.path)
            elif entry.name == name:
                found.append(entry.path)
            elif entry.name in LINKED_PACKAGE_NAMES and entry.is_symlink() and os.path.isdir(entry.path):
                # Not followed (a link may lead back up the tree, or out of an image root), but an
                # SGLang linked in (an editable image, a mounted checkout) is worth a word.
                links.append(
                    "%s is a link to a folder (%s), not followed: give that folder as --source to judge it"
                    % (shown(entry.path), shown(os.path.realpath(entry.path)))
                )
        stack.extend(sorted(subfolders, reverse=True))
    unreadable = ["%s: %s" % (shown(error.filename or root), error.strerror or error) for error in errors]
    readable = []
    for path in found:
        problem = _file_problem(path)
        if problem:
            unreadable.append("%s: %s" % (shown(path), problem))
        else:
            readable.append(path)
    return readable, unreadable, links


# A link by one of these names is said when the walk skips it: SGLang's package, linked in.
LINKED_PACKAGE_NAMES = frozenset(("sglang",))


def _file_problem(path):
    """Why a backend file found by the walk cannot be read, or None."""
    if not os.path.exists(path):
        return _link_problem(path) or "a broken link"
    info = os.stat(path)
    if not stat.S_ISREG(info.st_mode):
        return _kind_of(info)  # a FIFO would block the read
    if not os.access(path, os.R_OK):
        return "permission denied"
    return None


def of_tree(hotfix, root):
    """(report dict, [assessments], exit status) for every backend file under ``root``; the exit
    status is the worst of them, and EXIT_BAD_PATH where a part of the tree could not be read (a
    backend may sit there: the verdicts cover only what was read). Raises PathProblem."""
    files, unreadable, links = backend_files(hotfix, root)
    reports, assessments, code = [], [], EXIT_BAD_PATH if unreadable else EXIT_OK
    for path in files:
        report, assessment, file_code = of_file(hotfix, path)
        reports.append(report)
        assessments.append(assessment)
        code = max(code, file_code)
    document = {
        "format_version": FORMAT_VERSION,
        "root": root,
        "sources": reports,
        "unreadable": unreadable,
        "not_followed": links,
    }
    return document, assessments, code


def headline(report):
    """The line that opens a record's block: what this record means here."""
    verdict = report["verdict"]
    version = report.get("sglang_version") or "(version unknown)"
    record = report["hotfix"]
    if verdict == "affected" and report.get("would_patch"):
        return "record %s: SGLang %s has its bug, and it will be patched: %s" % (
            record,
            version,
            report["would_patch_reason"],
        )
    if verdict == "affected":
        return "record %s: SGLang %s has its bug, but a new process would run it unpatched: %s" % (
            record,
            version,
            report["would_patch_reason"],
        )
    if verdict == "fixed":
        return "record %s: SGLang %s already has its fix" % (record, version)
    if verdict == "not-applicable":
        return "record %s: nothing to do: %s" % (record, report["reason"])
    if verdict == "unrepairable" and _is_kernel_bug(record):
        return "record %s: SGLang %s reaches this FlashInfer kernel bug, which this hotfix never repairs: %s" % (
            record,
            version,
            report["reason"],
        )
    if verdict == "unrepairable":
        return "record %s: SGLang %s has its bug, which this hotfix recognises but cannot repair exactly here: %s" % (
            record,
            version,
            report["reason"],
        )
    return "record %s: the installed code is not recognised, so it is left unpatched: %s" % (record, report["reason"])


def _why_open(report):
    """Why a record's bug would run, for the first line. An unrepairable record's whole reason is
    its block's (who it concerns, why no wrapper repairs it): here only what fixes it."""
    if report["verdict"] == "unrepairable" and report["decision"] == engine.Action.UNREPAIRABLE.value:
        if _is_kernel_bug(report["hotfix"]):
            return (
                "a FlashInfer kernel bug this hotfix never repairs; %s fixes it (`status --verbose`: who it concerns)"
                % (report.get("upstream") or "FlashInfer")
            )
        return (
            "a bug this hotfix recognises but cannot repair here; %s fixes it (`status --verbose`: who it concerns)"
            % (report.get("upstream") or "upstream")
        )
    return report["would_patch_reason"]


def _is_kernel_bug(name):
    """Whether record ``name`` is one of FlashInfer's own kernel bugs (``Hotfix.flashinfer_fix``)."""
    hotfix = next((h for h in catalog.HOTFIXES if h.name == name), None)
    return hotfix is not None and hotfix.flashinfer_fix is not None


def _kernel_bug_absent(report):
    """A record of FlashInfer's own kernel bug (``Hotfix.flashinfer_fix``) that is not reported here:
    the package carries no fix for it, so it does not keep the package needed."""
    return _is_kernel_bug(report["hotfix"]) and report["verdict"] == "not-applicable"


def _by_reason(reports, why):
    """``record: reason`` for each reason once, the records sharing it named together (a reason
    said for every record, "no loader is active" say, is one sentence, not one per record); one
    reason for all of them: the reason alone, the line names them before it ("record pr26521:
    pr26521: ..." said the name twice)."""
    grouped = {}
    for report in reports:
        grouped.setdefault(why(report), []).append(report["hotfix"])
    if len(grouped) == 1:  # the line names the records already
        return next(iter(grouped))
    return "; ".join("%s: %s" % (", ".join(records), reason) for reason, records in grouped.items())


def _patched_words(patched, running):
    if not running:
        return "would be patched"
    return "is patched" if len(patched) == 1 else "are patched"


def named(reports):
    """The records of a line in the number its verb takes: "record A" or "records A, B"."""
    return "record%s %s" % ("" if len(reports) == 1 else "s", ", ".join(r["hotfix"] for r in reports))


def _accepted_by(report):
    """What took an unrepaired bug out of the verdict: `--accept`, the variable, or turning it off."""
    if not report.get("accepted"):
        return switches.DISABLE
    return "--accept" if report["hotfix"] in ACCEPTED_BY_ARGUMENT else switches.ACCEPT


def overall_headline(reports, code, subject=None, running=False):
    """The one first line of ``status``: a verdict across every record, whose
    first word matches the exit status ``code`` (0 PROTECTED or NOTHING TO DO,
    1 NOT PROTECTED, 2 CANNOT PATCH). The Docker recipe reads this line.
    ``subject``: what the line speaks of, "SGLang <version>" unless given (a file's path)."""
    version = next((r.get("sglang_version") for r in reports if r.get("sglang_version")), None) or "(version unknown)"
    sglang = subject or "SGLang %s" % version
    affected = [r for r in reports if r["verdict"] == "affected"]
    if code == EXIT_ERROR and reports and not any(r.get("sglang_installed", True) for r in reports):
        return (
            "CANNOT PATCH: SGLang is not installed for this Python (%s; its sys.path has no sglang package): "
            "the plugin was installed with another interpreter's pip, or SGLang is missing; install it with "
            "the pip of the Python that runs SGLang (`python -m pip install ...`)" % sys.executable
        )
    if code == EXIT_ERROR:
        failing = [r for r in reports if r["decision"] in [action.value for action in engine.REFUSALS]]
        return "CANNOT PATCH: %s: %s: %s" % (
            sglang,
            named(failing),
            _by_reason(failing, lambda r: r["would_patch_reason"]),
        )
    accepted = [
        r
        for r in reports
        if r["verdict"] == "unrepairable" and (r["decision"] == engine.Action.DISABLED.value or r.get("accepted"))
    ]
    patched = [r for r in affected if r["would_patch"]]
    if code == EXIT_UNPROTECTED:
        open_ = [
            r
            for r in reports
            if r["verdict"] in ("affected", "unknown", "unrepairable") and not r["would_patch"] and r not in accepted
        ]
        return "NOT PROTECTED: %s: %s %s: %s%s" % (
            sglang,
            named(open_),
            ("runs" if len(open_) == 1 else "run") + " unpatched there"
            if running
            else "would run unpatched in a new process",
            _by_reason(open_, _why_open),
            (" (%s %s)" % (named(patched), _patched_words(patched, running))) if patched else "",
        )
    said_accepted = (
        "; %s: %s unrepaired (%s), accepted by %s"
        % (
            named(accepted),
            "its bug runs" if len(accepted) == 1 else "their bugs run",
            _by_reason(accepted, lambda r: r["would_patch_reason"]),
            " and ".join(
                sorted(
                    {_accepted_by(r) for r in accepted},
                )
            ),
        )
        if accepted
        else ""
    )
    if affected:
        coverage = {r.get("covered_processes") for r in affected}
        words = COVERAGE_WORDS.get(coverage.pop()) if len(coverage) == 1 else None
        return "PROTECTED: %s has the %s of %s; %s%s" % (
            sglang,
            "bug" if len(affected) == 1 else "bugs",
            named(affected),
            words or "; ".join(r["would_patch_reason"] for r in affected),
            said_accepted,
        )
    if accepted:
        return "NOTHING TO DO: %s%s" % (sglang, said_accepted)
    if all(r["verdict"] == "fixed" or _kernel_bug_absent(r) for r in reports):
        return "NOTHING TO DO: %s already has every fix this package carries; it can be removed (%s)" % (
            sglang,
            engine.UNINSTALL_HINT,
        )
    grouped = {}  # one clause per reason, its records named together
    for r in reports:
        grouped.setdefault(r["reason"] if r["verdict"] != "fixed" else "already fixed", []).append(r["hotfix"])
    return "NOTHING TO DO: %s: %s" % (
        sglang,
        "; ".join(
            "%s %s: %s" % ("records" if len(names) > 1 else "record", ", ".join(names), reason)
            for reason, names in grouped.items()
        ),
    )


# What ``status --source`` and the README's table assume of the environment that runs the code.
INSTALLED_BY_PIP = (
    "with the plugin installed by pip where this code runs, every Python process that imports it is patched"
)
COVERAGE_WORDS[IF_INSTALLED_BY_PIP] = INSTALLED_BY_PIP


def headline_of_verdicts(subject, verdicts, upstreams, accepted=frozenset(), reasons=None):
    """(first line, exit status) of ``status`` for code with these verdicts (record name ->
    verdict), where the plugin is installed by pip: ``status --source`` for one file, and the
    README's table for a release (``tools/docs_tables.py``). ``subject`` names the code ("SGLang
    0.5.12", a file's path); ``upstreams``: record name -> ``Hotfix.upstream``; ``accepted``: the
    records whose unrepairable bug the operator accepts (``switches.ACCEPT``); ``reasons``: record
    name -> the reason its verdict was given, said where the line names it (else the verdict)."""
    reports = []
    for name, verdict in verdicts.items():
        affected = verdict == "affected"
        reports.append(
            {
                "hotfix": name,
                "upstream": upstreams.get(name),
                "verdict": verdict,
                "reason": (reasons or {}).get(name) or verdict,
                "sglang_version": subject,
                "would_patch": affected,
                # Only what overall_headline asks of it: a refusal is named on the CANNOT PATCH line.
                "decision": engine.Action.PATCH.value
                if affected
                else engine.Action.UNKNOWN_CODE.value
                if verdict == "unknown"
                else verdict,
                "would_patch_reason": INSTALLED_BY_PIP
                if affected
                else "the code is not recognised"
                if verdict == "unknown"
                else "a bug this hotfix recognises but does not repair"
                if verdict == "unrepairable"
                else verdict,
                "covered_processes": IF_INSTALLED_BY_PIP if affected else NONE,
                "accepted": name in accepted,
            }
        )
    code = max(source_exit_status(Verdict(verdict), name in accepted) for name, verdict in verdicts.items())
    return overall_headline(reports, code, subject=subject), code


def record_line(report, width):
    """One record in plain ``status``'s short form: its name, verdict and what a process started now
    does about it (the whole report: ``status --verbose``)."""
    verdict, decision = report["verdict"], report.get("decision")
    if verdict == "affected":
        what = "will be patched" if report.get("would_patch") else "runs unpatched: %s" % report["would_patch_reason"]
    elif verdict == "unrepairable":
        what = (
            "turned off by %s: its bug runs unrepaired, accepted" % switches.DISABLE
            if decision == engine.Action.DISABLED.value
            else "runs unrepaired: not repairable here; %s fixes it" % (report.get("upstream") or "upstream")
        )
    elif verdict == "unknown":
        what = "refused: %s" % report["would_patch_reason"]
    elif verdict == "fixed":
        what = "nothing to do: already fixed"
    else:
        what = "nothing to do"
    return "  %-*s  %-14s  %s" % (width, report["hotfix"], verdict, what)


def environment_line(report):
    """What is the same for every record, in one line of plain ``status``."""
    loaders = [
        name
        for name, on in (
            ("the startup file", report.get("startup_file_active")),
            ("`run`", report.get("launcher_active")),
            ("SGLang's plugin loader", report.get("entry_point_installed") and report.get("sglang_plugin_framework")),
        )
        if on
    ]
    switched = {key: value for key, value in (report.get("switches") or {}).items() if value}  # set ones only
    flashinfer = (
        "FlashInfer %s at %s" % (report.get("flashinfer_version") or "(version unknown)", report["flashinfer_location"])
        if report.get("flashinfer_location")
        else "FlashInfer %s (%s)"
        % (report.get("flashinfer_version") or "(version unknown)", report["flashinfer_problem"])
        if report.get("flashinfer_problem")
        else "FlashInfer not installed"
    )
    line = "plugin %s at %s; SGLang %s (%s); %s; loaders: %s; switches set: %s" % (
        report.get("plugin_version"),
        report.get("plugin_location"),
        report.get("sglang_version") or "(not installed)",
        report.get("sglang_install_kind") or "-",
        flashinfer,
        ", ".join(loaders) or "none active",
        readable(switched) if switched else "none",
    )
    # A switch whose value was not understood is said in plain status too, not only in --json and
    # the process log: "switches set: none" over STRICT=maybe would hide what the operator meant.
    return "".join(
        [line] + ["\nswitch not understood: %s" % problem for problem in report.get("switch_problems") or ()]
    )


def readable(value):
    """A value as a person reads it: no Python reprs."""
    if value is None:
        return "-"
    if value is True or value is False:
        return "yes" if value else "no"
    if isinstance(value, dict):
        return ", ".join("%s: %s" % (k, readable(v)) for k, v in value.items()) or "-"
    if isinstance(value, (list, tuple)):
        return ", ".join(readable(v) for v in value) or "none"
    return str(value)


# --------------------------------------------------------------------------
# A running process (status --pid, status --processes): what it recorded itself (process_state)


def _record_exit_status(name, verdict, decision, patched):
    """``exit_status`` for what a process recorded: "removed" (remove() ran there) counts as the
    operator's choice, as a record turned off; the bugs the asker accepts (``switches.ACCEPT`` where
    ``status`` runs) as where ``status`` judges this environment."""
    action = engine.Action.DISABLED if decision == "removed" else engine.Action(decision)
    return exit_status(Verdict(verdict), action, patched, name in switches.read().accepted_records)


def _installed_needs():
    """The records whose bug the SGLang installed here has (affected, unrepairable, unknown): what a
    process of this environment that runs without the hotfix runs unpatched."""
    with detect.shared_parses():
        assessed = [(h, detect.assess_installed(h)) for h in catalog.HOTFIXES]
    bugs = (Verdict.AFFECTED, Verdict.UNREPAIRABLE, Verdict.UNKNOWN)
    return [(h, a) for h, a in assessed if a.verdict in bugs], assessed


def of_process(pid):
    """(headline, exit status, document) for the live process ``pid``, from the state file it wrote
    (``process_state``); where it wrote none, what can be told from outside (its environment, its
    start against the install's). Raises PathProblem (exit 3) where there is no such process."""
    if pid > 0 and process_state.is_zombie(pid):
        raise PathProblem("process %d has exited (its parent has not reaped it yet): it runs nothing" % pid)
    if pid <= 0 or not process_state.alive(pid):
        raise PathProblem("no process %d on this host or container" % pid)
    command = process_state.command_line(pid)
    document, where = process_state.read(pid)
    facts = {"pid": pid, "command": command, "state_file": where if document is not None else None}
    facts.update(_flashinfer_of(document))
    if document is not None:
        reports, code = [], EXIT_OK
        for hotfix in catalog.HOTFIXES:
            recorded = document["records"].get(hotfix.name)
            if recorded is None:  # a record that process's version of the plugin does not carry
                reports.append(_not_recorded(hotfix, "not carried by the hotfix that process runs"))
                continue
            patched = bool(recorded["patched"])
            reports.append(
                {
                    "hotfix": hotfix.name,
                    "upstream": recorded.get("upstream") or hotfix.upstream,
                    "verdict": recorded["verdict"],
                    "reason": recorded["reason"],
                    "fingerprint": recorded.get("fingerprint"),
                    "sglang_version": recorded.get("sglang_version"),
                    "would_patch": patched,
                    "decision": recorded["decision"],
                    "would_patch_reason": recorded["why"],
                    "covered_processes": THIS_PROCESS if patched else NONE,
                }
            )
            code = worst(code, _record_exit_status(hotfix.name, recorded["verdict"], recorded["decision"], patched))
        version = next((r["sglang_version"] for r in reports if r.get("sglang_version")), None)
        subject = "process %d (SGLang %s)" % (pid, version or "version unknown")
        written = document.get("written")
        facts.update(plugin_version=document.get("plugin_version"), python=document.get("python"), recorded_at=written)
        # The file says what the process did when it handled its records (and after remove()); code
        # that replaced a patched method there since (an assignment, a HookRegistry REPLACE) leaves no
        # trace outside the process: the answer says when it was recorded, not more.
        headline = "%s; as that process recorded it%s (a method replaced there since cannot be seen from outside)" % (
            overall_headline(reports, code, subject=subject, running=True),
            " at %s" % _when(written) if isinstance(written, (int, float)) else "",
        )
        return headline, code, dict(facts, hotfixes=reports)
    return _without_state(pid, facts, where)


def _flashinfer_of(document):
    """The FlashInfer ``status --pid`` names: the one the process recorded having imported, else the
    one installed here, labelled as such (``flashinfer_source``: "imported" or "installed"; what that
    process runs may differ from it)."""
    imported = (document or {}).get("flashinfer")
    if isinstance(imported, dict) and imported.get("location"):
        return {
            "flashinfer_version": imported.get("version"),
            "flashinfer_location": imported["location"],
            "flashinfer_source": "imported",
        }
    from . import flashinfer_install

    found = flashinfer_install.installed()
    return {
        "flashinfer_version": found.version,
        "flashinfer_location": found.folder,
        "flashinfer_problem": found.problem,
        "flashinfer_source": "installed",
    }


def flashinfer_text(facts):
    """The line ``status --pid`` says of the FlashInfer of that process."""
    if facts.get("flashinfer_source") == "imported":
        return "FlashInfer %s at %s (imported by that process)" % (
            facts.get("flashinfer_version") or "(version unknown)",
            facts["flashinfer_location"],
        )
    if facts.get("flashinfer_problem") and not facts.get("flashinfer_location"):
        return "FlashInfer %s here cannot be read (%s): that process recorded none it imported" % (
            facts.get("flashinfer_version") or "(version unknown)",
            facts["flashinfer_problem"],
        )
    if not facts.get("flashinfer_location"):
        return "FlashInfer: that process recorded none, and none is installed here"
    return "FlashInfer %s at %s (the one installed here: that process recorded none it imported)" % (
        facts.get("flashinfer_version") or "(version unknown)",
        facts["flashinfer_location"],
    )


def _not_recorded(hotfix, why):
    return {
        "hotfix": hotfix.name,
        "upstream": hotfix.upstream,
        "verdict": "not-loaded",
        "reason": why,
        "would_patch": False,
        "decision": "none",
        "would_patch_reason": why,
        "covered_processes": NONE,
    }


def _cannot_tell(pid, facts, why, what_to_do):
    headline = "CANNOT TELL: process %d: %s; %s" % (pid, why, what_to_do)
    return headline, EXIT_UNKNOWN, dict(facts, hotfixes=[], why=headline)


def _without_state(pid, facts, looked):
    """A live process whose state could not be read: what can be *seen* from outside, and CANNOT
    TELL (exit 3) for the rest. NOTHING TO DO only where it is observed: not an SGLang process, or
    one of SGLang's processes that never import the backend (by the title SGLang gives it)."""
    facts["looked_for"] = looked
    uid = process_state.owner(pid)
    as_whom = "ask as root or as its owner (uid %s)" % uid
    if looked.startswith("not trusted"):  # a folder someone else could have written
        return _cannot_tell(
            pid,
            facts,
            "its state folder is %s" % looked,
            "what it holds is not read: give the process a folder only its user owns and can write (%s)"
            % process_state.STATE_DIR_VARIABLE,
        )
    if not looked.startswith("no state file"):  # there, but this user cannot read it
        return _cannot_tell(pid, facts, "its state %s" % looked, as_whom)
    if not process_state.looks_like_sglang(pid):
        headline = (
            "NOTHING TO DO: process %d recorded no decision of this hotfix and is not an SGLang process as far as "
            "can be seen (its command line does not name SGLang, its memory holds no SGLang kernel)" % pid
        )
        return headline, EXIT_OK, dict(facts, hotfixes=[], why=headline)
    title = process_state.non_model_title(pid)
    if title is not None:
        headline = "NOTHING TO DO: process %d is SGLang's %s, which never imports the trtllm_mha backend" % (
            pid,
            title.partition("::")[2],
        )
        return headline, EXIT_OK, dict(facts, hotfixes=[], why=headline)
    children = [child for child in process_state.children_of(pid) if process_state.looks_like_sglang(child)]
    if children:
        return _for_children(pid, facts, children)
    environ = process_state.environ_of(pid)
    if environ is None:
        return _cannot_tell(pid, facts, "it recorded no decision and its environment cannot be read", as_whom)
    started, installed = process_state.started_at(pid), _installed_at()
    current = switches.read(environ)
    if current.disabled:
        switch = current.disabled_why or "%s=%s" % (switches.DISABLE, environ.get(switches.DISABLE))
        why = "%s in its environment: the hotfix does nothing there" % switch
    elif started is not None and installed is not None and started < installed:
        why = "it started (%s) before this hotfix was installed (%s): it runs without it; restart it to be patched" % (
            _when(started),
            _when(installed),
        )
    elif started is None or installed is None:
        return _cannot_tell(
            pid,
            facts,
            "it recorded no decision, and when %s cannot be read"
            % ("it started" if started is None else "this hotfix was installed"),
            "`sglang-hotfix-trtllm status --processes` lists what the others recorded",
        )
    else:
        folder = process_state.state_dir(uid=uid, environ=environ)
        return _cannot_tell(
            pid,
            facts,
            "it recorded no decision of this hotfix (looked for %s): it may not have imported SGLang's trtllm_mha "
            "backend yet, or the hotfix did not run there or could not record it (a Python started with -S or of "
            "another environment, the switch set at run time, a state folder it cannot write)" % looked,
            "its log's sglang-hotfix-trtllm lines say which; the state folder is %s" % folder,
        )
    needs, assessed = _installed_needs()
    facts["why"] = why
    reports = [_not_recorded(h, why) for h in catalog.HOTFIXES]
    if not needs:
        return (
            "NOTHING TO DO: process %d: %s; the SGLang installed here needs none of its records" % (pid, why),
            EXIT_OK,
            dict(facts, hotfixes=reports),
        )
    return (
        "NOT PROTECTED: process %d: %s; the SGLang installed here has the bugs of record %s"
        % (pid, why, ", ".join(h.name for h, _ in needs)),
        EXIT_UNPROTECTED,
        dict(facts, hotfixes=reports),
    )


def _for_children(pid, facts, children):
    """A process that recorded nothing itself but started SGLang processes (a server's main process,
    whose schedulers import the backend): the worst of their answers, each named."""
    answers = []
    for child in children:
        try:
            answers.append((child,) + of_process(child))
        except PathProblem:
            continue
    if not answers:
        return _cannot_tell(pid, facts, "it recorded no decision and its SGLang children are gone", "ask again")
    code = worst(*(c for _, _, c, _ in answers))
    word = HEADLINE_WORDS[code] or (
        "PROTECTED" if any(line.startswith("PROTECTED") for _, line, _, _ in answers) else "NOTHING TO DO"
    )
    headline = "%s: process %d recorded nothing itself; the SGLang processes it started answer: %s" % (
        word,
        pid,
        "; ".join("%d %s" % (child, line.partition(":")[0]) for child, line, _, _ in answers),
    )
    children_documents = [dict(doc, pid=child, headline=line, exit_status=c) for child, line, c, doc in answers]
    return headline, code, dict(facts, hotfixes=[], why=headline, children=children_documents)


HEADLINE_WORDS = {
    EXIT_OK: None,
    EXIT_UNKNOWN: "CANNOT TELL",
    EXIT_UNPROTECTED: "NOT PROTECTED",
    EXIT_ERROR: "CANNOT PATCH",
}


def _installed_at():
    """When this hotfix was installed, from what the installer wrote: the newest of its dist-info
    folder (made at install time even where uv hard-links the files from its cache, whose times are
    the cache's) and the package's ``__init__.py``; None where neither can be read."""
    import glob

    candidates = glob.glob(os.path.join(launcher.INSTALL_DIR, "sglang_hotfix_trtllm-*.dist-info"))
    candidates.append(os.path.join(launcher.INSTALL_DIR, "sglang_hotfix_trtllm", "__init__.py"))
    times = []
    for path in candidates:
        try:
            times.append(os.stat(path).st_mtime)
        except OSError:
            pass
    return max(times) if times else None


def _when(seconds):
    import time

    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(seconds))


def of_processes():
    """(headline, exit status, [(pid, headline, code, document)]) for every SGLang process here: those
    with a state file (this user's folder) and those whose command line names SGLang."""
    pids = sorted(set(process_state.recorded_pids()) | set(process_state.sglang_pids()))
    answers = []
    with detect.shared_parses():  # processes judged from outside read the installed SGLang: parse it once
        for pid in pids:
            try:
                answers.append((pid,) + of_process(pid))
            except PathProblem:  # gone meanwhile
                continue
    if not answers:
        return "NOTHING TO DO: no SGLang process found on this host or container", EXIT_OK, answers
    code = worst(*(c for _, _, c, _ in answers))
    word = HEADLINE_WORDS[code]
    if word is None:
        protected = [pid for pid, line, _, _ in answers if line.startswith("PROTECTED")]
        return (
            "%s: %d SGLang process(es) here, none runs a bug of this hotfix's records unpatched%s"
            % (
                "PROTECTED" if protected else "NOTHING TO DO",
                len(answers),
                " (patched in process %s)" % ", ".join(map(str, protected)) if protected else "",
            ),
            code,
            answers,
        )
    failing = [pid for pid, _, c, _ in answers if c == code]
    return (
        "%s: process %s of the %d SGLang process(es) here (each line below says why)"
        % (word, ", ".join(map(str, failing)), len(answers)),
        code,
        answers,
    )
