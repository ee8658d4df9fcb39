"""lark-transfer-plugin and larkd's checks of what it asks (issue 22): only a root-owned plugin of the configured
directory runs, only with HTCondor's multi-file arguments; a refusal becomes HTCondor result ads with the reason;
nothing is ever run with the execution point's network except the capability query."""
from __future__ import annotations

import os
from pathlib import Path

import classad2
import pytest

from lark.config import Config
from lark.daemon import transfer_plugin as daemon_side
from lark.errors import LarkError
from lark.hook_launcher import install_transfer_wrappers
from lark.job import transfer_plugin as wrapper

IN, OUT = "/var/lib/condor/execute/dir_1/.curl_plugin.in", "/var/lib/condor/execute/dir_1/.curl_plugin.in.out"


@pytest.fixture
def plugin_dir(tmp_path: Path) -> Path:
    d = tmp_path / "libexec"
    d.mkdir(mode=0o755)
    os.chmod(d, 0o755)
    plugin = d / "curl_plugin"
    plugin.write_text("#!/bin/sh\n")
    os.chmod(plugin, 0o755)
    return d


def test_the_wrapper_and_larkd_look_for_plugins_in_the_same_place_by_default():
    assert wrapper.DEFAULT_PLUGIN_DIR == Config().transfer_plugin_dir


@pytest.mark.parametrize("upload", [False, True])
def test_htcondors_multifile_request_runs_the_configured_plugin(plugin_dir: Path, upload: bool):
    argv = ["curl_plugin", "-infile", IN, "-outfile", OUT, *(["-upload"] if upload else [])]
    cmd = daemon_side.plugin_command(argv, str(plugin_dir))
    assert cmd.argv() == [str(plugin_dir / "curl_plugin"), *argv[1:]]
    assert cmd.upload is upload


@pytest.mark.parametrize("argv", [
    ["../../tmp/evil", "-infile", IN, "-outfile", OUT],          # a path, not a plugin's name
    ["/tmp/evil", "-infile", IN, "-outfile", OUT],
    ["curl_plugin", "http://x/y", "/tmp/y"],                      # single-file protocol
    ["curl_plugin", "-infile", "rel.in", "-outfile", OUT],        # relative path
    ["curl_plugin", "-infile", IN, "-outfile", OUT, "-x"],        # anything more
    ["missing_plugin", "-infile", IN, "-outfile", OUT],
    "curl_plugin -infile x",
])
def test_anything_else_is_refused(plugin_dir: Path, argv):
    with pytest.raises(LarkError):
        daemon_side.plugin_command(argv, str(plugin_dir))


def test_a_plugin_others_can_change_is_refused(plugin_dir: Path):
    os.chmod(plugin_dir / "curl_plugin", 0o775)
    with pytest.raises(LarkError, match="writable by no one else"):
        daemon_side.plugin_command(["curl_plugin", "-infile", IN, "-outfile", OUT], str(plugin_dir))
    os.chmod(plugin_dir / "curl_plugin", 0o755)
    os.chown(plugin_dir / "curl_plugin", 1000, 1000)    # a user's file (the tests run as root)
    with pytest.raises(LarkError, match="root's"):
        daemon_side.plugin_command(["curl_plugin", "-infile", IN, "-outfile", OUT], str(plugin_dir))


def test_a_refusal_fails_every_file_of_the_request_with_the_reason():
    text = ('[ Url = "http://w/a.bin"; LocalFileName = "/x/a.bin" ]\n'
            '[ Url = "https://w/b.bin"; LocalFileName = "/x/b.bin" ]\n')
    ads = list(classad2.parseAds(daemon_side.failure_ads(text, "Lark: no network")))
    assert [(a["TransferUrl"], a["TransferFileName"], a["TransferProtocol"], a["TransferSuccess"],
             a["TransferError"]) for a in ads] == [
        ("http://w/a.bin", "a.bin", "http", False, "Lark: no network"),
        ("https://w/b.bin", "b.bin", "https", False, "Lark: no network")]
    # Unreadable input: still one failed result, so HTCondor holds the job with the reason.
    [ad] = classad2.parseAds(daemon_side.failure_ads(None, "Lark: no network"))
    assert ad["TransferSuccess"] is False and ad["TransferError"] == "Lark: no network"


def test_the_wrapper_writes_larkds_refusal_and_never_runs_the_plugin_itself(tmp_path: Path, monkeypatch):
    infile, outfile = tmp_path / ".curl_plugin.in", tmp_path / ".curl_plugin.in.out"
    infile.write_text('[ Url = "http://w/a.bin"; LocalFileName = "/x/a.bin" ]')
    asked = []

    def larkd(op, argv, **fields):
        asked.append((op, argv, fields))
        return 255, {"error": "policy: no network", "results": "[ TransferSuccess = false ]\n"}
    monkeypatch.setattr(wrapper, "run_by_larkd", larkd)
    monkeypatch.setattr(os, "execv", lambda *a: pytest.fail(f"ran a plugin with the EP's network: {a}"))
    code = wrapper.main(["/opt/lark/libexec/transfer/curl_plugin", "-infile", str(infile), "-outfile", str(outfile)])
    assert code == 1
    assert outfile.read_text() == "[ TransferSuccess = false ]\n"
    assert asked == [("transfer_plugin", ["curl_plugin", "-infile", str(infile), "-outfile", str(outfile)],
                      {"request": infile.read_text()})]


def test_the_wrapper_runs_only_the_capability_query_itself(tmp_path: Path, monkeypatch):
    ran = []
    monkeypatch.setattr(os, "execv", lambda path, argv: ran.append(argv))
    monkeypatch.setattr(wrapper, "run_by_larkd", lambda *a, **k: pytest.fail("asked larkd for -classad"))
    monkeypatch.setenv("LARK_TRANSFER_PLUGIN_DIR", "/usr/libexec/condor")
    wrapper.main(["/opt/lark/libexec/transfer/curl_plugin", "-classad"])
    assert ran == [["/usr/libexec/condor/curl_plugin", "-classad"]]
    # A single-file invocation (SRC DEST) would move data with the EP's network: refused, nothing run.
    monkeypatch.setattr(wrapper, "run_by_larkd", lambda *a, **k: pytest.fail("asked larkd"))
    assert wrapper.main(["/x/curl_plugin", "http://w/a.bin", str(tmp_path / "a.bin")]) == 1
    assert ran == [["/usr/libexec/condor/curl_plugin", "-classad"]]
    assert not (tmp_path / "a.bin").exists()


def test_install_hook_names_the_wrappers_after_the_plugins(tmp_path: Path):
    venv_bin = tmp_path / "bin"
    venv_bin.mkdir()
    os.chmod(tmp_path, 0o755)
    target = venv_bin / "lark-transfer-plugin"
    target.write_text("#!/bin/sh\n")
    try:
        links = install_transfer_wrappers(tmp_path / "libexec/transfer", target, ["curl_plugin"])
    except LarkError as e:    # tmp_path's parents are not all root-only on every machine
        pytest.skip(str(e))
    assert [(p.name, os.readlink(p)) for p in links] == [("curl_plugin", str(target))]
    with pytest.raises(LarkError):
        install_transfer_wrappers(tmp_path / "libexec/transfer", target, ["../evil"])
