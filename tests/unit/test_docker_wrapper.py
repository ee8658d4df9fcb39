"""lark-docker (HTCondor's DOCKER): the network of `docker create` rewritten or refused; the job's own command
line never touched. Argument lists as HTCondor 25.x's DockerAPI::createContainer builds them."""
import pytest

from lark.job.docker_wrapper import Refused, rewrite_create, split_command

HEAD = ["--cpu-shares=100", "--memory=2048m", "--cap-drop=all", "--cap-add=SYS_PTRACE", "--security-opt",
        "no-new-privileges", "--init", "--name", "HTCJob12_3_slot1_PID4242", "--label", "org.htcondorproject=True",
        "--log-driver", "none", "--volume", "/var/lib/condor/execute/dir_1:/var/lib/condor/execute/dir_1",
        "--user", "1001:1001"]
TAIL = ["--hostname", "slot1-127-0-0-1", "lark-test/busybox:1", "/bin/sh", "job.sh", "--network=host"]


def test_no_network_and_nat_become_none():
    drops = ["--cap-drop=NET_ADMIN", "--cap-drop=NET_RAW", "--cap-drop=SYS_ADMIN"]
    assert rewrite_create(HEAD + TAIL, set()) == [*HEAD, "--hostname", "slot1-127-0-0-1", *drops, "--network=none",
                                                  "--runtime=lark", *TAIL[2:]]
    assert rewrite_create(HEAD + ["--network=none"] + TAIL, set()).count("--network=none") == 1


def test_host_is_refused_naming_the_job_and_the_fix():
    with pytest.raises(Refused) as e:
        rewrite_create(HEAD + ["--network=host"] + TAIL, set())
    assert "job 12.3" in str(e.value) and "docker_network_type = host" in str(e.value)
    assert "remove docker_network_type" in str(e.value)


@pytest.mark.parametrize("extra", [["--network", "mynet"], ["--net=container:other"]])
def test_unmanaged_networks_are_refused_unless_the_admin_allows_them(extra):
    with pytest.raises(Refused):
        rewrite_create(HEAD + extra + TAIL, set())
    if extra == ["--network", "mynet"]:
        allowed = rewrite_create(HEAD + extra + TAIL, {"mynet"})
        assert "--network=mynet" in allowed and "--runtime=lark" not in allowed  # not Lark's network: runc's


@pytest.mark.parametrize("extra", [["-p", "8080"], ["--publish=80:80"], ["-P"], ["-itP"], ["-p8080"]])
def test_port_publishing_is_refused(extra):
    with pytest.raises(Refused, match="port publishing"):
        rewrite_create(HEAD + extra + TAIL, set())


def test_the_jobs_own_arguments_after_the_image_are_kept():
    out = rewrite_create(["--rm=true", "img", "-p", "--network", "host"], set())
    assert out[-6:] == ["--network=none", "--runtime=lark", "img", "-p", "--network", "host"]
    assert out[0] == "--rm=true"


def test_global_options_before_the_subcommand():
    assert split_command(["--host", "unix:///x.sock", "create", "--init", "img"]) == (
        ["--host", "unix:///x.sock"], "create", ["--init", "img"])
    assert split_command(["version"]) == ([], "version", [])


def test_privileged_is_refused():
    with pytest.raises(Refused, match="privileged"):
        rewrite_create([*HEAD, "--privileged", *TAIL], set())
    assert "--privileged=false" in rewrite_create([*HEAD, "--privileged=false", *TAIL], set())


@pytest.mark.parametrize("cap", ["NET_ADMIN", "cap_net_raw", "SYS_PTRACE,ALL"])
def test_network_capabilities_are_refused_and_always_dropped(cap):
    with pytest.raises(Refused, match="cap-add"):
        rewrite_create([*HEAD, "--cap-add", cap, *TAIL], set())
    out = rewrite_create([*HEAD, *TAIL], set())
    assert {"--cap-drop=NET_ADMIN", "--cap-drop=NET_RAW", "--cap-drop=SYS_ADMIN"} <= set(out)
    assert out.index("--cap-drop=NET_RAW") < out.index("lark-test/busybox:1")


def test_a_short_option_with_its_value_attached_takes_no_next_word():
    assert rewrite_create(["-eA=1", "img", "cmd"], set())[-2:] == ["img", "cmd"]


def test_a_dockerd_without_larks_runtime_gets_a_hold_reason_with_the_fix(tmp_path, capsys):
    """The create refused by a dockerd that has no `lark` runtime: the reason says how to register it."""
    from lark.job.docker_wrapper import create_through, unknown_runtime
    said = "docker: Error response from daemon: unknown or invalid runtime name: lark\n"
    fake = tmp_path / "docker"
    fake.write_text(f"#!/bin/sh\nprintf '{said.strip()}\\n' >&2\nexit 125\n")
    fake.chmod(0o755)
    assert create_through([str(fake), "create", "--runtime=lark", "img"]) == 125
    err = capsys.readouterr().err
    assert err.startswith("Lark: ") and "--add-runtime lark=" in err and "daemon.json" in err, err
    assert "unknown or invalid runtime name: lark" in err
    assert unknown_runtime("Error response from daemon: No such image: x") is None
