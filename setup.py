from setuptools import find_packages, setup

setup(
    # The import package is `lark`, but that name on the package index is an unrelated parsing library:
    # the distribution has a name of its own, and docs/install.md puts it in its own virtual environment.
    name="htcondor-lark",
    version="0.1.0",
    description="Per-job network namespaces, policy, shaping and accounting for HTCondor",
    packages=find_packages(include=["lark", "lark.*"]),
    python_requires=">=3.11",
    install_requires=[
        "pyroute2>=0.9,<0.10",
        "htcondor>=24.0",
    ],
    extras_require={"test": ["pytest", "hypothesis"], "bench": ["matplotlib"]},
    entry_points={
        "console_scripts": [
            "larkd=lark.daemon.server:main",
            "lark=lark.cli:main",
            "lark-job-wrapper=lark.job.wrapper:main",
            "lark-starter=lark.job.starter_wrapper:main",
            "lark-hook=lark.job.update_hook:main",
            "lark-prepare-job=lark.job.prepare_hook:main",
        ]
    },
)
