# reft build. `make` needs no root; `make deps` and `make test` (which starts
# the local Slurm test cluster) run as root.

PREFIX      ?= /usr/local
SYSCONFDIR  ?= /etc
GO          ?= $(shell command -v go 2>/dev/null || echo /usr/local/go/bin/go)
BUILD       := build
VERSION     ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo 0.1.0-dev)
LDFLAGS     := -X github.com/reft-hpc/reft/launcher/version.Version=$(VERSION)
GOFLAGS_B   := -trimpath -ldflags "$(LDFLAGS)"
CLUSTER     := tests/cluster/cluster
# Debian's interpreter: python3-torch and python3-numpy are installed for it,
# whatever python3 comes first on PATH.
PYTHON      ?= /usr/bin/python3

# Debian 12 packages the project builds, tests and runs with
# (prometheus-node-exporter and prometheus' promtool: the metrics tests, agent/metrics;
# curl: the README's "Try it yourself").
DEB_PKGS := slurm-wlm slurmctld slurmd slurmdbd slurm-client munge mariadb-server \
	libslurm-dev libpmix-dev openmpi-bin libopenmpi-dev pkg-config gcc make \
	python3-torch python3-numpy iproute2 util-linux procps debootstrap \
	prometheus-node-exporter prometheus curl

BINARIES := $(BUILD)/reft $(BUILD)/reft-agent $(BUILD)/reft-mpi-smoke $(BUILD)/reft-pmix-probe $(BUILD)/reft-train
# The SPANK plugin: C shim + Go c-shared library, installed side by side.
BINARIES += $(BUILD)/spank_reft.so $(BUILD)/libreft_spank.so

.PHONY: all deps deps-host deps-trixie build-trixie test unit unit-trixie e2e-trixie fuzz e2e e2e-net bench-net bench-gemini bench-goodput demo demo-trixie bench install clean
all: $(BINARIES)

$(BUILD):
	mkdir -p $@

$(BUILD)/reft: FORCE | $(BUILD)
	$(GO) build $(GOFLAGS_B) -o $@ ./cmd/reft

$(BUILD)/reft-agent: FORCE | $(BUILD)
	$(GO) build $(GOFLAGS_B) -o $@ ./cmd/reft-agent

$(BUILD)/reft-mpi-smoke: FORCE | $(BUILD)
	$(GO) build $(GOFLAGS_B) -tags mpi -o $@ ./tests/mpismoke

$(BUILD)/reft-pmix-probe: FORCE | $(BUILD)
	$(GO) build $(GOFLAGS_B) -o $@ ./tests/pmixprobe

$(BUILD)/reft-train: FORCE | $(BUILD)
	$(GO) build $(GOFLAGS_B) -tags mpi -o $@ ./examples/trainer

# Both libraries export only their entry points (linker version scripts;
# the shim is also built with -fvisibility=hidden): tests/symbols checks it.
$(BUILD)/libreft_spank.so: FORCE | $(BUILD)
	$(GO) build -trimpath -ldflags "$(LDFLAGS) -extldflags=-Wl,--version-script=$(CURDIR)/spank/plugin/libreft_spank.map" \
		-buildmode=c-shared -o $@ ./spank/plugin

# The plugin's root state directory (spank/shim.c, docs/SECURITY.md).
REFT_STATE_DIR ?= /run/reft/.plugin

$(BUILD)/spank_reft.so: spank/shim.c spank/shim.map | $(BUILD)
	$(CC) -shared -fPIC -O2 -Wall -Wextra -Werror -fvisibility=hidden -DREFT_STATE_DIR='"$(REFT_STATE_DIR)"' \
		-Wl,--version-script=spank/shim.map -o $@ spank/shim.c -ldl

FORCE:

deps: deps-host deps-trixie

# Idempotent: installs only what dpkg does not already report as installed.
deps-host:
	@missing=$$(for p in $(DEB_PKGS); do dpkg-query -W -f='$${Status}\n' $$p 2>/dev/null | grep -q '^install ok installed' || echo $$p; done); \
	if [ -n "$$missing" ]; then \
		echo "make deps: installing:" $$missing; \
		apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $$missing; \
	else echo "make deps: all $(words $(DEB_PKGS)) packages present"; fi

# The second test lane (issue 16): a Debian 13 (trixie) root under
# /var/tmp/reft-trixie, debootstrapped from Debian's mirror and cached (a
# stamp records its package list); tests/lane/trixie-root says how. Only
# debootstrap (a host package of deps-host) is installed on the host.
TRIXIE := tests/lane/trixie-root
deps-trixie: deps-host
	$(TRIXIE) build

# The trixie lane's unit tests, in the root with the checkout bound in: the
# build above, go vet, the Go tests of the cgo packages (PMIx 5, Open MPI 5,
# the SPANK library) and the Python client suite on Python 3.13 and
# PyTorch 2.6 (the host's Go, bound in, builds its conformance agent).
TRIXIE_GO_PKGS := ./pmix/... ./spank/... ./examples/... ./hostmem/...
unit-trixie: build-trixie
	$(TRIXIE) run 'go vet ./... && go test -count=1 $(TRIXIE_GO_PKGS)'
	$(TRIXIE) run 'cd client/python && python3 -m unittest discover -s tests'
	$(TRIXIE) run 'cd client/python && python3 -m unittest discover -s tests_torch2'

# The trixie lane's e2e subset: the local test cluster with the root's
# Slurm 24.11 daemons and build/trixie's binaries and plugin
# (tests/lane/e2e brings it up, runs these tests, always takes it down).
# It uses the Debian 12 cluster's ports, so it runs after `make e2e`, never
# beside it (`make test` runs both). The subset keeps `.ci/run` within its
# 45 minutes on 2 cores (docs/BENCHMARKS.md has each lane's time).
TRIXIE_E2E := TestMPIAllReduce TestShmPrivatePerNode TestKillNodeWipesShm TestSacctListsJob \
	TestReftSrunEnvAndHello TestReftBatchDirective TestReftOneAgentPerNodeAcrossSteps \
	TestReftBadInputRejected TestReftNoFlagUnchanged TestReftExternStepStartsAgent \
	TestReftRunNodeLossSpare TestReftRunNodeLossSpareTorch TestReftRunNodeLossRequeue \
	TestHostileRoot TestCleanupJobEnd TestCleanupHostileStore
empty :=
space := $(empty) $(empty)
e2e-trixie: build-trixie
	$(TRIXIE) run --lane-build "tests/lane/e2e '^($(subst $(space),|,$(strip $(TRIXIE_E2E))))$$'"

# Everything `make all` builds, built inside the trixie root against its
# Slurm 24.11 headers, Open MPI 5 and PMIx 5, into build/trixie/; then the
# SPANK plugin's stamped release (plugin_version, what slurmd checks) must
# be the root's Slurm. Go runs there offline (GOPROXY=off) on the host's
# module cache, bound read-only: hence the download first.
BUILD_TRIXIE := $(BUILD)/trixie
build-trixie:
	$(GO) mod download
	$(TRIXIE) run 'make BUILD=$(BUILD_TRIXIE) VERSION=$(VERSION) CC=gcc all && \
		v=$$(slurmd -V) && go run ./tests/lane/pluginrelease -want "$$v" $(BUILD_TRIXIE)/spank_reft.so'

# tests/gpu/run.sh --cpu: the GPU check script's dry run (CPU tensors, toy
# sizes), so the script a device session runs has run here first.
# The failure-detection path also runs under the race detector: the
# detector, the mesh and peer transports, reft run that acts on verdicts,
# the Go client, and the agent package's tests of its reactions to them
# (the whole agent package under -race takes 2-4 minutes on 2 cores;
# these, seconds). docs/BENCHMARKS.md has the time it adds (issue 18).
#
# Packages whose tests run in testing/synctest bubbles take the race
# detector on one P (-cpu 1). Go 1.26's race runtime gives a bubble one
# tsan context for running its timers, and uses it from two threads at
# once when the bubble's root fires an AfterFunc (context.WithTimeout
# does) while a bubbled goroutine polls an expired channel timer: tsan's
# state is corrupted and the test binary dies (SIGSEGV in StackDepot::Put,
# or "CHECK failed: tsan_rtl.cpp:346"; golang/go#78156 reads the same).
# One P keeps the two apart; the detector still reports every access pair
# not ordered by happens-before, which does not depend on real overlap.
# tests/makefile's TestRaceBubblesOnOneP keeps this list complete.
RACE_PKGS := ./agent/mesh/ ./agent/msglog/ ./client/
RACE_BUBBLE_PKGS := ./agent/detect/ ./agent/peer/ ./launcher/run/
RACE_AGENT_TESTS := ^(TestProgress|TestPeerFailure.*|TestJITFlushFollowsVerdicts|TestDetectorVerdictNotices|TestAgentPeering.*)$$
unit:
	$(GO) vet ./...
	$(GO) test -count=1 ./...
	$(GO) test -count=1 -race $(RACE_PKGS)
	$(GO) test -count=1 -race -cpu 1 $(RACE_BUBBLE_PKGS)
	$(GO) test -count=1 -race -run '$(RACE_AGENT_TESTS)' ./agent/
# reft-train's stage-local replay over real Open MPI (3 ranks, one per
# stage): examples/trainer/replay_mpi_test.go; and --comm-wait's
# nonblocking collectives against the blocking ones, bit for bit
# (commwait_mpi_test.go).
	mkdir -p $(BUILD)
	$(GO) test -c -tags mpi -o $(BUILD)/reft-train-mpi.test ./examples/trainer
	timeout 300 mpirun --allow-run-as-root --oversubscribe -n 3 $(BUILD)/reft-train-mpi.test -test.run '^(TestMPIReplay|TestCommWaitSameBits)$$' -test.count=1 -test.v
	cd client/python && $(PYTHON) -m unittest discover -s tests
	CGO_ENABLED=0 $(GO) build -o $(BUILD)/conformance-agent ./tests/conformance-agent
	REFT_GPU_AGENT=$(BUILD)/conformance-agent PYTHON=$(PYTHON) bash tests/gpu/run.sh --cpu
	$(MAKE) fuzz

# Every Go fuzz target, FUZZTIME each, one after the other (tests/fuzz.sh
# finds them with go test -list; docs/security-fuzz.md lists what each
# covers). The unit run above already replayed their committed corpora.
FUZZTIME ?= 3s
fuzz:
	GO=$(GO) FUZZTIME=$(FUZZTIME) tests/fuzz.sh

# WITH_CLUSTER starts a recipe line that needs the local test cluster: it
# brings the cluster up and always takes it down again when the line ends
# (pass, fail, a failed or half-done `up`, SIGINT or SIGTERM), so no daemon
# is left running; the line exits with its first failure's status.
# WITH_NET_CLUSTER is the same with `up --net` (each node in its own network
# namespace: the network-fault scenarios).
cluster_with = trap 'rc=$$?; trap - EXIT; $(CLUSTER) down || { [ $$rc -ne 0 ] || rc=1; }; exit $$rc' EXIT; \
	trap 'exit 130' INT TERM HUP; \
	$(CLUSTER) up --no-reft $(1) || exit $$?
WITH_CLUSTER = $(call cluster_with,)
WITH_NET_CLUSTER = $(call cluster_with,--net)

# End-to-end tests on the local cluster, which comes up without reft
# (--no-reft: the tests install the plugin themselves). The cluster tool's
# own lifecycle test runs after them: it takes the cluster down, brings it
# up with reft twice, and checks that `down` leaves nothing. The README's
# "Try it yourself" commands run next, from their own `cluster up`. Then
# the network-fault phase (e2e-net).
e2e: all
	@$(WITH_CLUSTER); \
	rc=0; \
	$(GO) test -count=1 -tags e2e -timeout 45m -v ./tests/e2e/ || rc=$$?; \
	$(GO) test -count=1 -tags e2e -timeout 5m -run Munge -v ./agent/peer/ || rc=$$?; \
	( cd tests/cluster && $(GO) test -count=1 -tags e2e -timeout 10m -v . ) || rc=$$?; \
	$(GO) test -count=1 -tags e2e -timeout 15m -v ./tests/readme/ || rc=$$?; \
	exit $$rc
	@$(E2E_NET)

# Issue 18's network faults on a cluster brought up with --net: a 3 s flap,
# a 3 s stall, 200 ms of added latency (no verdict for any), n2 cut off from
# the other agents (one verdict, about n2), n2 cut off from everything,
# slurmctld included (one verdict, n2 replaced), and a real node loss on
# that network (a silent host: verdict, relaunch on the spare). Only these:
# the rest of the suite ran on the plain cluster above (docs/BENCHMARKS.md
# has the phase's wall time and every run of each scenario).
E2E_NET_TESTS := ^(TestNetFaultsNoVerdict|TestNetPartitionFromAgents|TestNetPartitionFromAll|TestReftRunNodeLossSpare)$$
BENCH_NET_TESTS := $(E2E_NET_TESTS)
E2E_NET = $(WITH_NET_CLUSTER); \
	$(GO) test -count=1 -tags 'e2e e2enet' -timeout 20m -run '$(E2E_NET_TESTS)' -v ./tests/e2e/
e2e-net: all
	@$(E2E_NET)

# Both lanes: the Debian 12 lane's unit and e2e tests, then the trixie
# lane's unit tests and e2e subset. The trixie lane's e2e runs after e2e,
# never beside it (the two clusters share ports): in this recipe, after the
# prerequisites, so that make -j keeps them apart.
test: unit unit-trixie e2e
	$(MAKE) e2e-trixie

# REFT_LANE=trixie make demo: the same demo on the trixie lane's cluster
# (Slurm 24.11, build/trixie's binaries; the host's build is not needed).
ifeq ($(REFT_LANE),trixie)
demo: demo-trixie
else
demo: all
	tests/demo.sh
endif

demo-trixie: build-trixie
	$(TRIXIE) run --lane-build tests/demo.sh

# The network-fault table of docs/BENCHMARKS.md: e2e-net's scenarios
# NETREPS times each on a --net cluster (about NETREPS x e2e-net's time),
# then tests/netbench prints verdicts expected and seen, false positives
# and negatives, and detection times; the run's log is kept in
# $(BUILD)/bench-net.log. Needs root, like make test.
NETREPS ?= 3
bench-net: all
	@echo "make bench-net on: $$(lscpu | sed -n 's/^Model name: *//p' | head -1), $$(nproc) cores, $$(uname -r), load $$(cut -d' ' -f1-3 /proc/loadavg), NETREPS=$(NETREPS)"
	@mkdir -p $(BUILD)
	@$(WITH_NET_CLUSTER); \
	rc=0; \
	$(GO) test -count=$(NETREPS) -tags 'e2e e2enet' -timeout 120m -run '$(BENCH_NET_TESTS)' -v ./tests/e2e/ >$(BUILD)/bench-net.log 2>&1 || rc=$$?; \
	grep -E '^(--- |FAIL|ok)' $(BUILD)/bench-net.log; \
	$(GO) run ./tests/netbench/cmd/netbench <$(BUILD)/bench-net.log || rc=$$?; \
	exit $$rc

# The trainer overhead benchmark trains for minutes; on a busy machine the
# default 10-minute test timeout is not enough.
# The benchmarks; the last one (step launch time with the SPANK plugin, see
# docs/BENCHMARKS.md) runs on the local test cluster, so `make bench` needs
# root, like `make test`.
# The many-agent harness (BenchmarkAgentScale; docs/BENCHMARKS.md, "Many
# agents", and docs/SCALE.md) runs once per size, niced: SCALE_N agents in
# one process share the machine's cores with whatever else runs (about a
# minute for 16,64 on two cores; 128 takes minutes and 33,000 descriptors).
SCALE_N ?= 16,64
bench: all
	@echo "make bench on: $$(lscpu | sed -n 's/^Model name: *//p' | head -1), $$(nproc) cores, $$(uname -r), $$($(GO) version | cut -d' ' -f3), load $$(cut -d' ' -f1-3 /proc/loadavg)"
	$(GO) test -timeout 60m -run '^$$' -bench . -skip '^BenchmarkAgentScale$$' -benchtime 3x ./...
	REFT_SCALE_N=$(SCALE_N) nice -n 10 $(GO) test -timeout 30m -run '^$$' -bench '^BenchmarkAgentScale$$' -benchtime 1x ./agent/
	@$(WITH_CLUSTER); \
	$(GO) test -count=1 -tags e2e -timeout 30m -run '^$$' -bench 'StepLaunch|LoggingOverhead' -benchtime 1x -v ./tests/e2e/
	@$(BENCH_GOODPUT_RUN)
	@$(BENCH_GEMINI)

# Goodput against the status quo (issue 21; docs/BENCHMARKS.md): the same
# reft-train run and the same two node kills, once with file checkpoints
# every N steps (N the Young/Daly optimum for the measured checkpoint cost)
# and Slurm's requeue, once under reft run with --reft=arc and two spares;
# prints each arm's goodput and the ratio reft / status quo (x_goodput).
# For reft-train and for PyTorch (examples/torch_ddp.py), about 11 minutes
# each; BENCH_GOODPUT=BenchmarkGoodput/go (or /torch) runs one.
# BENCH_GOODPUT_LENGTH (the failure-free run, 100s), BENCH_GOODPUT_KILLS
# (when, as fractions of the steps: 0.3,0.65), BENCH_GOODPUT_GO_FLAGS and
# BENCH_GOODPUT_TORCH_FLAGS (the trainers') tune it.
BENCH_GOODPUT ?= ^BenchmarkGoodput$$
BENCH_GOODPUT_RUN = $(WITH_CLUSTER); \
	$(GO) test -count=1 -tags e2e -timeout 60m -run '^$$' -bench '$(BENCH_GOODPUT)' -benchtime 1x -v ./tests/e2e/
bench-goodput: all
	@echo "make bench-goodput on: $$(lscpu | sed -n 's/^Model name: *//p' | head -1), $$(nproc) cores, $$(uname -r), load $$(cut -d' ' -f1-3 /proc/loadavg)"
	@$(BENCH_GOODPUT_RUN)

# GEMINI's interference benchmark (issue 19; docs/BENCHMARKS.md): on a --net
# cluster with n1-n4's links capped by tc, reft-train's step time with
# background replication unscheduled, paused and scheduled into idle spans,
# against --reft=off, paired in rotated rounds; the ranks model a GPU host
# (reft-train --comm-wait: no polling CPU in their collectives).
# BENCH_GEMINI_RATE (200mbit), BENCH_GEMINI_ROUNDS (5) and
# BENCH_GEMINI_FLAGS (reft-train's) tune it; about 30 minutes.
BENCH_GEMINI = $(WITH_NET_CLUSTER); \
	$(GO) test -count=1 -tags 'e2e e2enet' -timeout 60m -run '^$$' -bench ReplicationInterference -benchtime 1x -v ./tests/e2e/
bench-gemini: all
	@echo "make bench-gemini on: $$(lscpu | sed -n 's/^Model name: *//p' | head -1), $$(nproc) cores, $$(uname -r), load $$(cut -d' ' -f1-3 /proc/loadavg)"
	@$(BENCH_GEMINI)

# The shipped plugstack line and reft.toml name /usr/local and /etc: install
# rewrites them for PREFIX and SYSCONFDIR (DESTDIR is only where the files
# land, not a path they name). Existing configuration files are kept.
INSTALL_SED := -e 's|/usr/local/lib/slurm/spank_reft.so|$(PREFIX)/lib/slurm/spank_reft.so|' \
	-e 's|config=/etc/reft/reft.toml|config=$(SYSCONFDIR)/reft/reft.toml|'
ifneq ($(PREFIX),/usr/local)
INSTALL_SED += -e 's|^\# binary = "/usr/local/bin/reft-agent"|binary = "$(PREFIX)/bin/reft-agent" \# set by make install PREFIX=$(PREFIX)|'
endif

install: all
	install -d $(DESTDIR)$(PREFIX)/bin $(DESTDIR)$(SYSCONFDIR)/reft
	install -m 0755 $(BUILD)/reft $(BUILD)/reft-agent $(DESTDIR)$(PREFIX)/bin/
	sed $(INSTALL_SED) etc/reft.toml >$(BUILD)/reft.toml.install
	sed $(INSTALL_SED) etc/plugstack.conf.d/reft.conf >$(BUILD)/reft.conf.install
	test -e $(DESTDIR)$(SYSCONFDIR)/reft/reft.toml || install -m 0644 $(BUILD)/reft.toml.install $(DESTDIR)$(SYSCONFDIR)/reft/reft.toml
	install -d $(DESTDIR)$(PREFIX)/lib/slurm $(DESTDIR)$(SYSCONFDIR)/slurm/plugstack.conf.d
	install -m 0755 $(BUILD)/spank_reft.so $(BUILD)/libreft_spank.so $(DESTDIR)$(PREFIX)/lib/slurm/
	test -e $(DESTDIR)$(SYSCONFDIR)/slurm/plugstack.conf.d/reft.conf || install -m 0644 $(BUILD)/reft.conf.install $(DESTDIR)$(SYSCONFDIR)/slurm/plugstack.conf.d/reft.conf
	# reft's root-owned directories at every boot (docs/SECURITY.md); created
	# now too when installing onto this machine.
	install -d $(DESTDIR)$(SYSCONFDIR)/tmpfiles.d
	sed 's|^d /run/reft/.plugin |d $(REFT_STATE_DIR) |' etc/tmpfiles.d/reft.conf >$(BUILD)/tmpfiles.conf.install
	test -e $(DESTDIR)$(SYSCONFDIR)/tmpfiles.d/reft.conf || install -m 0644 $(BUILD)/tmpfiles.conf.install $(DESTDIR)$(SYSCONFDIR)/tmpfiles.d/reft.conf
	if [ -z "$(DESTDIR)" ] && command -v systemd-tmpfiles >/dev/null; then \
		systemd-tmpfiles --create $(SYSCONFDIR)/tmpfiles.d/reft.conf || \
		echo "make install: systemd-tmpfiles --create failed; the plugin creates its directories at slurmd start"; fi

clean:
	rm -rf $(BUILD)
