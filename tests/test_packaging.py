"""What the wheel carries and what installing it may change."""

import zipfile

import pytest


@pytest.fixture(scope="module")
def wheel(plugin_wheel):
    return zipfile.ZipFile(plugin_wheel)


def _dist_file(wheel, name):
    (member,) = [n for n in wheel.namelist() if n.endswith(".dist-info/" + name)]
    return wheel.read(member).decode()


def test_startup_files_sit_at_the_wheel_root_and_in_record(wheel):
    names = wheel.namelist()
    record = _dist_file(wheel, "RECORD")
    for name in ("sglang_hotfix_trtllm.pth", "sglang_hotfix_trtllm.start", "sglang_hotfix_trtllm_autoload.py"):
        assert name in names
        assert any(line.startswith(name + ",") for line in record.splitlines())


def test_requires_wrapt_and_never_sglang_or_torch(wheel):
    metadata = _dist_file(wheel, "METADATA")
    requires = [line.split(":", 1)[1].strip() for line in metadata.splitlines() if line.startswith("Requires-Dist:")]
    assert [r.split(">")[0].split("=")[0].strip() for r in requires] == ["wrapt"]
    assert "Requires-Python: >=3.10" in metadata


def test_wheel_declares_the_sglang_plugin_and_the_console_script(wheel):
    entry_points = _dist_file(wheel, "entry_points.txt")
    assert "sglang_hotfix_trtllm = sglang_hotfix_trtllm.plugin:register" in entry_points
    assert "sglang-hotfix-trtllm = sglang_hotfix_trtllm.cli:main" in entry_points


def test_two_builds_with_source_date_epoch_are_the_same_bytes(tmp_path, monkeypatch):
    """Issue 48, item 3: two builds of one checkout differed in their timestamps, so a sha256 pin
    of the wheel could not be checked by rebuilding it. With SOURCE_DATE_EPOCH set (docs/reference.md
    shows the command), the wheel is the same, byte for byte."""
    import hashlib

    import plugin_wheel

    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1764900000")
    digests = set()
    for build in ("first", "second"):
        wheel = plugin_wheel.from_checkout(tmp_path / build)
        digests.add(hashlib.sha256(wheel.read_bytes()).hexdigest())
    assert len(digests) == 1
