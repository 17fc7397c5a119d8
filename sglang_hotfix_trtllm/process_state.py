"""A running process's own answer: what the hotfix did in it, kept where ``status --pid`` reads it.

``status`` alone answers for a process started now; a server started before ``pip install``, or
with ``SGLANG_HOTFIX_TRTLLM_DISABLE=1`` in its own environment, is another matter. As kpatch's
``/sys/kernel/livepatch`` does for a kernel, each process that decides (the engine, when SGLang's
backend module is imported, and ``remove()``) writes one small JSON file: each record's verdict,
what was done (patched, turned off and why, refused) and the process's identity (pid and start
time: a pid the system reuses is not mistaken for it). The folder is per user, needs no root:
``/tmp/sglang-hotfix-trtllm-<uid>/`` (``SGLANG_HOTFIX_TRTLLM_STATE_DIR`` overrides it), one file
``<pid>-<start>.json`` per process, written whole then renamed, so a reader never sees half of one.
A process that writes its file deletes those of processes that are gone, once, and at most
``PRUNE_AT_MOST`` of them (``status --processes`` prunes too): the folder holds about one file per
live process, not one per process ever started. ``pip uninstall`` leaves the folder (it is not the
installer's): ``rm -rf /tmp/sglang-hotfix-trtllm-$(id -u)`` removes it.

Cost: nothing in a process that never imports SGLang's backend; in one that does, one write of
about 2 KB after the records are handled, and the first time one listing of the folder and a read
of ``/proc/PID/stat`` per file in it, bounded (the backend's import itself takes seconds). Never raises
into the host: a failure to write costs one WARNING line, once, and ``status --pid`` then answers
CANNOT TELL.

Standard library only.
"""

import json
import logging
import os
import re
import stat
import sys
import time

from .logs import say

STATE_DIR_VARIABLE = "SGLANG_HOTFIX_TRTLLM_STATE_DIR"
FORMAT = 1

_records = {}  # record name -> what was done in this process (the file's "records")
_pruned = False  # this process has pruned the folder once (publish() runs again after remove())
# Files of gone processes deleted per prune, and entries looked at: a folder grown large before this
# version (or shared by many short-lived processes) costs a writer a bounded time, and empties over
# the next writes.
PRUNE_AT_MOST = 64
EXAMINE_AT_MOST = 4 * PRUNE_AT_MOST


def state_dir(uid=None, environ=None):
    """The folder of the state files of ``uid``'s processes (this process's uid by default)."""
    environ = os.environ if environ is None else environ
    chosen = environ.get(STATE_DIR_VARIABLE)
    if chosen:
        return chosen
    if uid is None:
        uid = _own_uid() or 0
    # Not TMPDIR or tempfile's choice: the shell that asks may have another one than the server.
    return os.path.join("/tmp" if os.name == "posix" else os.path.expanduser("~"), "sglang-hotfix-trtllm-%d" % uid)


def start_ticks(pid):
    """The process's start time in clock ticks since boot (field 22 of /proc/PID/stat), as text;
    None where there is no /proc or the process is gone."""
    fields = _stat_fields(pid)
    return fields[19].decode("ascii", "replace") if fields and len(fields) > 19 else None


def _own_uid():
    """This process's uid (None where the platform has none)."""
    return os.getuid() if hasattr(os, "getuid") else None


def file_name(pid, ticks):
    return "%d-%s.json" % (pid, ticks or "na")


def note(hotfix, verdict, reason, fingerprint, sglang_version, decision, why, patched):
    """What ``engine.handle`` decided and did for one record in this process."""
    _records[hotfix.name] = {
        "verdict": verdict,
        "reason": reason,
        "fingerprint": fingerprint,
        "sglang_version": sglang_version,
        "upstream": hotfix.upstream,
        "decision": decision,
        "why": why,
        "patched": patched,
    }


def removed():
    """``remove()`` ran: nothing is patched in this process any more, by the operator's call."""
    for record in _records.values():
        if record["patched"]:
            record.update(patched=False, decision="removed", why="remove() was called in this process")
    publish()


def publish():
    """Write this process's file (whole, then renamed into place). Never raises."""
    if not _records:
        return False
    try:
        pid = os.getpid()
        ticks = start_ticks(pid)
        folder = state_dir()
        os.makedirs(folder, mode=0o700, exist_ok=True)
        problem = folder_problem(folder, _own_uid())
        if problem:  # someone else's folder in /tmp: writing there would hand them what status reads
            raise PermissionError(problem)
        document = {
            "format": FORMAT,
            "pid": pid,
            "start_ticks": ticks,
            "python": sys.executable,
            "argv": list(sys.argv[:16]),
            "plugin_version": _plugin_version(),
            "written": time.time(),
            "records": _records,
            "flashinfer": imported_flashinfer(),
            "pid_namespace": pid_namespace(),
        }
        target = os.path.join(folder, file_name(pid, ticks))
        partial = "%s.%d.partial" % (target, pid)
        with open(partial, "w", encoding="utf-8") as handle:
            json.dump(document, handle, sort_keys=True)
        os.replace(partial, target)
        global _pruned
        if not _pruned:
            _pruned = True
            prune(folder)
        return True
    except Exception as error:  # a full or read-only /tmp must not cost the host anything but this line
        # WARNING, once: without the file, `status --pid` of this process can only answer CANNOT TELL.
        say(
            logging.WARNING,
            "cannot record what the hotfix did in this process (%s: %s): `sglang-hotfix-trtllm status --pid %d` will "
            "answer CANNOT TELL; set %s to a folder this user owns and only it can write",
            type(error).__name__,
            error,
            os.getpid(),
            STATE_DIR_VARIABLE,
            once_key="state-not-written",
        )
        return False


def imported_flashinfer():
    """{"version", "location"} of the FlashInfer this process has imported, or None where it has not
    (SGLang imports it with its backend where CUDA is there): read from ``sys.modules``, never imported
    here. ``status --pid`` names it: a process can run another FlashInfer than the installed one (one
    on its PYTHONPATH, one upgraded since it started), and records' verdicts depend on it."""
    module = sys.modules.get("flashinfer")
    if module is None:
        return None
    path = getattr(module, "__file__", None)
    version = getattr(module, "__version__", None)
    return {"version": None if version is None else str(version), "location": os.path.dirname(path) if path else None}


def folder_problem(folder, uid):
    """Why ``folder`` is not a state folder to trust for ``uid``'s processes, or None: it must be a
    real folder (not a link), owned by that user, writable by no one else. (Another user may have
    made ``/tmp/sglang-hotfix-trtllm-UID`` first, to write or read what ``status`` believes.)"""
    try:
        info = os.lstat(folder)
    except OSError as error:
        return "cannot examine %s: %s" % (folder, error)
    if not stat.S_ISDIR(info.st_mode):
        return "%s is not a folder (a link or a file)" % folder
    if uid is not None and info.st_uid != uid:
        return "%s belongs to uid %d, not %d" % (folder, info.st_uid, uid)
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return "%s is writable by others" % folder
    return None


def _plugin_version():
    from . import __version__

    return __version__


# --------------------------------------------------------------------------
# Reading, for `status --pid` and `status --processes`


def alive(pid):
    """The process exists and runs (on Linux, its /proc entry, not a zombie: it has exited and runs
    nothing, its parent has not reaped it yet; elsewhere, a signal 0)."""
    if os.path.isdir("/proc/%d" % pid):
        return not is_zombie(pid)
    if os.path.isdir("/proc/self"):
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # it exists, but belongs to someone else
    return True


def _stat_fields(pid):
    """The fields of /proc/PID/stat after the command name (state first: field 3), or None. The
    command name, in parentheses, may hold spaces and parentheses: the fields follow the last ")"."""
    try:
        with open("/proc/%d/stat" % pid, "rb") as handle:
            data = handle.read()
    except (OSError, ValueError):
        return None
    return data.rpartition(b")")[2].split()


def _pids():
    """Every process id /proc lists ([] where it cannot be read)."""
    try:
        return [int(entry) for entry in os.listdir("/proc") if entry.isdigit()]
    except OSError:
        return []


def is_zombie(pid):
    fields = _stat_fields(pid)
    return bool(fields) and fields[0] == b"Z"


def children_of(pid):
    """The live processes whose parent is ``pid`` (a server's main process and the schedulers it
    spawned), from /proc; [] where it cannot be read."""
    parent = str(pid).encode()
    found = []
    for candidate in _pids():
        fields = _stat_fields(candidate)
        if fields and len(fields) > 1 and fields[1] == parent and fields[0] != b"Z":
            found.append(candidate)
    return sorted(found)


# Titles SGLang gives the processes of a server that never import the backend (setproctitle in
# detokenizer_manager.py, multi_tokenizer_mixin.py, data_parallel_controller.py).
NON_MODEL_TITLES = ("sglang::detokenizer", "sglang::tokenizer_worker", "sglang::data_parallel_controller")


def non_model_title(pid):
    """SGLang's title of a process that never imports the backend, or None."""
    words = command_line(pid) or ()
    first = words[0] if words else ""
    return next((title for title in NON_MODEL_TITLES if first.startswith(title)), None)


def environ_of(pid):
    """The process's environment at its start (/proc/PID/environ), or None where it cannot be read
    (another user's process without root, no /proc)."""
    try:
        with open("/proc/%d/environ" % pid, "rb") as handle:
            data = handle.read()
    except OSError:
        return None
    pairs = (item.partition(b"=") for item in data.split(b"\0") if item)
    return {key.decode("utf-8", "replace"): value.decode("utf-8", "replace") for key, _, value in pairs}


def command_line(pid):
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as handle:
            return [part.decode("utf-8", "replace") for part in handle.read().split(b"\0") if part]
    except OSError:
        return None


def owner(pid):
    try:
        return os.stat("/proc/%d" % pid).st_uid
    except OSError:
        return None


def started_at(pid):
    """The process's start as seconds since the epoch (boot time plus its start ticks), or None."""
    ticks = start_ticks(pid)
    try:
        with open("/proc/stat", encoding="ascii") as handle:
            boot = next(int(line.split()[1]) for line in handle if line.startswith("btime "))
        return boot + int(ticks) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, TypeError, StopIteration, AttributeError):
        return None


def _folders_of(pid):
    """Where process ``pid`` writes its file: its own state folder (by its environment and uid), seen
    through /proc/PID/root first (a private /tmp), then as this process sees it."""
    environ = environ_of(pid) or {}
    uid = owner(pid)
    folder = state_dir(uid=uid, environ=environ) if uid is not None or STATE_DIR_VARIABLE in environ else state_dir()
    return ["/proc/%d/root%s" % (pid, folder) if folder.startswith("/") else folder, folder]


def read(pid):
    """(document, path) of the live process ``pid``'s state file, or (None, why) where it has none."""
    ticks = start_ticks(pid)
    name = file_name(pid, ticks)
    tried = []
    uid = owner(pid)
    for folder in _folders_of(pid):
        path = os.path.join(folder, name)
        tried.append(path)
        problem = folder_problem(folder, uid)
        if problem and os.path.lexists(folder):
            return None, "not trusted: %s" % problem
        try:
            with open(path, encoding="utf-8") as handle:
                document = json.load(handle)
        except FileNotFoundError:
            continue
        except (OSError, ValueError) as error:
            return None, "cannot read %s: %s" % (path, error)
        if isinstance(document, dict) and document.get("pid") == pid and document.get("start_ticks") == ticks:
            return document, path
    return None, "no state file (looked for %s)" % " and ".join(dict.fromkeys(tried))


def _state_file_of(name):
    """(pid, current) for a state file's name: ``current`` when that process still runs (the same pid
    and start: a pid the system reused names another process); (None, None) for a name that is not a
    state file. A partial write (``NAME.PID.partial``) is current while its writer runs."""
    pid_text, _, rest = name.partition("-")
    if not pid_text.isdigit():
        return None, None
    pid = int(pid_text)
    if rest.endswith(".partial") and ".json." in rest:
        writer = rest.rpartition(".json.")[2][: -len(".partial")]
        return pid, writer.isdigit() and alive(int(writer))
    if not rest.endswith(".json"):
        return None, None
    return pid, alive(pid) and file_name(pid, start_ticks(pid)) == name


def pid_namespace():
    """The inode of this process's pid namespace (``/proc/self/ns/pid``), or None where it cannot
    be read. Containers that share a state folder (``-v /tmp:/tmp``) each number processes their own
    way: a pid gone here may be a live server there."""
    try:
        return os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return None


def _gone_here(folder, name):
    """Whether the state file ``name`` of a process that is not running here may be deleted: written
    in this pid namespace (its document says so). A file of another namespace, of an older format
    without the field, or unreadable is left alone; a partial write only when an hour old."""
    path = os.path.join(folder, name)
    try:
        if name.endswith(".partial"):
            return time.time() - os.stat(path).st_mtime > 3600
        with open(path, encoding="utf-8") as handle:
            document = json.load(handle)
    except (OSError, ValueError):
        return False
    ours = pid_namespace()
    return isinstance(document, dict) and ours is not None and document.get("pid_namespace") == ours


def _remove(folder, name):
    try:
        os.remove(os.path.join(folder, name))
        return True
    except OSError:
        return False


def prune(folder, at_most=PRUNE_AT_MOST):
    """Delete, in ``folder`` (a state folder the caller trusts), up to ``at_most`` files of processes
    that are gone, looking at no more than ``EXAMINE_AT_MOST`` entries; returns how many went.
    Never raises."""
    removed = 0
    try:
        with os.scandir(folder) as listing:
            for examined, entry in enumerate(listing):
                if removed >= at_most or examined >= EXAMINE_AT_MOST:
                    break
                pid, current = _state_file_of(entry.name)
                if pid is not None and not current and _gone_here(folder, entry.name):
                    removed += _remove(folder, entry.name)
    except Exception:
        pass
    return removed


def recorded_pids(folder=None):
    """The pids with a state file in ``folder`` (this user's by default), pruning the files of
    processes that are gone or whose pid now names another process."""
    folder = folder or state_dir()
    pids = []
    if folder_problem(folder, _own_uid()):
        return pids  # not a folder this user's processes wrote: nothing in it is believed, or deleted
    try:
        names = os.listdir(folder)
    except OSError:
        return pids
    for name in names:
        pid, current = _state_file_of(name)
        if pid is None or name.endswith(".partial") and current:
            continue
        if current:
            pids.append(pid)
        elif _gone_here(folder, name):
            _remove(folder, name)
    return sorted(pids)


def _names_sglang(words):
    """Some word of the command line (a script's text included) names SGLang, not only this hotfix."""
    tokens = (t for word in words for t in re.findall(r"[\w.:/-]*sglang[\w.:/-]*", word.lower()))
    return any("hotfix" not in token for token in tokens)


def looks_like_sglang(pid):
    """The process is SGLang's as far as can be seen from outside: its command line names SGLang (a
    server, ``sglang::scheduler`` titles, an Engine script), or its memory holds SGLang's kernels."""
    if _names_sglang(command_line(pid) or ()):
        return True
    try:
        with open("/proc/%d/maps" % pid, "rb") as handle:
            maps = handle.read()
    except OSError:
        return False
    return b"sgl_kernel" in maps or b"/sglang/" in maps


def sglang_pids():
    """Live processes of this host or container whose command line names SGLang (a server, its
    schedulers, an Engine script), this one excepted."""
    return sorted(pid for pid in _pids() if pid != os.getpid() and _names_sglang(command_line(pid) or ()))
