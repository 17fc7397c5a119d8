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

from . import __version__, catalog, engine, source, switches
from .record import Verdict

EXIT_OK, EXIT_UNPROTECTED, EXIT_ERROR = 0, 1, 2
STARTUP_FILE = "sglang_hotfix_trtllm.pth"


def _startup_file():
    """Path of the installed startup file, or None."""
    import sglang_hotfix_trtllm_autoload

    candidate = os.path.join(os.path.dirname(os.path.abspath(sglang_hotfix_trtllm_autoload.__file__)), STARTUP_FILE)
    return candidate if os.path.isfile(candidate) else None


def _entry_point_installed():
    try:
        from importlib.metadata import entry_points

        return any(ep.name == switches.PLUGIN_NAME for ep in entry_points(group="sglang.srt.plugins"))
    except Exception:
        return False


def _would_patch(assessment, current, startup_file):
    """(bool, reason) for a process started now in this environment."""
    if assessment.verdict is not Verdict.AFFECTED:
        return False, "nothing to patch: verdict is %s" % assessment.verdict
    if current.disabled:
        return False, "%s is on" % switches.DISABLE
    if current.excluded_by_sglang_plugins:
        return False, "%s does not name %s" % (switches.SGLANG_PLUGINS, switches.PLUGIN_NAME)
    if startup_file is None:
        return False, "the startup file %s is missing from site-packages (reinstall the package)" % STARTUP_FILE
    return True, "affected, and the startup hook will patch it when SGLang imports the backend"


def _status_of_file(hotfix, path):
    if not os.path.isfile(path):
        return engine.Assessment(hotfix.name, hotfix.target, Verdict.UNKNOWN, "no such file: %s" % path, None, path, ())
    return engine.assess_source(hotfix, path)


def status(arguments):
    hotfix = catalog.HOTFIXES[0]
    if arguments.source:
        assessment = _status_of_file(hotfix, arguments.source)
        report = assessment.as_dict()
        code = EXIT_ERROR if assessment.verdict is Verdict.UNKNOWN else EXIT_OK
    else:
        assessment = engine.assess_installed(hotfix)
        dist = source.distribution(hotfix.distribution)
        current = switches.read()
        startup_file = _startup_file()
        would_patch, why = _would_patch(assessment, current, startup_file)
        report = assessment.as_dict()
        report.update(
            {
                "plugin_version": __version__,
                "sglang_version": dist.version,
                "sglang_install_kind": dist.install_kind if dist.version is not None else None,
                "startup_file": startup_file,
                "entry_point_installed": _entry_point_installed(),
                "switches": current.as_dict(),
                "switch_problems": list(current.problems),
                "would_patch": would_patch,
                "would_patch_reason": why,
            }
        )
        if assessment.verdict is Verdict.UNKNOWN:
            code = EXIT_ERROR
        elif assessment.verdict is Verdict.AFFECTED and not would_patch:
            code = EXIT_UNPROTECTED
        else:
            code = EXIT_OK

    if arguments.json:
        print(json.dumps(report, indent=2, sort_keys=True))
    else:
        width = max(len(key) for key in report)
        for key, value in report.items():
            print("%-*s  %s" % (width, key, value))
    if code == EXIT_ERROR:
        print("sglang-hotfix-trtllm: %s: %s" % (assessment.verdict, assessment.reason), file=sys.stderr)
    return code


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
    except BrokenPipeError:  # `status | head`: the reader left; not an error of ours
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_OK
