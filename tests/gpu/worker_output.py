"""What a GPU worker process left: its RESULT line, and its log kept under $OUT."""

import json
import os
import pathlib
import subprocess
import sys


def result_of(name, ran):
    """The worker's last RESULT:<json> (None when there is none); the log goes
    to $OUT/<name>.log when the device tool gave an $OUT to bring back."""
    out = os.environ.get("OUT")
    if out:
        pathlib.Path(out, name + ".log").write_text(ran.stdout[-20000:] + "\n--- stderr ---\n" + ran.stderr[-20000:])
    lines = [line for line in ran.stdout.splitlines() if line.startswith("RESULT:")]
    result = json.loads(lines[-1][len("RESULT:") :]) if lines else None
    print(name, ran.returncode, json.dumps(result, indent=2))
    return result


def run_worker(worker, name, disabled=None, timeout=900):
    """``python WORKER`` in a fresh process, with SGLANG_HOTFIX_TRTLLM_DISABLE set to ``disabled``
    (a record's name) or unset; its RESULT, with the hotfix's stderr lines as ``hotfix_lines``."""
    env = {k: v for k, v in os.environ.items() if k != "SGLANG_HOTFIX_TRTLLM_DISABLE"}
    env["PYTHONUNBUFFERED"] = "1"
    if disabled:
        env["SGLANG_HOTFIX_TRTLLM_DISABLE"] = disabled
    ran = subprocess.run([sys.executable, str(worker)], capture_output=True, text=True, env=env, timeout=timeout)
    result = result_of(name, ran)
    assert ran.returncode == 0 and result, ran.stdout[-4000:] + ran.stderr[-4000:]
    result["hotfix_lines"] = [line for line in ran.stderr.splitlines() if "sglang-hotfix-trtllm" in line]
    return result
