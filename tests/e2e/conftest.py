import pytest

from condor import testbed


@pytest.fixture(scope="session")
def pool():
    """One pool for the whole e2e session: starting it costs ~15 s; every test leaves it drained."""
    testbed.build()
    testbed.install()
    testbed.start()
    yield testbed
    testbed.stop()
