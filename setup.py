from setuptools import find_packages, setup

setup(
    # The import package is `lark`, but that name on the package index is an unrelated parsing library:
    # the distribution has a name of its own, and docs/install.md puts it in its own virtual environment.
    name="htcondor-lark",
    version="0.1.0",
    description="Per-job network namespaces, policy, shaping and accounting for HTCondor",
    packages=find_packages(include=["lark", "lark.*"]),
    # compiled by `lark install-hook` (starter.c includes job_wrapper.c)
    package_data={"lark.job": ["launcher/prepare_job.c", "launcher/job_wrapper.c", "launcher/starter.c", "launcher/larkd_client.h"]},
    python_requires=">=3.11",
    install_requires=[
        "pyroute2>=0.9,<0.10",
        "htcondor>=24.0",
        "rich>=13",                 # lark report: terminal tables
        "prometheus-client>=0.17",  # larkd: live metrics (off unless metrics_address is set)
        "ovsdbapp>=2.4",            # larkd, OVS mode: OVSDB without an ovs-vsctl process per job
    ],
    # test: ruff, mypy for `make lint`; jsonschema, rfc3339-validator for the SciTags firefly schema;
    # promql-parser, pyyaml for tests/unit/test_packaging_metrics.py (PromQL in the shipped rules)
    extras_require={"test": ["pytest", "hypothesis", "scapy", "ruff", "mypy", "jsonschema", "rfc3339-validator",
                             "promql-parser", "pyyaml"],
                    "bench": ["matplotlib"],
                    "report": ["matplotlib"],  # lark report --html charts
                    # lark-controller (one host of the pool, not every EP): the OpenFlow 1.3 side (os-ken, the
                    # maintained Ryu fork, ~33 packages) and the CA / mutual-TLS key pairs (`certs`).
                    "controller": ["os-ken>=4.2,<5", "cryptography>=41"]},
    entry_points={
        "console_scripts": [
            "larkd=lark.daemon.server:main",
            "lark=lark.cli:main",
            "lark-job-wrapper=lark.job.wrapper:main",
            "lark-starter=lark.job.starter_wrapper:main",
            "lark-hook=lark.job.update_hook:main",
            "lark-prepare-job=lark.job.prepare_hook:main",
            "lark-transfer-plugin=lark.job.transfer_plugin:main",
            "lark-oci-runtime=lark.job.oci_runtime:main",
            "lark-controller=lark.controller.cli:main",
        ]
    },
)
