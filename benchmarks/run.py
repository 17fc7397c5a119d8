"""Benchmarks of sglang-hotfix-trtllm: what the hotfix costs, side by side.

    .venv/bin/python benchmarks/run.py [--quick] [--json OUT]
    .venv/bin/python benchmarks/run.py --startup-table [--python PATH ...] [--json OUT]

Run it with the test environment's Python (the README's set-up command): it
needs the plugin, SGLang 0.5.12 and torch installed there. Each figure is a
ratio or difference measured in one run, medians over repeated runs:

1. Interpreter start (``python -c pass``) with the plugin installed against
   the same environment without it: fresh venvs that differ only by the
   plugin's wheel, installed four ways (pip, pip --no-compile, uv, uv
   --compile-bytecode; the uv rows need ``python -m uv``). Counted in
   instructions with callgrind (repeatable to about 0.2%) and in wall time
   (noisier). For scale, a venv whose .pth imports wrapt, and the floors of
   other start-up designs (``FLOORS``).
2. Added cost when SGLang's backend module is first imported: finding the
   source, deciding the verdict and wrapping, in fresh processes.
3. The patched capture call against the upstream-fixed function on the same
   inputs (CPU), and the replay method, which the hotfix does not wrap.
4. ``sglang-hotfix-trtllm status`` wall time.

``--startup-table`` measures instead, for each interpreter given with
``--python`` (repeatable; default: the running one), the start-up table of
docs/costs.md: callgrind instructions of ``python -c pass`` in three kinds of
environment (a fresh venv; the interpreter itself with a user site directory of
its own; a copy of the interpreter with an empty site-packages:
``startup_table_for``), each row against the same kind of environment with
nothing added: the plugin's wheel with and without bytecode, setuptools'
``distutils-precedence.pth`` (the anchor, with and without bytecode), a
``.pth`` holding only ``import sys``, and the plugin with its ``.pth``'s comment
line removed. It needs only valgrind, pip and the interpreters (and
setuptools' wheel: downloaded with pip unless ``--setuptools-wheel`` names
one); the plugin is installed with ``--no-deps`` (``-c pass`` never imports
wrapt).
"""

import argparse
import hashlib
import json
import os
import pathlib
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import zipfile

HERE = pathlib.Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(REPO / "tests" / "support"))
sys.path.insert(0, str(REPO / "tools"))

import plugin_wheel  # noqa: E402


def clean_env(**extra):
    env = {k: v for k, v in os.environ.items() if not k.startswith("SGLANG_") and k != "PYTHONPATH"}
    env.update(extra)
    return env


def callgrind_instructions(python, runs=3, env=None, samples=None):
    """Median instruction count of ``python -c pass`` under callgrind; each
    count is also appended to ``samples`` when given."""
    counts = []
    for _ in range(runs):
        out = subprocess.run(
            ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", python, "-c", "pass"],
            capture_output=True,
            text=True,
            env=clean_env() if env is None else env,
        ).stderr
        line = next(text for text in out.splitlines() if "refs:" in text)
        counts.append(int(line.split()[-1].replace(",", "")))
    if samples is not None:
        samples.extend(counts)
    return statistics.median(counts)


def wall_starts(pythons, runs):
    """Median wall time of `python -c pass` per interpreter, interleaved, the
    order rotated every round so that none always runs first."""
    times = {p: [] for p in pythons}
    for round_ in range(runs):
        shift = round_ % len(pythons)
        for python in pythons[shift:] + pythons[:shift]:
            start = time.perf_counter()
            subprocess.run([python, "-c", "pass"], env=clean_env())
            times[python].append(time.perf_counter() - start)
    return {p: statistics.median(t) for p, t in times.items()}


def build_wheel(folder):
    return plugin_wheel.from_checkout(folder)


def make_venv(folder, *install, installer="pip", base=None):
    """A fresh venv of the interpreter ``base`` (default: the running one),
    with ``install`` installed by ``installer``: "pip" (which byte-compiles
    what it installs), "pip --no-compile", "uv" (which writes no bytecode by
    default) or "uv --compile-bytecode"."""
    subprocess.run([base or sys.executable, "-m", "venv", "--without-pip", str(folder)], check=True)
    python = str(pathlib.Path(folder) / "bin" / "python")
    if install:
        tool, *flags = installer.split()
        command = (
            [sys.executable, "-m", "pip", "--python", python, "install", "-q", "--no-deps"]
            if tool == "pip"
            else [sys.executable, "-m", "uv", "pip", "install", "-q", "--no-deps", "--python", python]
        )
        subprocess.run(command + flags + list(install), check=True)
    return python


def have_uv():
    return subprocess.run([sys.executable, "-m", "uv", "--version"], capture_output=True).returncode == 0


INSTALLERS = ("pip", "pip --no-compile", "uv", "uv --compile-bytecode")

# For scale, the floors of other start-up designs (README, Costs): files put in
# an otherwise bare venv. A tiny top-level module that arms a finder, imported
# from its bytecode, bare or behind the smallest guard that keeps a missing or
# broken module off stdout (an exec'd try, compiled at every start).
TINY_FINDER = """import sys
def find_spec(name, path=None, target=None):
    if name != 'sglang.srt.layers.attention.trtllm_mha_backend':
        return None
    from sglang_hotfix_trtllm_autoload import find_spec as real
    return real(name, path, target)
find_spec.find_spec = find_spec
sys.meta_path.insert(0, find_spec)
"""
FLOORS = {
    "floor: a .pth holding only `import sys`": {"floor.pth": "import sys\n"},
    "floor: a .pth importing a tiny finder module (bytecode), unguarded": {
        "floor.pth": "import tiny_finder\n",
        "tiny_finder.py": TINY_FINDER,
    },
    "floor: the same behind an exec'd try": {
        "floor.pth": 'import sys;exec("try:import tiny_finder\\nexcept Exception:pass")\n',
        "tiny_finder.py": TINY_FINDER,
    },
}


def site_packages(python):
    return subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()


def startup(work, wall_runs):
    """Start-up cost of the plugin installed each way, side by side in one run,
    against the same bare venv; plus, for scale, a .pth that imports wrapt."""
    wheel = build_wheel(work / "wheel")
    base = make_venv(work / "base")
    venvs = {"base": base}
    for number, installer in enumerate(INSTALLERS):
        if installer.startswith("uv") and not have_uv():
            continue  # `pip install uv` into the benchmark's environment to measure these
        venvs[installer] = make_venv(work / ("plugin%d" % number), str(wheel), installer=installer)
    wrapt_env = make_venv(work / "wrapt", "wrapt")
    pathlib.Path(site_packages(wrapt_env), "import_wrapt.pth").write_text("import wrapt\n")
    venvs["a .pth importing wrapt"] = wrapt_env
    for number, (name, files) in enumerate(FLOORS.items()):
        python = make_venv(work / ("floor%d" % number))
        for file_name, text in files.items():
            pathlib.Path(site_packages(python), file_name).write_text(text)
        if "tiny_finder.py" in files:  # as pip would, byte-compile what it installs
            subprocess.run(
                [
                    python,
                    "-c",
                    "import py_compile, sys; py_compile.compile(sys.argv[1], doraise=True)",
                    os.path.join(site_packages(python), "tiny_finder.py"),
                ],
                check=True,
            )
        venvs[name] = python
    result = {"pythondontwritebytecode": os.environ.get("PYTHONDONTWRITEBYTECODE")}
    if shutil.which("valgrind"):
        counts = {name: callgrind_instructions(python) for name, python in venvs.items()}
        result["instructions"] = counts
        result["instructions_ratio"] = {name: counts[name] / counts["base"] for name in counts if name != "base"}
    walls = wall_starts(list(venvs.values()), wall_runs)
    result["wall_median_ms"] = {name: walls[python] * 1e3 for name, python in venvs.items()}
    result["wall_ratio"] = {name: walls[python] / walls[base] for name, python in venvs.items() if name != "base"}
    return result


# --- The start-up table (``--startup-table``; docs/costs.md) -------------------

# The anchor: setuptools' wheel, whose distutils-precedence.pth sat in nearly
# every pip-made environment for years; the .pth's text is read from the wheel.
ANCHOR_SETUPTOOLS = "setuptools==69.5.1"
ANCHOR_PTH = "distutils-precedence.pth"
PLUGIN_PTH = "sglang_hotfix_trtllm.pth"

# Rows of the table: (key, label, how its files are put in the environment).
# "plugin" and "setuptools" are wheels installed with pip (pip byte-compiles
# what it installs unless given --no-compile); "file" writes the .pth text
# given; "plugin_no_comment" is the "plugin" row with the .pth's first line
# (the comment) removed afterwards (the pseudo-flag --strip-comment), so that
# its difference from "plugin" is the comment's cost.
STARTUP_ROWS = (
    ("bare", "nothing added", None),
    ("plugin", "plugin, pip install (bytecode)", ("wheel", "plugin", [])),
    ("plugin_no_bytecode", "plugin, pip install --no-compile (no bytecode)", ("wheel", "plugin", ["--no-compile"])),
    ("anchor", "anchor: setuptools' distutils-precedence.pth, pip install (bytecode)", ("wheel", "setuptools", [])),
    ("anchor_no_bytecode", "anchor, pip install --no-compile (no bytecode)", ("wheel", "setuptools", ["--no-compile"])),
    ("import_sys", "floor: a .pth holding only `import sys`", ("file", "floor.pth", "import sys\n")),
    (
        "plugin_no_comment",
        "plugin (bytecode), its .pth without the comment line",
        ("wheel", "plugin", ["--strip-comment"]),
    ),
)


def startup_env(**extra):
    """The environment of every start measured: the benchmark's own, without
    variables that move site's work (a user base, a Python path), and with
    PYTHONDONTWRITEBYTECODE=1 so that no start writes bytecode for the next."""
    env = {
        k: v
        for k, v in clean_env().items()
        if k
        not in ("PYTHONUSERBASE", "PYTHONNOUSERSITE", "PYTHONHOME", "PYTHONSTARTUP", "PYTHONSAFEPATH", "PYTHONHASHSEED")
    }
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    env["PIP_ROOT_USER_ACTION"] = "ignore"  # pip's warning when run as root (a container's user)
    env.update(extra)
    return env


def query(python, code, env=None):
    return json.loads(
        subprocess.run(
            [python, "-c", code], capture_output=True, text=True, check=True, env=startup_env() if env is None else env
        ).stdout
    )


def setuptools_wheel(folder, given=None):
    if given:
        return pathlib.Path(given)
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            "-q",
            "--no-deps",
            "--only-binary=:all:",
            "-d",
            str(folder),
            ANCHOR_SETUPTOOLS,
        ],
        check=True,
    )
    return next(pathlib.Path(folder).glob("setuptools-*.whl"))


def wheel_text(wheel, name):
    with zipfile.ZipFile(wheel) as archive:
        return archive.read(name).decode()


def install_into(python, wheel, flags, target=None):
    """pip (the running one's, run under ``python`` with --python, as pip does
    for any environment) installs ``wheel`` without its dependencies, into
    ``python``'s environment or, with ``target``, into that folder only."""
    command = [
        sys.executable,
        "-m",
        "pip",
        "--python",
        python,
        "install",
        "-q",
        "--no-deps",
        "--disable-pip-version-check",
        "--no-warn-script-location",
    ]
    if target is not None:
        command += ["--target", str(target)]
    subprocess.run(command + flags + [str(wheel)], check=True, env=startup_env())


def populate(site_dir, python, recipe, wheels, target):
    """Put a row's files into ``site_dir``: a venv's site-packages, installed
    into the venv; or, with ``target`` set, a folder a system start reads (a
    user site-packages, a copy's site-packages), installed with pip --target."""
    kind, what, extra = recipe
    if kind == "file":
        pathlib.Path(site_dir, what).write_text(extra)
        return
    flags = [flag for flag in extra if flag != "--strip-comment"]
    install_into(python, wheels[what], flags, target=site_dir if target else None)
    if "--strip-comment" in extra:
        pth = pathlib.Path(site_dir, PLUGIN_PTH)
        lines = pth.read_text().splitlines(keepends=True)
        if lines and lines[0].startswith("#"):
            pth.write_text("".join(lines[1:]))


def bytecode_files(site_dir):
    return sum(1 for _ in pathlib.Path(site_dir).rglob("*.pyc"))


def resolve_interpreter(python):
    """The interpreter behind ``python`` (a venv's base interpreter when
    ``python`` is a venv's) and its version."""
    return query(
        python,
        "import json, sys, site; print(json.dumps({"
        "'executable': getattr(sys, '_base_executable', None) or sys.executable, "
        "'in_venv': sys.prefix != sys.base_prefix, 'version': sys.version.split()[0]}))",
    )


def clean_system_copy(interpreter, folder):
    """A copy of ``interpreter``'s installation whose site-packages is empty:
    its executable copied into ``folder``/bin (Python finds its prefix from
    where its executable lies), every other entry of its standard library
    folder a symbolic link to the original, and a new, empty site-packages.
    It starts as the interpreter does, less what the interpreter's own
    site-packages runs at start (here: .pth files of this machine and, on
    3.10/3.11, setuptools' own distutils-precedence.pth, which would make the
    anchor row a second copy of a file already read). None where the layout
    is not the POSIX one or the copy does not start as a system interpreter."""
    paths = query(
        interpreter,
        "import json, os, sys, sysconfig; p = sysconfig.get_paths(); print(json.dumps({"
        "'stdlib': p['stdlib'], 'platstdlib': p['platstdlib'], "
        "'purelib': p['purelib'], 'platlib': p['platlib'], "
        "'executable': os.path.realpath(sys.executable), 'prefix': sys.prefix}))",
    )
    stdlib = pathlib.Path(paths["stdlib"])
    site = stdlib / "site-packages"
    if {paths["purelib"], paths["platlib"]} != {str(site)} or paths["platstdlib"] != str(stdlib):
        return None
    folder = pathlib.Path(folder)
    executable = pathlib.Path(paths["executable"])
    (folder / "bin").mkdir(parents=True)
    shutil.copy2(executable, folder / "bin" / executable.name)
    copy_stdlib = folder / stdlib.relative_to(paths["prefix"])
    copy_stdlib.mkdir(parents=True)
    for entry in stdlib.iterdir():
        if entry.name != "site-packages":
            (copy_stdlib / entry.name).symlink_to(entry)
    for library in pathlib.Path(paths["prefix"], "lib").glob("libpython*"):  # a shared libpython found relative to bin
        (folder / "lib" / library.name).symlink_to(library)
    (copy_stdlib / "site-packages").mkdir()
    python = str(folder / "bin" / executable.name)
    try:
        started = query(python, "import json, site, sys; print(json.dumps([sys.prefix, site.getsitepackages()]))")
    except subprocess.CalledProcessError:
        return None
    if started != [str(folder), [str(copy_stdlib / "site-packages")]]:
        return None
    return python, str(copy_stdlib / "site-packages")


STARTUP_KINDS = ("venv", "system", "system-clean")


def compare(counts, others):
    """``counts`` against ``others``, round by round (the same hash seed):
    "cheaper" or "dearer" when every round says so, else "within noise"."""
    differences = [a - b for a, b in zip(counts, others)]
    verdict = "cheaper" if max(differences) < 0 else "dearer" if min(differences) > 0 else "within noise"
    return {
        "verdict": verdict,
        "difference": statistics.median(differences),
        "differences": differences,
        "ratio": statistics.median(counts) / statistics.median(others),
    }


def startup_table_for(python, work, wheels, runs):
    """One interpreter's rows, every environment made first, then measured
    side by side: ``runs`` rounds, each starting every environment once."""
    info = resolve_interpreter(python)
    interpreter = info["executable"]
    facts = query(
        interpreter,
        "import json, site, sysconfig; print(json.dumps({"
        "'version': __import__('sys').version.split()[0], 'site_packages': site.getsitepackages()}))",
    )
    own_pth = sorted(
        name
        for folder in facts["site_packages"]
        if os.path.isdir(folder)
        for name in os.listdir(folder)
        if name.endswith(".pth")
    )
    starts = {}  # (kind, key) -> (python, env, site_dir)
    notes = []
    for number, (key, _, recipe) in enumerate(STARTUP_ROWS):
        # venv: a fresh venv per row (python -m venv --without-pip), the row's
        # files in its site-packages as pip puts them.
        folder = work / ("venv-%d" % number)
        venv_python = make_venv(folder, base=interpreter)
        venv_site = site_packages(venv_python)
        if recipe:
            populate(venv_site, venv_python, recipe, wheels, target=False)
        starts[("venv", key)] = (venv_python, startup_env(), venv_site)
        # system: the interpreter itself, started with PYTHONUSERBASE naming a
        # fresh folder per row whose user site-packages holds the row's files
        # (an empty one for "bare"). site.main() gives the user site-packages
        # the same addsitedir() -> addpackage() as the interpreter's own
        # site-packages, once, as it reads a system install's site-packages
        # (a venv's site-packages is read twice: by site.venv() and again by
        # addsitepackages()); every row, "bare" included, lists one such
        # folder, so the rows differ from "bare" only by the row's files. The
        # interpreter's own site-packages is never written to; what it holds
        # runs in every row, "bare" included.
        user_base = work / ("userbase-%d" % number)
        env = startup_env(PYTHONUSERBASE=str(user_base))
        user = query(
            interpreter,
            "import json, site; print(json.dumps([site.getusersitepackages(), site.ENABLE_USER_SITE]))",
            env,
        )
        if user[1] is True:
            os.makedirs(user[0])
            if recipe:
                populate(user[0], interpreter, recipe, wheels, target=True)
            starts[("system", key)] = (interpreter, env, user[0])
        elif number == 0:
            notes.append("system: the interpreter reads no user site, no system rows")
        # system-clean: a copy of the interpreter with an empty site-packages
        # of its own (clean_system_copy), one per row, the row's files in that
        # site-packages, as a system install puts them; PYTHONUSERBASE names a
        # folder that does not exist, so no user site is read.
        copy = clean_system_copy(interpreter, work / ("clean-%d" % number))
        if copy is not None:
            copy_python, copy_site = copy
            if recipe:
                populate(copy_site, copy_python, recipe, wheels, target=True)
            no_user_site = startup_env(PYTHONUSERBASE=str(work / "no-user-base"))
            starts[("system-clean", key)] = (copy_python, no_user_site, copy_site)
        elif number == 0:
            notes.append("system-clean: no working copy of this interpreter could be made")
    # Round r starts every environment once, all with the hash seed r + 1: a
    # start's count moves by ~0.1% with the hash seed (and by a few hundred
    # instructions without it changing), so rows compared within a round
    # differ by their files, and the medians over rounds span several seeds.
    samples = {start: [] for start in starts}
    order = list(starts)
    seeds = [str(round_ + 1) for round_ in range(runs)]
    for round_, seed in enumerate(seeds):
        shift = round_ % len(order)
        for start in order[shift:] + order[:shift]:
            python_, env, _ = starts[start]
            callgrind_instructions(python_, runs=1, env=dict(env, PYTHONHASHSEED=seed), samples=samples[start])
    table = {}
    for kind in STARTUP_KINDS:
        if (kind, "bare") not in starts:
            continue
        bare = statistics.median(samples[(kind, "bare")])
        rows = {}
        for key, label, _ in STARTUP_ROWS:
            counts = samples[(kind, key)]
            median = statistics.median(counts)
            rows[key] = {
                "label": label,
                "instructions": median,
                "ratio": median / bare,
                "samples": counts,
                "bytecode_files": bytecode_files(starts[(kind, key)][2]),
            }
        goal = {
            key: compare(samples[(kind, key)], samples[(kind, "anchor")]) for key in ("plugin", "plugin_no_bytecode")
        }
        table[kind] = {
            "rows": rows,
            "goal": dict(goal, met=all(g["verdict"] == "cheaper" for g in goal.values())),
            "comment_line": compare(samples[(kind, "plugin")], samples[(kind, "plugin_no_comment")]),
        }
    return {
        "python": python,
        "interpreter": interpreter,
        "version": facts["version"],
        "interpreter_site_packages_pth": own_pth,
        "runs": runs,
        "pythonhashseeds": seeds,
        "notes": notes,
        "kinds": table,
    }


def startup_table(pythons, work, runs, setuptools_wheel_path=None):
    """The start-up table for every interpreter in ``pythons``."""
    wheels = {
        "plugin": build_wheel(work / "wheel"),
        "setuptools": setuptools_wheel(work / "setuptools", setuptools_wheel_path),
    }
    plugin_pth = wheel_text(wheels["plugin"], PLUGIN_PTH)
    result = {
        "runs": runs,
        "method": "callgrind instructions of `python -c pass`, median of %d starts per row, in rounds that start "
        "every environment once, round r with PYTHONHASHSEED=r+1; PYTHONDONTWRITEBYTECODE=1; ratio to the "
        "same kind of environment with nothing added" % runs,
        "plugin_wheel": wheels["plugin"].name,
        "plugin_pth": plugin_pth,
        "plugin_pth_sha256": hashlib.sha256(plugin_pth.encode()).hexdigest(),
        "plugin_pth_has_comment_line": plugin_pth.startswith("#"),
        "checkout": subprocess.run(
            ["git", "-C", str(REPO), "describe", "--always", "--dirty"], capture_output=True, text=True
        ).stdout.strip(),
        "anchor_wheel": wheels["setuptools"].name,
        "anchor_pth": wheel_text(wheels["setuptools"], ANCHOR_PTH),
        "interpreters": [],
    }
    for number, python in enumerate(pythons):
        folder = work / ("python-%d" % number)
        folder.mkdir()
        result["interpreters"].append(startup_table_for(python, folder, wheels, runs))
    return result


STARTUP_HEADINGS = {
    "plugin": "plugin, bytecode",
    "plugin_no_bytecode": "plugin, no bytecode",
    "anchor": "anchor: setuptools' .pth, bytecode",
    "anchor_no_bytecode": "anchor, no bytecode",
    "import_sys": "floor: `import sys` .pth",
    "plugin_no_comment": "plugin, bytecode, .pth without comment line",
}


def format_startup_table(result):
    """The table as Markdown: millions of instructions, ratio to bare."""
    columns = [key for key, _, _ in STARTUP_ROWS if key != "bare"]
    head = (
        ["Python", "environment", "nothing added"]
        + [STARTUP_HEADINGS[key] for key in columns]
        + ["comment line's cost", "plugin cheaper than anchor (bytecode), with and without bytecode"]
    )
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for entry in result["interpreters"]:
        for kind, table in entry["kinds"].items():
            rows = table["rows"]
            cells = [entry["version"], kind, "%.2f M" % (rows["bare"]["instructions"] / 1e6)]
            cells += ["%.2f M (%.3f×)" % (rows[key]["instructions"] / 1e6, rows[key]["ratio"]) for key in columns]
            comment = table["comment_line"]
            cells.append(
                "%+.0f instructions (%+.3f%%), %s"
                % (comment["difference"], (comment["ratio"] - 1) * 100, comment["verdict"])
            )
            goal = table["goal"]
            cells.append(
                "yes"
                if goal["met"]
                else "NO: "
                + "; ".join(
                    "%s %s (%+.2f M)" % (name, goal[key]["verdict"], goal[key]["difference"] / 1e6)
                    for key, name in (("plugin", "with bytecode"), ("plugin_no_bytecode", "without bytecode"))
                    if goal[key]["verdict"] != "cheaper"
                )
            )
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


PATCH_COST = r"""
import os, sys, time, json
# Started with SGLANG_HOTFIX_TRTLLM_DISABLE=1: the startup module stood aside.
import sglang.srt.layers.attention.trtllm_mha_backend as backend
del os.environ["SGLANG_HOTFIX_TRTLLM_DISABLE"]
import sglang_hotfix_trtllm_autoload as autoload
start = time.perf_counter()
autoload.install()   # the module is already imported: locate, verdict, wrap, log now
elapsed = time.perf_counter() - start
kind = type(backend.TRTLLMHAAttnBackend.__dict__["init_forward_metadata_capture_cuda_graph"]).__name__
print("RESULT:" + json.dumps({"seconds": elapsed, "wrapped": kind}))
"""


def patch_cost(processes):
    samples = []
    for _ in range(processes):
        out = subprocess.run(
            [sys.executable, "-c", PATCH_COST],
            capture_output=True,
            text=True,
            env=clean_env(SGLANG_HOTFIX_TRTLLM_DISABLE="1"),
            check=True,
        ).stdout
        result = json.loads(next(text for text in out.splitlines() if text.startswith("RESULT:"))[7:])
        assert result["wrapped"] == "HotfixWrapper", result
        samples.append(result["seconds"])
    return {"median_ms": statistics.median(samples) * 1e3, "max_ms": max(samples) * 1e3, "processes": processes}


CALL_COST = r"""
import json, statistics, sys, time
sys.path.insert(0, sys.argv[1])
import torch
import sglang.srt.layers.attention.trtllm_mha_backend as backend
from sglang.srt.model_executor.forward_batch_info import ForwardMode
from capture_harness import SPEC_INFO, make_backend
from upstream_fix import upstream_fixed_method

cls = backend.TRTLLMHAAttnBackend
assert type(cls.__dict__["init_forward_metadata_capture_cuda_graph"]).__name__ == "HotfixWrapper"
upstream = upstream_fixed_method(backend)
bs, rounds, calls = 8, int(sys.argv[2]), 200
seq_lens = torch.randint(1, 200, (bs,))
req = torch.arange(bs)
patched_backend, upstream_backend = make_backend(cls, 1), make_backend(cls, 1)

def patched():
    patched_backend.init_forward_metadata_capture_cuda_graph(
        bs, bs, req, seq_lens, encoder_lens=None, forward_mode=ForwardMode.DECODE, spec_info=SPEC_INFO)

def fixed():
    upstream(upstream_backend, bs, bs, req, seq_lens, encoder_lens=None, forward_mode=ForwardMode.DECODE,
             spec_info=SPEC_INFO)

replay = cls.__dict__["init_forward_metadata_replay_cuda_graph"]
for b in (patched_backend, upstream_backend):
    b.req_to_token = torch.arange(bs * 512, dtype=torch.int32).reshape(bs, 512)

def replay_patched_env():
    patched_backend.init_forward_metadata_replay_cuda_graph(
        bs, req, seq_lens, int(seq_lens.sum()), None, ForwardMode.DECODE, SPEC_INFO, seq_lens)

def replay_plain():
    replay(upstream_backend, bs, req, seq_lens, int(seq_lens.sum()), None, ForwardMode.DECODE, SPEC_INFO, seq_lens)

def per_call(fn):
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - start) / calls

timings = {name: [] for name in ("patched", "upstream", "replay_patched_env", "replay_plain")}
for fn in (patched, fixed, replay_patched_env, replay_plain):
    fn()
for _ in range(rounds):
    timings["patched"].append(per_call(patched))
    timings["upstream"].append(per_call(fixed))
    timings["replay_patched_env"].append(per_call(replay_patched_env))
    timings["replay_plain"].append(per_call(replay_plain))
medians = {k: statistics.median(v) for k, v in timings.items()}
print("RESULT:" + json.dumps({"median_us": {k: v * 1e6 for k, v in medians.items()},
      "capture_ratio": medians["patched"] / medians["upstream"],
      "replay_ratio": medians["replay_patched_env"] / medians["replay_plain"],
      "replay_is_sglangs_function": cls.__dict__["init_forward_metadata_replay_cuda_graph"] is replay
                                    and not hasattr(replay, "__wrapped__")}))
"""


def call_cost(rounds):
    out = subprocess.run(
        [sys.executable, "-c", CALL_COST, str(REPO / "tests" / "support"), str(rounds)],
        capture_output=True,
        text=True,
        env=clean_env(),
        check=True,
    ).stdout
    return json.loads(next(text for text in out.splitlines() if text.startswith("RESULT:"))[7:])


def status_cost(runs):
    cli = shutil.which("sglang-hotfix-trtllm", path=os.path.dirname(sys.executable))
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        subprocess.run([cli, "status", "--json"], capture_output=True, env=clean_env(), check=True)
        times.append(time.perf_counter() - start)
    return {"median_s": statistics.median(times), "max_s": max(times), "runs": runs}


def main(argv=None):
    parser = argparse.ArgumentParser(description="sglang-hotfix-trtllm benchmarks")
    parser.add_argument("--quick", action="store_true", help="fewer repetitions")
    parser.add_argument("--json", help="also write the figures to this file")
    parser.add_argument(
        "--startup-table",
        action="store_true",
        help="measure only the per-interpreter start-up table of docs/costs.md (needs valgrind, not SGLang)",
    )
    parser.add_argument(
        "--python",
        action="append",
        metavar="PATH",
        help="an interpreter for the start-up table (repeatable; default: the running one; implies --startup-table)",
    )
    parser.add_argument(
        "--runs", type=int, metavar="N", help="rounds of the start-up table (default: 5, or 3 with --quick)"
    )
    parser.add_argument(
        "--setuptools-wheel",
        metavar="WHEEL",
        help="setuptools' wheel for the anchor row (default: pip download %s)" % ANCHOR_SETUPTOOLS,
    )
    arguments = parser.parse_args(argv)
    scale = 1 if arguments.quick else 4
    if arguments.startup_table or arguments.python:
        if not shutil.which("valgrind"):
            parser.error("the start-up table needs valgrind (callgrind)")
        with tempfile.TemporaryDirectory() as work:
            table = startup_table(
                arguments.python or [sys.executable],
                pathlib.Path(work),
                runs=arguments.runs or (3 if arguments.quick else 5),
                setuptools_wheel_path=arguments.setuptools_wheel,
            )
        figures = {"python": sys.version.split()[0], "startup_table": table}
        print(format_startup_table(table))
        print(
            "\nM: millions of instructions (callgrind, `python -c pass`), median of %d rounds; ratios to the same "
            "kind of environment with nothing added; costs and verdicts compare rows round by round." % table["runs"]
        )
        if arguments.json:
            pathlib.Path(arguments.json).write_text(json.dumps(figures, indent=2) + "\n")
        return 0
    with tempfile.TemporaryDirectory() as work:
        figures = {
            "python": sys.version.split()[0],
            "startup": startup(pathlib.Path(work), wall_runs=50 * scale),
            "patch_on_first_import": patch_cost(processes=2 * scale),
            "capture_call": call_cost(rounds=5 * scale),
            "status": status_cost(runs=5 * scale),
        }
    print(json.dumps(figures, indent=2))
    if arguments.json:
        pathlib.Path(arguments.json).write_text(json.dumps(figures, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
