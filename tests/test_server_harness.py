"""The GPU server tests' one launcher (``tests/gpu/test_server_e2e.py``: ``launch``,
``wait_until_healthy``, ``stop``), which the four server tests and the server A/B share, run here
on CPU with a stand-in server: plain Python answering ``/health`` (no SGLang: what is tested is
the harness's start, wait and clean stop, not a server)."""

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
