# Everything runs as root on Debian 12: the targets install what they need.
PY ?= python3
VENV := .venv
VPY := $(VENV)/bin/python
APT_PACKAGES := nftables iptables iproute2 util-linux dnsmasq-base openvswitch-switch iperf3 \
                containernetworking-plugins debootstrap gcc libc6-dev python3 python3-venv ca-certificates \
                dhcpcd-base prometheus

.PHONY: deps lint test unit integration e2e e2e-pool testbed demo demo-pool demo-docker demo-fake bench bench-wan clean

deps: $(VENV)/.installed

$(VENV)/.installed: setup.py
	@command -v nft >/dev/null && command -v iptables >/dev/null && command -v gcc >/dev/null \
	  && command -v dnsmasq >/dev/null && command -v debootstrap >/dev/null && test -x /usr/lib/cni/bridge \
	  && test -x /usr/bin/python3 && command -v iperf3 >/dev/null && command -v promtool >/dev/null \
	  && $(PY) -m venv --help >/dev/null 2>&1 \
	  || (apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q $(APT_PACKAGES))
	$(PY) -m venv $(VENV)
	$(VPY) -m pip install -q --upgrade pip
	$(VPY) -m pip install -q -e '.[test,report,controller]'
	touch $@

# The gates (issue 24): ruff (ruff.toml) and mypy (mypy.ini) over lark/, zero findings. `make test` runs them first.
lint: deps
	$(VENV)/bin/ruff check lark
	$(VENV)/bin/mypy

# The whole suite, after the gates: unit (tests/unit/test_import_graph.py: no import cycles in lark/), real-kernel
# integration, and end-to-end jobs on the HTCondor testbed (built into /var/cache/lark-testbed on first use, about
# a minute, then reused). The testbed's namespaces and root are shared: the lock keeps a second suite, demo or pool
# benchmark from starting it at the same time.
test: deps lint
	flock /tmp/lark-testbed.lock $(VPY) -m pytest -q -p no:cacheprovider tests

unit: deps
	$(VPY) -m pytest -q -p no:cacheprovider tests/unit

integration: deps
	$(VPY) -m pytest -q -p no:cacheprovider tests/integration

# A real one-machine HTCondor pool in a namespaced chroot (built once into /var/cache/lark-testbed).
testbed: deps
	$(VPY) testbed/testbed.py up

e2e: deps
	flock /tmp/lark-testbed.lock $(VPY) -m pytest -q -p no:cacheprovider tests/e2e

# Only the pool testbed's end-to-end tests (docs/pool.md); `make test` runs them too, once.
e2e-pool: deps
	flock /tmp/lark-testbed.lock $(VPY) -m pytest -q -p no:cacheprovider tests/e2e_pool

# The main job: a real pool (testbed), jobs from three users, one table from condor_history, pool stopped.
demo: deps
	$(VPY) demo/pool_demo.py

# The pool (paper section VI): a central manager and two EPs with their own larkd, a core Open vSwitch run by
# lark-controller, a WAN behind two links; jobs of three users show what each policy lets them reach. Shares the
# testbed's chroot root, hence the lock.
demo-pool: deps
	flock /tmp/lark-testbed.lock $(VPY) demo/pool_policies_demo.py

# Docker-universe jobs (issue 25): the testbed's dockerd with Lark's OCI runtime; a NAT job limited and counted, a
# no-network job that sees only lo, a docker_network_type = host job held with Lark's reason.
demo-docker: deps
	flock /tmp/lark-testbed.lock $(VPY) demo/container_demo.py

# The same ideas without HTCondor: a stand-in starter on a fake execution point (no chroot needed).
demo-fake: deps
	$(VPY) demo/fake_ep_demo.py

# Benchmarks print tables with their goals; paper_fig8 also writes bench/out/paper_fig8.png. pool_true_jobs and
# paper_wan run the pool testbed (shares the testbed root, hence the lock).
bench: deps
	$(VPY) -m pip install -q '.[bench]'
	$(VPY) bench/setup_latency.py
	$(VPY) bench/e2e_latency.py
	$(VPY) bench/wrapper_compiled.py
	$(VPY) bench/starter_compiled.py
	$(VPY) bench/prepare_compiled.py
	$(VPY) bench/scale128.py
	flock /tmp/lark-testbed.lock $(VPY) bench/pool_true_jobs.py
	flock /tmp/lark-testbed.lock $(VPY) bench/barrier.py
	$(VPY) bench/bandwidth_accuracy.py
	$(VPY) bench/paper_fig8.py
	$(VPY) bench/report.py
	$(VPY) bench/controller.py
	$(VPY) bench/controller_ha.py
	$(VPY) bench/escape_attempts.py
	flock /tmp/lark-testbed.lock $(VPY) bench/paper_wan.py

# The paper's WAN figures (Fig. 10, Fig. 12 / Table III) with real jobs on the pool testbed: about 10 minutes;
# writes bench/out/paper_wan_fig10.png and paper_wan_fig12.png. ARGS="--full" for every N in 1..15.
bench-wan: deps
	$(VPY) -m pip install -q '.[bench]'
	flock /tmp/lark-testbed.lock $(VPY) bench/paper_wan.py $(ARGS)

clean:
	rm -rf $(VENV) build *.egg-info
