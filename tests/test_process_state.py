"""Issue 37 item 2: a running process's own answer (``status --pid``, ``status --processes``).

Each case starts a real Python process of the test environment that imports SGLang 0.5.12's
backend (every record's decision made by the engine as in a server's scheduler), keeps it running,
and asks ``status`` about it from a shell whose environment differs where the case says. The state
folder is the test's own (``SGLANG_HOTFIX_TRTLLM_STATE_DIR``, set for both sides, as a container
sets nothing and both sides find ``/tmp/sglang-hotfix-trtllm-UID``).
"""

import json
import os
import subprocess
import sys
import time

import pytest

from conftest import clean_env, run_cli, run_python, status_json
from sglang_hotfix_trtllm import process_state
from sglang_hotfix_trtllm import status as state

CHILD = """
import sys
import sglang.srt.layers.attention.trtllm_mha_backend
print("ready", flush=True)
for line in sys.stdin:
    if line.strip() == "remove":
        import sglang_hotfix_trtllm
        sglang_hotfix_trtllm.remove()
        print("removed", flush=True)
    if line.strip() == "replace":  # another plugin's code in place of a method the hotfix patched
        backend = sys.modules["sglang.srt.layers.attention.trtllm_mha_backend"]
        backend.TRTLLMHAAttnBackend.forward_extend = lambda self, *args, **kwargs: None
        print("replaced", flush=True)
"""


class Child:
    def __init__(self, tmp_path, **environment):
        self.state = tmp_path / "state"
        env = clean_env(SGLANG_HOTFIX_TRTLLM_STATE_DIR=str(self.state), **environment)
        # "sglang" in the command line, as a server's: `python -c ... sglang.srt...` names it
        self.process = subprocess.Popen(
            [sys.executable, "-c", CHILD],
            cwd=str(tmp_path),
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        assert self.process.stdout.readline().strip() == "ready"
        self.pid = self.process.pid

    def send(self, line, answer):
        self.process.stdin.write(line + "\n")
        self.process.stdin.flush()
        assert self.process.stdout.readline().strip() == answer

    def status(self, *args, **environment):
        env = clean_env(SGLANG_HOTFIX_TRTLLM_STATE_DIR=str(self.state), **environment)
        return status_json("--pid", str(self.pid), *args, env=env)

    def close(self):
        self.process.stdin.close()
        self.process.wait(timeout=60)


@pytest.fixture
def child(tmp_path):
    made = []

    def start(**environment):
        made.append(Child(tmp_path, **environment))
        return made[-1]

    yield start
    for one in made:
        one.close()


# Pids no process can have here: above the kernel's pid_max (999999 can be a live process's).
with open("/proc/sys/kernel/pid_max") as _handle:
    NO_PID = int(_handle.read()) + 1000


def _records(report):
    return {r["hotfix"]: r for r in report["hotfixes"]}


def test_a_patched_server_process_says_protected_with_what_it_applied(child):
    running = child()
    shown = running.status()
    report = shown.report
    assert shown.returncode == 0 and report["exit_status"] == 0, report
    assert report["headline"].startswith("PROTECTED: process %d (SGLang 0.5.12)" % running.pid)
    records = _records(report)
    assert records["pr31667"]["would_patch"] is True and records["pr31667"]["decision"] == "patch"
    assert records["xqa_workspace"]["verdict"] == "not-applicable" and not records["xqa_workspace"]["would_patch"]
    assert report["state_file"].endswith("%d-%s.json" % (running.pid, process_state.start_ticks(running.pid)))


def test_a_process_started_with_a_record_off_is_not_protected_while_a_new_process_would_be(child):
    """The shell that asks has no switch; the server was started with one: the server's answer."""
    running = child(SGLANG_HOTFIX_TRTLLM_DISABLE="pr31667")
    shown = running.status()
    assert shown.returncode == 1, shown.report
    opening = "NOT PROTECTED: process %d (SGLang 0.5.12): record pr31667 runs unpatched there" % running.pid
    assert shown.report["headline"].startswith(opening), shown.report["headline"]
    assert "(records pr26521, pr25103, pr28144, encoder_only_mask are patched)" in shown.report["headline"]
    assert _records(shown.report)["pr31667"]["would_patch_reason"] == "SGLANG_HOTFIX_TRTLLM_DISABLE names pr31667"
    plain = status_json(env=clean_env())  # what `status` alone says, for a new process
    assert plain.returncode == 0 and plain.report["headline"].startswith("PROTECTED")


def test_remove_in_the_process_is_what_status_pid_then_says(child):
    running = child()
    assert running.status().returncode == 0
    running.send("remove", "removed")
    shown = running.status()
    assert shown.returncode == 1
    assert "remove() was called in this process" in shown.report["headline"], shown.report["headline"]


def test_a_process_with_the_hotfix_off_records_nothing_and_is_judged_from_its_environment(child):
    running = child(SGLANG_HOTFIX_TRTLLM_DISABLE="1")
    assert not running.state.exists() or not os.listdir(running.state)
    shown = running.status()
    assert shown.returncode == 1, shown.report
    assert "SGLANG_HOTFIX_TRTLLM_DISABLE=1 in its environment" in shown.report["headline"]
    assert "pr31667" in shown.report["headline"]  # the installed 0.5.12 has its bug


def test_a_process_started_before_the_install_runs_without_it(child, monkeypatch):
    running = child(SGLANG_HOTFIX_TRTLLM_DISABLE="1")
    for name in os.listdir(running.state) if running.state.exists() else ():
        os.remove(running.state / name)
    monkeypatch.setenv("SGLANG_HOTFIX_TRTLLM_STATE_DIR", str(running.state))
    # Seen from a shell whose clock says the hotfix was installed after the process started:
    started = process_state.started_at(running.pid)
    assert started is not None and abs(started - time.time()) < 600
    monkeypatch.setattr(state, "_installed_at", lambda: started + 5)
    monkeypatch.setattr(process_state, "environ_of", lambda pid: {})  # no switch seen there
    headline, code, document = state.of_process(running.pid)
    assert code == 1 and "before this hotfix was installed" in headline and "restart it" in headline, headline


def test_processes_lists_each_sglang_process_with_its_answer_and_prunes_the_gone(child, tmp_path):
    protected, unprotected = child(), child(SGLANG_HOTFIX_TRTLLM_DISABLE="pr28144")
    stale = protected.state / ("%d-1.json" % NO_PID)
    stale.write_text(json.dumps({"pid": NO_PID, "pid_namespace": process_state.pid_namespace()}))
    elsewhere = protected.state / ("%d-1.json" % (NO_PID + 1))  # another container's process: kept
    elsewhere.write_text(json.dumps({"pid": NO_PID + 1, "pid_namespace": -1}))
    env = clean_env(SGLANG_HOTFIX_TRTLLM_STATE_DIR=str(protected.state))
    shown = status_json("--processes", env=env)
    answers = {p["pid"]: p for p in shown.report["processes"]}
    assert answers[protected.pid]["exit_status"] == 0 and answers[unprotected.pid]["exit_status"] == 1
    assert shown.returncode == 1 and shown.report["headline"].startswith("NOT PROTECTED: process %d" % unprotected.pid)
    assert not stale.exists() and elsewhere.exists()
    text = run_cli("status", "--processes", env=env)
    assert text.stdout.splitlines()[0] == shown.report["headline"]


def test_status_pid_of_no_process_is_exit_3_and_another_question_is_a_usage_error(tmp_path):
    ran = run_cli("status", "--pid", "999999", env=clean_env(SGLANG_HOTFIX_TRTLLM_STATE_DIR=str(tmp_path)))
    assert ran.returncode == 3 and "no process 999999" in ran.stderr and ran.stdout == ""
    ran = run_cli("status", "--pid", str(os.getpid()), "--source", str(tmp_path))
    assert ran.returncode == 64 and "give one" in ran.stderr


def test_a_process_that_is_not_sglangs_has_nothing_to_do(tmp_path):
    ran = status_json("--pid", str(os.getpid()), env=clean_env(SGLANG_HOTFIX_TRTLLM_STATE_DIR=str(tmp_path)))
    # pytest's own command line names no SGLang; its memory may hold SGLang (the tests import it)
    assert ran.returncode == 0, ran.report


def test_an_unwritable_state_folder_never_stops_the_process(tmp_path, child):
    blocked = tmp_path / "state"
    blocked.write_text("a file where the folder should be")
    running = child()  # imports the backend: the engine cannot write its state, and says so at WARNING, once
    assert running.process.poll() is None
    shown = running.status()
    # Issue 48, item 1: 0.14.0 answered NOTHING TO DO (exit 0) about a process it could not see.
    assert shown.returncode == 3 and shown.report["headline"].startswith("CANNOT TELL"), shown.report
    assert "is not a folder" in shown.report["headline"]


def test_a_state_folder_others_can_write_is_neither_written_nor_believed(tmp_path, child):
    """Another user may make /tmp/sglang-hotfix-trtllm-UID first: a folder writable by others (or
    not the user's, or a link) is not written to by the process, and what it holds is not read."""
    folder = tmp_path / "state"
    folder.mkdir()
    folder.chmod(0o777)
    running = child()
    assert running.process.poll() is None and os.listdir(folder) == []
    forged = folder / process_state.file_name(running.pid, process_state.start_ticks(running.pid))
    forged.write_text(
        json.dumps({"pid": running.pid, "start_ticks": process_state.start_ticks(running.pid), "records": {}})
    )
    shown = running.status()
    assert "is writable by others" in shown.stderr and shown.report["headline"].startswith("CANNOT TELL")
    assert shown.returncode == 3 and "is writable by others" in shown.report["headline"]


def test_a_process_that_cannot_record_its_state_says_so_at_warning_once(tmp_path):
    """Issue 48, item 1: it said so at DEBUG only, so nothing in its log told the operator why
    `status --pid` could not see it."""
    blocked = tmp_path / "state"
    blocked.write_text("a file where the folder should be")
    code = "import sglang.srt.layers.attention.trtllm_mha_backend, sglang_hotfix_trtllm; sglang_hotfix_trtllm.remove()"
    ran = run_python(["-c", code], cwd=tmp_path, env=clean_env(SGLANG_HOTFIX_TRTLLM_STATE_DIR=str(blocked)))
    assert ran.returncode == 0, ran
    said = [line for line in ran.hotfix_lines() if "cannot record what the hotfix did in this process" in line]
    assert len(said) == 1 and "WARNING" in said[0] and "CANNOT TELL" in said[0], ran.hotfix_lines()


PARENT = """
import subprocess, sys
# the main process of a server: it names SGLang, imports no backend, and starts one that does
child = subprocess.Popen([sys.executable, "-c", sys.argv[-1]], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
assert child.stdout.readline().strip() == "ready"
print("ready", child.pid, flush=True)
sys.stdin.readline()
child.stdin.close()
child.wait()
"""


def _started(tmp_path, argv, *arguments, **environment):
    env = clean_env(SGLANG_HOTFIX_TRTLLM_STATE_DIR=str(tmp_path / "state"), **environment)
    process = subprocess.Popen(
        argv + list(arguments),
        executable=sys.executable,
        cwd=str(tmp_path),
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    return process, process.stdout.readline().split()


def test_a_servers_main_process_answers_for_the_processes_it_started(tmp_path):
    """Issue 48, item 1: `--pid` of the main process (the one `pgrep -f launch_server` finds) said
    NOTHING TO DO while its scheduler ran a record turned off."""
    parent, words = _started(
        tmp_path,
        [sys.executable, "-c", PARENT, "-m", "sglang.launch_server"],
        CHILD,
        SGLANG_HOTFIX_TRTLLM_DISABLE="pr25103",
    )
    try:
        assert words[0] == "ready", words
        shown = status_json(
            "--pid", str(parent.pid), env=clean_env(SGLANG_HOTFIX_TRTLLM_STATE_DIR=str(tmp_path / "state"))
        )
        assert shown.returncode == 1, shown.report
        assert shown.report["headline"].startswith("NOT PROTECTED: process %d recorded nothing itself" % parent.pid)
        assert [child["pid"] for child in shown.report["children"]] == [int(words[1])]
    finally:
        parent.stdin.close()
        parent.wait(timeout=60)


def test_sglangs_detokenizer_is_seen_to_have_nothing_to_do_and_an_unexplained_silence_cannot_be_told(tmp_path):
    """Issue 48, item 1: "has not imported SGLang's backend" was stated of any SGLang process that
    recorded nothing (a `python -S` one, one whose switch was set at run time). Now NOTHING TO DO
    only where it is seen (the title SGLang gives a process that never imports the backend), and
    CANNOT TELL (exit 3) otherwise."""
    waiting = "import sys; print('ready', flush=True); sys.stdin.readline()"
    for title, code, word in (("sglang::detokenizer", 0, "NOTHING TO DO"), ("sglang::scheduler_TP0", 3, "CANNOT TELL")):
        process, words = _started(tmp_path, [title, "-c", waiting])
        try:
            shown = status_json(
                "--pid", str(process.pid), env=clean_env(SGLANG_HOTFIX_TRTLLM_STATE_DIR=str(tmp_path / "state"))
            )
            assert (shown.returncode, shown.report["headline"].split(":")[0]) == (code, word), shown.report
        finally:
            process.stdin.close()
            process.wait(timeout=60)


def test_a_zombie_is_a_process_that_runs_nothing(tmp_path):
    """Issue 48, item 1: an exited process its parent had not reaped read PROTECTED from its file."""
    exited = subprocess.Popen([sys.executable, "-c", "pass"])
    deadline = time.monotonic() + 30
    while not process_state.is_zombie(exited.pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    try:
        ran = run_cli("status", "--pid", str(exited.pid), env=clean_env(SGLANG_HOTFIX_TRTLLM_STATE_DIR=str(tmp_path)))
        assert ran.returncode == 3 and "has exited" in ran.stderr and ran.stdout == "", ran
    finally:
        exited.wait()


def test_the_install_time_is_what_the_installer_wrote_not_a_hard_linked_files_time(tmp_path, monkeypatch):
    """Issue 48, item 1: uv hard-links the package's files from its cache, so __init__.py's time
    was the cache's (16 minutes before the install) and a server started before the install was
    judged started after it. The dist-info folder is made at install time."""
    from sglang_hotfix_trtllm import launcher

    package = tmp_path / "sglang_hotfix_trtllm"
    package.mkdir()
    (package / "__init__.py").write_text("")
    os.utime(package / "__init__.py", (1_000_000_000, 1_000_000_000))  # the cache's time
    (tmp_path / "sglang_hotfix_trtllm-0.15.0.dist-info").mkdir()
    os.utime(tmp_path / "sglang_hotfix_trtllm-0.15.0.dist-info", (1_700_000_000, 1_700_000_000))
    monkeypatch.setattr(launcher, "INSTALL_DIR", str(tmp_path))
    assert state._installed_at() == 1_700_000_000


def test_status_pid_says_it_reports_what_the_process_recorded_and_when(child):
    """Issue 48, item 3: after the patched method was replaced in the process (an assignment, a
    HookRegistry REPLACE), `--pid` still said PROTECTED as if it saw inside the process. It cannot:
    the answer says it is what the process recorded when it handled its records, and when."""
    running = child()
    running.send("replace", "replaced")
    shown = running.status()
    report = shown.report
    assert shown.returncode == 0 and isinstance(report["recorded_at"], float), report
    assert "was patched in that process when it recorded its state" in report["headline"], report["headline"]
    assert "as that process recorded it at %s" % state._when(report["recorded_at"]) in report["headline"]
    assert "a method replaced there since cannot be seen from outside" in report["headline"]
    text = run_cli(
        "status", "--pid", str(running.pid), env=clean_env(SGLANG_HOTFIX_TRTLLM_STATE_DIR=str(running.state))
    )
    assert "recorded at: %s" % state._when(report["recorded_at"]) in text.stdout, text.stdout
    # A record fixed there says so once ("nothing to patch: the verdict is fixed (verdict fixed)").
    line = next(line for line in text.stdout.splitlines() if line.startswith("record pr17732"))
    assert line.startswith("record pr17732 (fixed): nothing to patch; ") and "verdict" not in line, line


def test_a_process_that_records_its_state_prunes_the_files_of_gone_processes(tmp_path, child):
    """Issue 48, item 3: one file per process, and only `status --processes` (a read command) pruned
    them: 80 after an hour, 76 of processes that were gone."""
    folder = tmp_path / "state"
    folder.mkdir(mode=0o700)
    here = json.dumps({"pid_namespace": process_state.pid_namespace()})
    gone = [folder / ("%d-1.json" % NO_PID), folder / ("%d-1.json" % os.getpid())]
    for path in gone:
        path.write_text(here)
    partial = folder / ("%d-2.json.%d.partial" % (NO_PID, NO_PID))  # an unfinished write, an hour old
    partial.write_text("{")
    os.utime(partial, (time.time() - 7200, time.time() - 7200))
    # kept: another pid namespace's (a container sharing the folder), an older format's, not a state file
    kept = {"%d-1.json" % (NO_PID + 1): json.dumps({"pid_namespace": -1}), "%d-1.json" % (NO_PID + 2): "{}"}
    for name, text in kept.items():
        (folder / name).write_text(text)
    (folder / "notes.txt").write_text("x")
    running = child()
    names = sorted(os.listdir(folder))
    assert names == sorted(
        [process_state.file_name(running.pid, process_state.start_ticks(running.pid)), "notes.txt"] + list(kept)
    )


def test_pruning_is_bounded_in_cost(tmp_path):
    folder = tmp_path / "state"
    folder.mkdir(mode=0o700)
    here = json.dumps({"pid_namespace": process_state.pid_namespace()})
    for pid in range(NO_PID, NO_PID + 3 * process_state.PRUNE_AT_MOST):
        (folder / ("%d-1.json" % pid)).write_text(here)
    removed = process_state.prune(str(folder))
    assert removed == process_state.PRUNE_AT_MOST
    assert len(os.listdir(folder)) == 2 * process_state.PRUNE_AT_MOST
