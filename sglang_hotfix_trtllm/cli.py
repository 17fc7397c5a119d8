"""Operator command line (``sglang-hotfix-trtllm`` or ``python -m sglang_hotfix_trtllm``).

* ``status [--json] [--source PATH]``: never imports SGLang or torch. Exit 0
  protected or nothing to do; 1 affected but a process started now would not
  be patched; 2 unknown, unreadable source.
* ``verify``: imports SGLang's backend on CPU and compares patched, unpatched
  and upstream-fixed capture (see ``verify``).
* ``run -- COMMAND``: run COMMAND with the hotfix loaded in it and its Python
  children, for installs outside site-packages (see ``launcher``).

Bad arguments: usage on stderr, exit 2.
"""

import argparse
import json
import os
import sys

from . import __version__, catalog
from .record import Verdict


def status(arguments):
    from . import status as state

    hotfix = catalog.HOTFIXES[0]
    if arguments.source:
        report, assessment, code = state.of_file(hotfix, arguments.source)
    else:
        report, assessment, code = state.of_environment(hotfix)

    if arguments.json:
        text = json.dumps(report, indent=2, sort_keys=True) + "\n"
    else:
        width = max(len(key) for key in report)
        text = "".join("%-*s  %s\n" % (width, key, value) for key, value in report.items())
    if code == state.EXIT_ERROR:
        diagnose("%s: %s" % (assessment.verdict, report.get("would_patch_reason") if assessment.verdict is not Verdict.UNKNOWN
                                else assessment.reason))
    return _write_result(text, code)


def diagnose(message):
    """One line on stderr, and only there: never on stdout, whatever state
    stderr is in (``print(file=None)`` would fall back to stdout)."""
    try:
        if sys.stderr is not None:
            sys.stderr.write("sglang-hotfix-trtllm: %s\n" % message)
            sys.stderr.flush()
    except Exception:
        pass


def _write_result(text, code):
    """Write the result to stdout; when its reader has gone (`status | head`),
    keep the exit status the result had."""
    try:
        sys.stdout.write(text)
        sys.stdout.flush()
    except BrokenPipeError:
        _silence_stdout()
    return code


def _silence_stdout():
    # Python flushes stdout again at exit; point it at /dev/null so that flush
    # does not report the broken pipe a second time.
    try:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    except Exception:
        pass


def _parser():
    parser = argparse.ArgumentParser(
        prog="sglang-hotfix-trtllm",
        description="Hotfix for SGLang's TRT-LLM MHA draft-decode CUDA-graph capture (upstream PR #26521).",
    )
    parser.add_argument("--version", action="version", version="%(prog)s " + __version__)
    verbs = parser.add_subparsers(dest="verb", required=True)
    status_parser = verbs.add_parser("status", help="verdict on the installed SGLang and whether a new process would be patched")
    status_parser.add_argument("--json", action="store_true", help="print one JSON object")
    status_parser.add_argument("--source", metavar="PATH", help="classify this trtllm_mha_backend.py instead of the installed one")
    status_parser.set_defaults(run=status)
    verify_parser = verbs.add_parser("verify", help="run the fix on the installed SGLang on CPU and compare with upstream's")
    verify_parser.set_defaults(run=verify)
    run_parser = verbs.add_parser("run", help="run COMMAND with the hotfix loaded (installs outside site-packages)",
                                  usage="%(prog)s -- COMMAND [ARGS...]")
    run_parser.add_argument("command", nargs=argparse.REMAINDER, help="the command, after --")
    run_parser.set_defaults(run=launch)
    return parser


def verify(arguments):
    from . import verify as verifying

    return verifying.verify(catalog.HOTFIXES[0], print)


def launch(arguments):
    from . import launcher

    command = arguments.command[1:] if arguments.command[:1] == ["--"] else arguments.command
    return launcher.run(command)


def main(argv=None):
    arguments = _parser().parse_args(argv)  # exits 2 with usage on bad arguments
    try:
        return arguments.run(arguments)
    except BrokenPipeError:  # the reader of stdout left; not an error of ours
        _silence_stdout()
        return 0
