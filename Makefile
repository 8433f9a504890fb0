# Accessory notification relay. `make run` and `make test` are the two commands a newcomer needs.
SHELL := /bin/bash
SWIFT ?= swift
CONFIG ?= debug
SWIFT_FLAGS ?=
PREFIX ?= /usr/local
DESTDIR ?=

# Everything the build, the tests and the benchmarks need from Debian 12 apt.
APT_PACKAGES := libssl-dev libnghttp2-dev libsqlite3-dev libuv1-dev \
	libsystemd-dev pkg-config openssl curl sqlite3 nghttp2-client nghttp2-server \
	python3 python3-venv systemd postgresql libpq-dev libcurl4-openssl-dev

BENCH_APT_PACKAGES := wrk nginx-light hyperfine valgrind redis-server redis-tools

# `make deb`: dpkg-shlibdeps (dpkg-dev), lintian, help2man (the manual pages); debootstrap for
# `make deb-install-test`.
DEB_APT_PACKAGES := dpkg-dev lintian help2man debootstrap

.PHONY: all deps bench-deps deb-deps build-info build release deb deb-check deb-install-test test bench bench-kex run fuzz soak soak-http reliability clean install

all: build

# The package version (one place: Sources/BuildInfo/BuildInfo.swift) and the commit every build
# target records first (scripts/build-info.sh; `--version`, relay_build_info). A plain
# `swift build` works too and reports the last recorded commit, or "unknown" in a fresh clone.
VERSION := $(shell sed -n 's/^ *public static let version = "\(.*\)"$$/\1/p' Sources/BuildInfo/BuildInfo.swift)

build-info:
	@scripts/build-info.sh

# Idempotent: installs only what is missing. Needs root (or sudo) on a fresh Debian 12.
deps:
	@scripts/apt-install.sh $(APT_PACKAGES)

bench-deps:
	@scripts/apt-install.sh $(BENCH_APT_PACKAGES)

deb-deps:
	@scripts/apt-install.sh $(DEB_APT_PACKAGES)

build: build-info
	$(SWIFT) build -c $(CONFIG) $(SWIFT_FLAGS)

release: build-info
	$(SWIFT) build -c release $(SWIFT_FLAGS)

# The Debian package build-deb/accessory-relay_<version>-<revision>_<arch>.deb (scripts/build-deb.sh,
# docs/operations.md "Debian package"): release binaries with the Swift runtime linked statically
# (--static-swift-stdlib; its own build directory, so it never mixes with `make release`),
# Depends: from dpkg-shlibdeps, checked by scripts/check-deb.sh (file list, Depends:, lintian).
DEB_REVISION ?= 1
DEB_BUILD_PATH ?= .build-static
# -z relro -z now: full RELRO (the GOT read-only after start), as Debian's hardening flags give C.
DEB_SWIFT_FLAGS = -c release --static-swift-stdlib -Xlinker -z -Xlinker relro -Xlinker -z -Xlinker now \
	--build-path $(DEB_BUILD_PATH) $(SWIFT_FLAGS)
DEB_FILE = build-deb/accessory-relay_$(VERSION)-$(DEB_REVISION)_$(shell dpkg --print-architecture).deb
deb: deps deb-deps build-info
	$(SWIFT) build $(DEB_SWIFT_FLAGS) --product relay-server
	$(SWIFT) build $(DEB_SWIFT_FLAGS) --product relayctl
	$(SWIFT) build $(DEB_SWIFT_FLAGS) --product mock-apns
	BUILT="$$($(SWIFT) build $(DEB_SWIFT_FLAGS) --show-bin-path)" VERSION=$(VERSION) DEB_REVISION=$(DEB_REVISION) scripts/build-deb.sh

# Checks the package `make deb` built (a few seconds; no build).
deb-check: deb-deps
	scripts/check-deb.sh $(DEB_FILE)

# Installs the built package into a throwaway Debian 12 root with apt and drives install, a relay
# run as the service user, upgrade, remove and purge (scripts/deb-install-test.sh; root and
# deb.debian.org needed, about a minute; not part of `make test`).
deb-install-test: deb-deps
	scripts/deb-install-test.sh $(DEB_FILE)

# The default suite: unit tests plus integration tests driving the real binaries on loopback.
# scripts/pg-test.sh starts a throwaway PostgreSQL (temp dir, loopback port) for the PostgreSQL
# store tests, sets RELAY_TEST_PG_URL, and stops it afterwards even when tests fail.
test: deps build-info
	$(SWIFT) build $(SWIFT_FLAGS) --build-tests
	scripts/pg-test.sh run -- $(SWIFT) test $(SWIFT_FLAGS) --skip-build --parallel
	SWIFT_FLAGS="$(SWIFT_FLAGS)" scripts/kex-crosscheck.sh
	SWIFT_FLAGS="$(SWIFT_FLAGS)" scripts/openapi-check.sh
	FUZZ_BUILD_ONLY=1 scripts/fuzz.sh
	@# The Debian package, when `make deb` built one of this version (its release build is too slow
	@# for every test run; the check takes seconds).
	@if [ -f $(DEB_FILE) ]; then $(MAKE) --no-print-directory deb-check; else echo "deb-check: skipped ($(DEB_FILE) not built; make deb)"; fi

bench: deps bench-deps release
	scripts/bench.sh

# KeyExchange against Python cryptography: X-Wing keygen/encaps/decaps and HPKE export per second,
# as ratios (scripts/bench-kex.sh). Not part of `make bench` or the test suite.
bench-kex: deps
	scripts/bench-kex.sh

clean:
	$(SWIFT) package clean

# Installs binaries, the systemd unit, the sysusers entry, the example config under
# $(DESTDIR)/etc/accessory-relay/, docs and the state dir (deploy/install.sh; docs/operations.md).
# BUILT=<dir> installs already built binaries instead of building release ones first.
BUILT ?=
install: build-info
ifeq ($(BUILT),)
	$(SWIFT) build -c release $(SWIFT_FLAGS) --product relay-server
	$(SWIFT) build -c release $(SWIFT_FLAGS) --product relayctl
	PREFIX="$(PREFIX)" DESTDIR="$(DESTDIR)" BUILT="$$($(SWIFT) build -c release $(SWIFT_FLAGS) --show-bin-path)" deploy/install.sh
else
	PREFIX="$(PREFIX)" DESTDIR="$(DESTDIR)" BUILT="$(BUILT)" deploy/install.sh
endif

# The newcomer's first command: release build, mock APNs + relay-server on loopback with demo
# keys and a demo credential in .run/ (scripts/run.sh). Ctrl-C stops both.
run: deps
	scripts/run.sh

# The kill -9 durability test in a longer loop (RELAY_SOAK_ROUNDS rounds, default 20).
soak: deps build-info
	$(SWIFT) build $(SWIFT_FLAGS) --build-tests
	RELAY_SOAK_ROUNDS=$${RELAY_SOAK_ROUNDS:-20} $(SWIFT) test $(SWIFT_FLAGS) --skip-build --filter RelayCrashTests

# Random walks over HTTP connection states (ServerInputSoakTests): HTTP_SOAK_ROUNDS rounds
# (default 300, ~2 min; make test runs 12) with a fresh seed, printed for replay (HTTP_SOAK_SEED).
soak-http: deps build-info
	$(SWIFT) build $(SWIFT_FLAGS) --build-tests
	HTTP_SOAK_ROUNDS=$${HTTP_SOAK_ROUNDS:-300} $(SWIFT) test $(SWIFT_FLAGS) --skip-build --filter ServerInputSoakTests

# Crash (kill -9), fault-matrix, storage-fault and bad-input runs against release binaries
# (scripts/reliability.sh, docs/reliability.md). RELIABILITY_ROUNDS kill -9 rounds (default 20).
# Stops by itself and leaves no processes behind; results are spliced into docs/reliability.md.
# BACKEND=postgres: three relay-server nodes on a throwaway PostgreSQL cluster instead (kill -9
# of a node per round, pg_ctl restart -m fast and -m immediate, the database stopped for 30 s
# and stalled for 20 s; about 3 minutes; docs/reliability.md "PostgreSQL").
BACKEND ?= sqlite
reliability: deps
	BACKEND=$(BACKEND) RELIABILITY_ROUNDS=$${RELIABILITY_ROUNDS:-20} scripts/reliability.sh

# libFuzzer targets under Fuzz/ (not in the default suite): FUZZ_SECONDS per target.
FUZZ_SECONDS ?= 60
fuzz:
	FUZZ_SECONDS=$(FUZZ_SECONDS) scripts/fuzz.sh
