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

# Debian 12 packages the project builds, tests and runs with.
DEB_PKGS := slurm-wlm slurmctld slurmd slurmdbd slurm-client munge mariadb-server \
	libslurm-dev libpmix-dev openmpi-bin libopenmpi-dev pkg-config gcc make \
	python3-torch python3-numpy iproute2 util-linux procps

BINARIES := $(BUILD)/reft $(BUILD)/reft-agent $(BUILD)/reft-mpi-smoke $(BUILD)/reft-pmix-probe $(BUILD)/reft-train
# The SPANK plugin: C shim + Go c-shared library, installed side by side.
BINARIES += $(BUILD)/spank_reft.so $(BUILD)/libreft_spank.so

.PHONY: all deps test unit e2e demo bench install clean
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

$(BUILD)/libreft_spank.so: FORCE | $(BUILD)
	$(GO) build $(GOFLAGS_B) -buildmode=c-shared -o $@ ./spank/plugin

$(BUILD)/spank_reft.so: spank/shim.c | $(BUILD)
	$(CC) -shared -fPIC -O2 -Wall -Wextra -Werror -o $@ spank/shim.c -ldl

FORCE:

# Idempotent: installs only what dpkg does not already report as installed.
deps:
	@missing=$$(for p in $(DEB_PKGS); do dpkg-query -W -f='$${Status}\n' $$p 2>/dev/null | grep -q '^install ok installed' || echo $$p; done); \
	if [ -n "$$missing" ]; then \
		echo "make deps: installing:" $$missing; \
		apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $$missing; \
	else echo "make deps: all $(words $(DEB_PKGS)) packages present"; fi

unit:
	$(GO) vet ./...
	$(GO) test -count=1 ./...
	cd client/python && $(PYTHON) -m unittest discover -s tests

# End-to-end tests on the local cluster. The cluster is brought up here and
# always taken down again, pass or fail. The cluster tool's own lifecycle test
# runs last: it calls `up` a second time, then `down`, and checks that nothing
# of the cluster is left.
e2e: all
	$(CLUSTER) up
	@rc=0; \
	$(GO) test -count=1 -tags e2e -timeout 30m -v ./tests/e2e/ || rc=$$?; \
	$(GO) test -count=1 -tags e2e -timeout 5m -run Munge -v ./agent/peer/ || rc=$$?; \
	( cd tests/cluster && $(GO) test -count=1 -tags e2e -timeout 10m -v . ) || rc=$$?; \
	$(CLUSTER) down || rc=$$?; \
	exit $$rc

test: unit e2e

demo: all
	tests/demo.sh

# The trainer overhead benchmark trains for minutes; on a busy machine the
# default 10-minute test timeout is not enough.
bench: all
	$(GO) test -timeout 60m -run '^$$' -bench . -benchtime 3x ./...

install: all
	install -d $(DESTDIR)$(PREFIX)/bin $(DESTDIR)$(SYSCONFDIR)/reft
	install -m 0755 $(BUILD)/reft $(BUILD)/reft-agent $(DESTDIR)$(PREFIX)/bin/
	test -e $(DESTDIR)$(SYSCONFDIR)/reft/reft.toml || install -m 0644 etc/reft.toml $(DESTDIR)$(SYSCONFDIR)/reft/reft.toml
	install -d $(DESTDIR)$(PREFIX)/lib/slurm $(DESTDIR)$(SYSCONFDIR)/slurm/plugstack.conf.d
	install -m 0755 $(BUILD)/spank_reft.so $(BUILD)/libreft_spank.so $(DESTDIR)$(PREFIX)/lib/slurm/
	test -e $(DESTDIR)$(SYSCONFDIR)/slurm/plugstack.conf.d/reft.conf || install -m 0644 etc/plugstack.conf.d/reft.conf $(DESTDIR)$(SYSCONFDIR)/slurm/plugstack.conf.d/reft.conf

clean:
	rm -rf $(BUILD)
