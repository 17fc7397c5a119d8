"""The GPU server tests' one launcher (``tests/gpu/test_server_e2e.py``: ``launch``,
``wait_until_healthy``, ``stop``), which the four server tests and the server A/B share, run here
on CPU with a stand-in server: plain Python answering ``/health`` (no SGLang: what is tested is
the harness's start, wait and clean stop, not a server)."""

import os
import pathlib
import sys
import time

import pytest

pytest.importorskip("torch")  # the module imports it (its own tests skip without a CUDA device)
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent / "gpu"))
import test_server_e2e as harness  # noqa: E402

HEALTH_SERVER = """
import http.server, subprocess, sys
subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])  # a child, as a scheduler is
class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/health" else 404)
        self.end_headers()
    def log_message(self, *args):
        print("request", *args, flush=True)
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), Health).serve_forever()
"""


def test_a_server_that_answers_is_ready_and_its_whole_group_stops(tmp_path):
    port = harness.free_port()
    began, facts = time.time(), {}
    process = harness.launch([sys.executable, "-c", HEALTH_SERVER, str(port)], None, tmp_path / "s.log", tmp_path)
    try:
        harness.wait_until_healthy(process, port, began, facts)
        assert "ready_s" in facts and "exit_code" not in facts, facts
    finally:
        assert harness.stop(process)  # the group (the child included) is gone
    assert "request" in (tmp_path / "s.log").read_text()


def test_a_server_that_dies_is_told_with_its_exit_code(tmp_path):
    began, facts = time.time(), {}
    process = harness.launch([sys.executable, "-c", "raise SystemExit(3)"], None, tmp_path / "s.log", tmp_path)
    harness.wait_until_healthy(process, harness.free_port(), began, facts)
    assert facts["exit_code"] == 3 and "ready_s" not in facts and harness.stop(process)


def test_the_server_ab_waits_for_servers_launched_together_and_stops_one_that_never_answered(tmp_path, monkeypatch):
    """``server_ab_worker`` launches the servers of a start order at once (``begin``), then waits
    for each (``ready``): a healthy one comes back with its ``ready_s``; one that neither answers
    nor dies within the harness's limit raises with its log, its whole group stopped (a server
    runs in a session of its own: left there, it would hold the GPU for the next order)."""
    import server_ab_worker

    def begun(argv, name, port):
        log = tmp_path / ("%s.log" % name)
        return {"port": port, "process": harness.launch(argv, None, log, tmp_path), "log": log, "began": time.time()}

    hung_server = "import subprocess, sys, time; print('loading', flush=True); %s; time.sleep(600)" % (
        "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])"
    )
    port = harness.free_port()
    alive = begun([sys.executable, "-c", HEALTH_SERVER, str(port)], "alive", port)
    hung = begun([sys.executable, "-c", hung_server], "hung", harness.free_port())
    try:
        assert server_ab_worker.ready(alive)["ready_s"] >= 0
        monkeypatch.setattr(harness, "START_TIMEOUT", 3)
        with pytest.raises(RuntimeError, match=r"(?s)hung did not become healthy \(\{\}\).*loading"):
            server_ab_worker.ready(hung)
        assert hung["process"].poll() is not None
        with pytest.raises(ProcessLookupError):  # nothing of its group is left
            os.killpg(hung["process"].pid, 0)
    finally:
        assert harness.stop(alive["process"]) and harness.stop(hung["process"])


def test_each_start_order_cuts_its_cpu_sets_from_all_the_hosts_cpus(monkeypatch):
    """The server A/B's CPU sets go by start position, from the CPUs the worker had when it
    started, all cut before the first order narrows the worker to its client set (runs E and F
    of issue 38 read the narrowed affinity again: their second order got two CPUs a server)."""
    import server_ab_worker

    affinity = {"cpus": set(range(16))}
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(affinity["cpus"]))
    monkeypatch.setattr(os, "sched_setaffinity", lambda pid, cpus: affinity.update(cpus=set(cpus)))
    plan = server_ab_worker.cpu_plan(["hotfix,anchor", "anchor,hotfix"])
    os.sched_setaffinity(0, plan["hotfix,anchor"][None])  # what the first order does
    first, second = plan["hotfix,anchor"], plan["anchor,hotfix"]
    assert first["hotfix"] == second["anchor"] == set(range(5)) and first["anchor"] == second["hotfix"]
    assert first[None] == second[None] == set(range(10, 16))
    assert server_ab_worker.cpu_sets(("a", "b", "c"), [0, 1, 2, 3, 4, 5, 6]) is None  # under two CPUs a server
    three = server_ab_worker.cpu_sets(("a", "b", "c"), list(range(16)), spare=(0,), share=5)
    assert [sorted(three[arm]) for arm in "abc"] == [[1, 2, 3, 4, 5], [6, 7, 8, 9, 10], [11, 12, 13, 14, 15]]
    assert three[None] == {0}  # the client keeps the spared CPU
    assert server_ab_worker.cpu_sets(("a", "b", "c"), list(range(16)), spare=(0,), share=6) is None  # too many


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs to swap between")
def test_swapping_cpu_sets_moves_every_thread_of_each_servers_group(tmp_path):
    """``--swap-cpu-sets``: the eager A/B of 2026-12-06 found the server on the second CPU set faster
    in both start orders; turning the sets each cycle moves every thread of a server's group (its
    children's too, as SGLang's scheduler is one) and nothing of the other server's."""
    import server_ab_worker

    program = (
        "import subprocess, sys, threading, time\n"
        "[threading.Thread(target=time.sleep, args=(60,), daemon=True).start() for _ in range(3)]\n"
        "import os, signal\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
        "signal.signal(signal.SIGTERM, lambda *_: (child.kill(), child.wait(), os._exit(0)))\n"  # the group ends
        "time.sleep(60)\n"
    )
    cpus = sorted(os.sched_getaffinity(0))[:2]
    sets = {"hotfix": {cpus[0]}, "anchor": {cpus[1]}}
    servers = {
        arm: {"process": harness.launch([sys.executable, "-c", program], None, tmp_path / (arm + ".log"), tmp_path)}
        for arm in sets
    }
    try:
        deadline = time.time() + 30
        while time.time() < deadline and any(
            len(server_ab_worker.group_threads(s["process"].pid)) < 5 for s in servers.values()
        ):
            time.sleep(0.1)
        for arm, server in servers.items():
            assert server_ab_worker.move_server(server, sets[arm]) == 5  # 4 threads and the child
        places = server_ab_worker.turn_places(servers, sets, {"hotfix": "hotfix", "anchor": "anchor"})
        assert places == {"hotfix": "anchor", "anchor": "hotfix"}
        for arm, server in servers.items():
            threads = server_ab_worker.group_threads(server["process"].pid)
            assert {frozenset(os.sched_getaffinity(tid)) for tid in threads} == {frozenset(sets[places[arm]])}
    finally:
        for server in servers.values():
            assert harness.stop(server["process"])
