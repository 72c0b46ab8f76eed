# The two commands of the README: `make demo` and `make test`. Each sets up what it needs.
VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: demo test lint docs bootstrap deb rpm packages-lint bench bench-quick bench-plan bench-fleet bench-observed bench-pacemaker bench-clouds bench-versus crash-campaign soak fuzz fuzz-quick
bootstrap:
	@./scripts/bootstrap

demo: bootstrap
	$(PY) -m scheduledeventsd demo --hooks-dir etc/scheduledeventsd/hooks

lint: bootstrap
	$(VENV)/bin/ruff check scheduledeventsd tests bench docs
	$(VENV)/bin/ruff format --check scheduledeventsd tests bench docs
	$(VENV)/bin/mypy

# The documentation site (docs/, mkdocs.yml) into build/site with Debian's mkdocs and its
# material theme; strict: a link to a missing page or file fails the build.
docs:
	./scripts/apt-need mkdocs mkdocs-material
	/usr/bin/mkdocs build --strict --clean --quiet

# Most tests wait on real processes and sockets, not the CPU: four workers on two cores. The
# crash campaigns, the soak and the Pacemaker cluster run after them, apart, so their load
# times none of those (a cluster beside the deployed tests' booted machine starved both);
# there three workers: one plays the campaigns one after another (xdist_group campaign), one
# the cluster's tests (xdist_group pacemaker), one the model's mutants then the two-minute
# soak. Together they use well under one core (measured on a machine loaded by other work:
# 132 s of CPU in 271 s, each test about as long as alone; 4.5 minutes instead of 12.9).
# The deployed tests share one booted machine, so they stay together (xdist_group).
# The fleet tests start real etcd clusters (Debian's etcd-server; etcdctl reads what they
# wrote); promtool (Debian's prometheus) checks the shipped alert rules and dashboard queries;
# the Pacemaker tests start a real 3-node corosync/pacemaker cluster in namespaces; the hostile
# input tests log to a real systemd-journald (Debian's systemd) in a mount namespace.
test: bootstrap
	./scripts/apt-need etcd-server etcd-client openssl faketime prometheus prometheus-node-exporter systemd \
		pacemaker pacemaker-cli-utils corosync resource-agents mkdocs mkdocs-material
	$(PY) -m pytest -q -n 4 --dist loadgroup -m "not campaign and not pacemaker and not soak"
	$(PY) -m pytest -q -n 3 --dist loadgroup -m "campaign or pacemaker or soak"

# libFuzzer (atheris) on every parser of untrusted input: 10 minutes; CI runs one.
fuzz: bootstrap
	$(PY) -m tests.fuzz -max_total_time=600

fuzz-quick: bootstrap
	$(PY) -m tests.fuzz -max_total_time=60

# An hour of churn with metrics, /health and webhooks on: RSS, fds and threads, missed, doubled.
soak: bootstrap
	$(PY) -m tests.soak --seconds 3600

# 500 kill -9s of the real daemon at random and chosen instants, then 200 among three daemons
# sharing events through etcd, then 10 minutes of a concurrency group of five daemons (max 1)
# cut off from etcd one at a time through their own TCP proxies, etcd members and daemons
# killed; then the invariants (root; ~32 minutes). `make test` runs each briefly.
crash-campaign: bootstrap
	./scripts/apt-need etcd-server etcd-client
	$(PY) -m tests.campaign --kills 500
	$(PY) -m tests.campaign --kills 200 --fleet
	$(PY) -m tests.campaign --group --seconds 600 --vms 5
	$(PY) -m tests.campaign --group --hold --seconds 600 --vms 5

deb:
	./scripts/build-deb

rpm:
	./scripts/build-rpm

# lintian and rpmlint on what `make deb` and `make rpm` built: no errors allowed.
packages-lint: deb rpm
	./scripts/apt-need lintian rpmlint
	lintian --fail-on error,warning build/deb/*.deb
	rpmlint -c packaging/rpm/rpmlint.toml build/rpm/RPMS/noarch/*.rpm packaging/rpm/scheduledeventsd.spec
	rpm -qp --requires --scripts -l build/rpm/RPMS/noarch/*.rpm

# Side by side with the documented polling sample: ~12 minutes (689 s measured); bench-quick ~3.
bench: bootstrap
	$(PY) -m bench

bench-quick: bootstrap
	./scripts/apt-need etcd-server etcd-client pacemaker pacemaker-cli-utils corosync resource-agents
	$(PY) -m bench --quick
	$(PY) -m bench.parse
	$(PY) -m bench.step
	$(PY) -m bench.hook_output
	$(PY) -m bench.fleet --quick
	$(PY) -m bench.observed --quick
	$(PY) -m bench.pacemaker --quick
	$(PY) -m bench.clouds --quick
	$(PY) -m bench.plan --quick

# What http, metrics and the textfile cost at rest, side by side with a plain daemon: 5 minutes.
bench-observed: bootstrap
	$(PY) -m bench.observed

# Detection latency per cloud (Azure, AWS, Google Cloud's long-poll) side by side: ~3 minutes.
bench-clouds: bootstrap
	$(PY) -m bench.clouds

# A Pacemaker node's drain (seen, resources gone, approved), health and standby side by side on
# a real 3-node cluster: ~3 minutes.
bench-pacemaker: bootstrap
	./scripts/apt-need pacemaker pacemaker-cli-utils corosync resource-agents
	$(PY) -m bench.pacemaker

# `scheduledeventsd plan` over 100, 1 000 and 10 000 VMs (groups of 100, max 5, weekend
# windows, 7 days' notice): wall and CPU time, steps per second, peak RSS and their growth.
bench-plan: bootstrap
	$(PY) -m bench.plan

# This tree against REV side by side: engine step at rest and churn, CPU at rest at 1 Hz and
# 4 Hz (~3 minutes). Issue 27 compared with the commit before the layout: REV=7d756ca^.
REV ?= HEAD~1
bench-versus: bootstrap
	$(PY) -m bench.versus $(REV)

# Shared-event approval latency through etcd and a gate, 3, 20 and 100 daemons side by side; a
# slot chain of 20 (max 1, 1 s undrain); etcd requests, daemon CPU and RSS: ~10 minutes.
bench-fleet: bootstrap
	./scripts/apt-need etcd-server etcd-client
	$(PY) -m bench.fleet
