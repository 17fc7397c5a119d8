"""End to end: SGLang 0.5.12's real server, EAGLE3 draft decode on trtllm_mha,
SGLANG_SPEC_NAN_DETECTION=1. Without the hotfix it dies in CUDA-graph capture
with upstream's assertion; with it, however it is loaded, it serves.

Skipped without a CUDA device, or without the server's packages: set
SGLANG_E2E_SITE to a folder holding SGLang 0.5.12 and what its server imports
(``tools/e2e_carry.py`` builds it) and SGLANG_E2E_PLUGIN_WHEEL to this
plugin's wheel. docs/gpu.md has the command and the results.

Each case starts its own server on 127.0.0.1 in a process group of its own,
waits at most START_TIMEOUT for it to be healthy (or to die), and always
stops the whole group: no process is left behind.
"""

import concurrent.futures
import json
import os
import pathlib
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import pytest

torch = pytest.importorskip("torch")
SITE = os.environ.get("SGLANG_E2E_SITE")
WHEEL = os.environ.get("SGLANG_E2E_PLUGIN_WHEEL")
pytestmark = pytest.mark.skipif(
    not (torch.cuda.is_available() and SITE and WHEEL),
    reason="needs a CUDA device, SGLANG_E2E_SITE and SGLANG_E2E_PLUGIN_WHEEL",
)

HERE = pathlib.Path(__file__).resolve().parent
START_TIMEOUT = 300
REQUESTS = 12
# What every server of these tests runs with (the server A/B's too): prefill on triton (SGLang 0.5.12
# refuses trtllm_mha prefill below SM100), sampling and grammar without kernels to build, on the
# loopback, logging at INFO (the hotfix's lines).
BASE_FLAGS = [
    "--attention-backend",
    "triton",
    "--prefill-attention-backend",
    "triton",
    "--sampling-backend",
    "pytorch",
    "--grammar-backend",
    "none",
    "--host",
    "127.0.0.1",
    "--log-level",
    "info",
]
SERVER_FLAGS = [
    "--speculative-algorithm",
    "EAGLE3",
    "--speculative-num-steps",
    "3",
    "--speculative-eagle-topk",
    "1",
    "--speculative-num-draft-tokens",
    "4",
    "--decode-attention-backend",
    "trtllm_mha",
    "--cuda-graph-max-bs",
    "4",
    "--mem-fraction-static",
    "0.3",
    "--decode-log-interval",
    "1",  # one line per decode batch: shows which batch sizes ran on a CUDA graph
] + BASE_FLAGS
# The hotfix's line, in its own format before SGLang configures logging, in SGLang's after.
PATCHED_LINE = re.compile(r"^.*\bpatched sglang\.srt\.layers\.attention\.trtllm_mha_backend\..*PR #26521.*$", re.M)
# With --tp 1 the scheduler is the one process that imports the backend.
PROCESSES_IMPORTING_THE_BACKEND = 1


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    sys.path.insert(0, str(HERE))
    import e2e_models

    return e2e_models.build(tmp_path_factory.mktemp("models"))


def install_target(target, wheel=None):
    """The plugin's wheel installed into the folder ``target`` (``pip install --target``: for
    PYTHONPATH, SGLang's plugin loader and `run`); every server test's installs, and the server A/B."""
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--target", str(target)]
        + [wheel or WHEEL],
        check=True,
        timeout=300,
    )
    return {"target": str(target)}


@pytest.fixture(scope="module")
def installs(tmp_path_factory):
    """The plugin in a --target folder (for PYTHONPATH and `run`)."""
    return install_target(tmp_path_factory.mktemp("installs") / "target")


def free_port():
    """A free port well below 55535: SGLang derives others from it (its gRPC port is port + 10000)."""
    import random

    for _ in range(100):
        port = random.randrange(20000, 40000, 10)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port")


def base_env(**extra):
    env = {k: v for k, v in os.environ.items() if not k.startswith("SGLANG_HOTFIX_") and k != "PYTHONPATH"}
    env.update(HF_HUB_OFFLINE="1", SGLANG_SPEC_NAN_DETECTION="1", PYTHONUNBUFFERED="1")
    env.update(extra)
    return env


def stop(process):
    """SIGTERM to the whole group, then SIGKILL; True when nothing of it is left."""
    for sig, grace in ((signal.SIGTERM, 30), (signal.SIGKILL, 10)):
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            break
        deadline = time.time() + grace
        while time.time() < deadline:
            process.poll()  # reap the leader once it exits: a zombie would keep the group alive for killpg
            try:
                os.killpg(process.pid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.5)
    try:
        process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        pass
    try:
        os.killpg(process.pid, 0)
        return False
    except ProcessLookupError:
        return True


def healthy(port):
    try:
        with urllib.request.urlopen("http://127.0.0.1:%d/health" % port, timeout=5) as response:
            return response.status == 200
    except Exception:
        return False


def generate(port, index):
    body = json.dumps(
        {
            "text": "The quick brown fox %d" % index,
            "sampling_params": {"max_new_tokens": 8 + 4 * index, "temperature": 0},
        }
    ).encode()
    request = urllib.request.Request(
        "http://127.0.0.1:%d/generate" % port, data=body, headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=120) as response:
        return json.loads(response.read())


def launch(argv, env, log_path, cwd):
    """The server's command in a session (a process group) of its own, its output into ``log_path``:
    ``stop`` ends the whole group."""
    with open(log_path, "w") as log:
        return subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True, cwd=cwd)


def wait_until_healthy(process, port, started, facts):
    """Until the server answers /health, dies, or START_TIMEOUT has passed since ``started``:
    ``facts`` gets ``ready_s`` (healthy), or ``exit_code`` and ``died_s`` (died); neither: hung."""
    while time.time() - started < START_TIMEOUT:
        if process.poll() is not None:
            facts["exit_code"] = process.returncode
            facts["died_s"] = round(time.time() - started, 1)
            return
        if healthy(port):
            facts["ready_s"] = round(time.time() - started, 1)
            return
        time.sleep(1)


def serve(name, command, env, tmp_path, models, send_requests):
    """Start the server, wait for healthy or death, optionally send requests, stop it. Returns facts."""
    target, draft = models
    port = free_port()
    log_path = tmp_path / ("server-%s.log" % name)
    argv = (
        command
        + ["--model-path", str(target), "--speculative-draft-model-path", str(draft), "--port", str(port)]
        + SERVER_FLAGS
    )
    started = time.time()
    process = launch(argv, env, log_path, tmp_path)
    facts = {"name": name, "ready_s": None, "exit_code": None, "answers": 0}
    try:
        wait_until_healthy(process, port, started, facts)
        if facts["ready_s"] is not None and send_requests:
            with concurrent.futures.ThreadPoolExecutor(REQUESTS) as pool:
                answers = list(pool.map(lambda i: generate(port, i), range(REQUESTS)))
            facts["answers"] = sum(1 for a in answers if isinstance(a.get("text"), str))
            facts["sample"] = answers[0].get("text", "")[:60]
    finally:
        facts["stopped_clean"] = stop(process)
        facts["total_s"] = round(time.time() - started, 1)
    text = log_path.read_text(errors="replace")
    facts["log_tail"] = text[-3000:]
    facts["nan_assert"] = "NaN detected! draft_forward step 0" in text
    facts["capture_failed"] = "Capture cuda graph failed" in text or "Capture CUDA graph failed" in text
    facts["patched_lines"] = PATCHED_LINE.findall(text)
    facts["graph_batch_sizes"] = sorted(
        {int(n) for n in re.findall(r"Decode batch, #running-req: (\d+),.*cuda graph: True", text)}
    )
    capture = re.findall(r"Capture (?:draft )?cuda graph end\. Time elapsed: ([0-9.]+) s", text)
    facts["capture_s"] = [float(c) for c in capture]
    out = os.environ.get("OUT")
    if out:
        pathlib.Path(out, "server-%s.log" % name).write_text(text[-60000:])
        pathlib.Path(out, "server-%s.json" % name).write_text(
            json.dumps({k: v for k, v in facts.items() if k != "log_tail"}, indent=2)
        )
    print(json.dumps({k: v for k, v in facts.items() if k != "log_tail"}, indent=2), flush=True)
    return facts


def launch_server(python=None):
    return [python or sys.executable, "-m", "sglang.launch_server"]


def test_1_without_the_hotfix_the_server_dies_in_capture_with_upstreams_assertion(tmp_path, models, installs):
    env = base_env(PYTHONPATH=os.pathsep.join([SITE, installs["target"]]), SGLANG_HOTFIX_TRTLLM_DISABLE="1")
    facts = serve("1-unpatched", launch_server(), env, tmp_path, models, send_requests=False)
    assert facts["ready_s"] is None and facts["exit_code"] is not None, facts["log_tail"]
    assert facts["nan_assert"], facts["log_tail"]
    assert facts["patched_lines"] == [] and facts["stopped_clean"]


def check_serving(facts):
    assert facts["ready_s"] is not None, facts["log_tail"]
    assert facts["answers"] == REQUESTS and not facts["nan_assert"], facts["log_tail"]
    # Requests finish at different lengths, so the batch shrinks through several captured sizes.
    assert len(facts["graph_batch_sizes"]) >= 2, facts["graph_batch_sizes"]
    # Exactly once per process that imports the backend.
    assert len(facts["patched_lines"]) == PROCESSES_IMPORTING_THE_BACKEND, facts["patched_lines"]
    assert facts["stopped_clean"]


def test_2_loaded_by_sglangs_own_plugin_loader(tmp_path, models, installs):
    # The plugin on PYTHONPATH only: no .pth is read from there, and no `run`.
    env = base_env(PYTHONPATH=os.pathsep.join([SITE, installs["target"]]))
    check_serving(serve("2-plugin-loader", launch_server(), env, tmp_path, models, send_requests=True))


def test_4_through_run(tmp_path, models, installs):
    env = base_env(PYTHONPATH=os.pathsep.join([SITE, installs["target"]]))
    command = [sys.executable, "-m", "sglang_hotfix_trtllm", "run", "--"] + launch_server()
    check_serving(serve("4-run", command, env, tmp_path, models, send_requests=True))


def test_3_installed_with_pip_so_the_startup_file_arms_it(tmp_path, models, installs):
    # As operators install it: pip into the Python environment that runs SGLang (the
    # machine's own; uninstalled afterwards). Its .pth then arms the hook at start-up.
    pip = [sys.executable, "-m", "pip"]
    subprocess.run(pip + ["install", "-q", "--no-index", "--no-deps", WHEEL], check=True, timeout=300)
    try:
        env = base_env(PYTHONPATH=SITE)
        check_serving(serve("3-pip-install", launch_server(), env, tmp_path, models, send_requests=True))
    finally:
        subprocess.run(pip + ["uninstall", "-q", "-y", "sglang-hotfix-trtllm"], timeout=300)
