import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))


def pytest_collection_modifyitems(config, items):
    for item in items:
        if "integration" in str(item.fspath):
            item.add_marker(pytest.mark.integration)


def _open_dir(prefix: str) -> str:
    # Job processes run as nobody and must reach the socket: pytest's own tmp dirs are 0700.
    d = tempfile.mkdtemp(prefix=prefix, dir="/tmp")
    os.chmod(d, 0o755)
    return d


@pytest.fixture(scope="session")
def starter():
    if os.geteuid() != 0:
        pytest.skip("integration tests need root (namespaces, veth, nftables)")
    from helpers.fakehost import build_starter
    d = _open_dir("lark-starter-")
    yield build_starter(d)
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def fakehost_factory(starter):
    from helpers.fakehost import FakeHost
    made = []

    def make(**kw):
        d = _open_dir("lark-host-")
        try:
            h = FakeHost(d, starter, **kw)
        except BaseException:
            shutil.rmtree(d, ignore_errors=True)  # e.g. a config the test meant to be refused
            raise
        made.append(h)
        return h.start()

    yield make
    for h in made:
        h.close()


@pytest.fixture
def host(fakehost_factory):
    return fakehost_factory()
