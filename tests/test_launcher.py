"""`sglang-hotfix-trtllm run -- COMMAND` for a plugin installed with
`pip install --target DIR` (outside site-packages), as on a shared volume.

The interpreter here is a bare venv: it reads no startup file of ours. torch
and SGLang come from the test environment's site-packages on PYTHONPATH, after
the --target folder, so only the launcher can load the hotfix."""

import os

from conftest import PATCHED, SCENARIO_SCRIPTS, clean_env, run_cli, run_scenario

SCENARIOS = str(SCENARIO_SCRIPTS["scenario"])


def launch(bare_python, target_install, venv_site_packages, tmp_path, *command, extra_path=()):
    env = clean_env(PYTHONPATH=os.pathsep.join([str(target_install)] + list(extra_path) + [venv_site_packages]))
    return run_cli("run", "--", *command, python=bare_python, cwd=tmp_path, env=env, timeout=600)


def test_without_the_launcher_nothing_is_patched(bare_python, target_install, venv_site_packages, tmp_path):
    env = clean_env(PYTHONPATH=os.pathsep.join([str(target_install), venv_site_packages]))
    ran = run_scenario("scenario", "describe", python=bare_python, cwd=tmp_path, env=env)
    assert ran.returncode == 0, ran
    assert ran.result["attribute_type"] == "function"


def test_launcher_protects_command_and_its_spawned_children(bare_python, target_install, venv_site_packages, tmp_path):
    ran = launch(
        bare_python,
        target_install,
        venv_site_packages,
        tmp_path,
        bare_python,
        SCENARIOS,
        "spawn_child",
    )
    assert ran.returncode == 0, ran
    assert ran.result["child"]["attribute_type"] == PATCHED
    assert ran.result["child"]["module_file"].startswith(venv_site_packages)


def test_launcher_chains_to_the_images_own_sitecustomize(bare_python, target_install, venv_site_packages, tmp_path):
    image = tmp_path / "image"
    image.mkdir()
    (image / "sitecustomize.py").write_text("import os\nos.environ['IMAGE_SITECUSTOMIZE_RAN'] = 'yes'\n")
    code = (
        "import os, sitecustomize; print('RESULT:' + __import__('json').dumps("
        "{'image': os.environ.get('IMAGE_SITECUSTOMIZE_RAN'),"
        " 'armed': __import__('sglang_hotfix_trtllm_autoload').is_installed(), 'file': sitecustomize.__file__}))"
    )
    ran = launch(
        bare_python, target_install, venv_site_packages, tmp_path, bare_python, "-c", code, extra_path=[str(image)]
    )
    assert ran.returncode == 0, ran
    assert ran.result["image"] == "yes" and ran.result["armed"] is True
    assert ran.result["file"] == str(image / "sitecustomize.py")


def test_launcher_with_existing_sitecustomize_still_patches_spawned_children(
    bare_python, target_install, venv_site_packages, tmp_path
):
    image = tmp_path / "image"
    image.mkdir()
    (image / "sitecustomize.py").write_text("import sys\nsys.stderr.write('image sitecustomize ran\\n')\n")
    ran = launch(
        bare_python,
        target_install,
        venv_site_packages,
        tmp_path,
        bare_python,
        SCENARIOS,
        "spawn_child",
        extra_path=[str(image)],
    )
    assert ran.returncode == 0, ran
    assert ran.result["child"]["attribute_type"] == PATCHED
    # Once in `run` itself before it execs, then in the command and in each Python
    # process that command spawns (the child, and multiprocessing's resource tracker).
    assert ran.stderr.count("image sitecustomize ran") >= 3


def test_run_exits_with_the_commands_exit_status(bare_python, target_install, venv_site_packages, tmp_path):
    ran = launch(bare_python, target_install, venv_site_packages, tmp_path, bare_python, "-c", "raise SystemExit(7)")
    assert ran.returncode == 7


def test_run_exits_127_for_a_missing_command_and_2_for_none(bare_python, target_install, venv_site_packages, tmp_path):
    assert launch(bare_python, target_install, venv_site_packages, tmp_path, "no-such-command-here").returncode == 127
    ran = launch(bare_python, target_install, venv_site_packages, tmp_path)
    assert ran.returncode == 2 and "no command given" in ran.stderr
