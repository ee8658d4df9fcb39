"""lark/policy/containers.py: which Apptainer options leave the job's network, and which jobs that concerns."""
import pytest

from lark.errors import LarkError
from lark.policy.containers import check_container_network, is_container_job, own_netns_option


@pytest.mark.parametrize("args,found", [
    ("--net --network none", "--net"), ("-n", "-n"), ("-Cn", "-Cn"), ('"--net"', "--net"),
    ("--network=bridge", "--network=bridge"), ("--contain --network-args portmap=80:80/tcp", "--network-args"),
    ("-B /mnt/n:/n", None), ("--bind /net:/net", None), ("--nv -C", None), ("", None), (None, None),
    ("-- --net", None),
])
def test_own_netns_option(args, found):
    assert own_netns_option(args) == found


def test_container_jobs():
    assert is_container_job({"JobUniverse": 14})
    assert is_container_job({"JobUniverse": 5, "ContainerImage": "img.sif"})
    assert is_container_job({"JobUniverse": 5, "SingularityImage": "/cvmfs/x"})
    assert not is_container_job({"JobUniverse": 5})
    assert is_container_job({"JobUniverse": 5}, site_forces_container=True)


def test_refusal_names_the_job_the_knob_and_the_fix():
    with pytest.raises(LarkError) as e:
        check_container_network({"JobUniverse": 14}, "7.0", knobs=("--net --network none", False))
    text = str(e.value)
    assert "job 7.0" in text and "SINGULARITY_EXTRA_ARGUMENTS" in text and "remove --net" in text
    check_container_network({"JobUniverse": 5}, "7.0", knobs=("--net", False))   # not a container job
    check_container_network({"JobUniverse": 14}, "7.0", knobs=("-B /srv", False))  # no netns of its own
