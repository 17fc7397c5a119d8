"""What a GPU worker process left: its RESULT line, and its log kept under $OUT."""

import json
import os
import pathlib


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
