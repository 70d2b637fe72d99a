# make run     — build and start attestd on ./attestd.sqlite (127.0.0.1:8080)
# make test    — install missing system packages, build, run every test
# make install — the server's files under PREFIX (default /usr/local), DESTDIR for staging
# make deb     — attestd_VERSION_amd64.deb: what a server needs, the Swift runtime linked in
SHELL := /bin/bash
SWIFT ?= swift
# prometheus: promtool for the alert rules' tests; python3-venv: the cloud stubs' virtualenv;
# dpkg-dev: dpkg-shlibdeps, which names the package's dependencies (make deb).
DEB_PACKAGES := libssl-dev libsqlite3-dev libmicrohttpd-dev libcurl4-openssl-dev libpq-dev postgresql curl pkg-config openssl sqlite3 nginx-light chromium chromium-driver fonts-dejavu-core prometheus python3-venv dpkg-dev
DB ?= attestd.sqlite
ARGS ?=
VERSION := $(shell tr -d ' \t\r\n' < VERSION)

.PHONY: all build release run test deps migrations version venv fuzz fuzz-leaf fuzz-wire fuzz-assertion fuzz-receipt fuzz-eventstream fuzz-relay fuzz-all bench clean dist install deb deb-check

# swiftc -sanitize=fuzzer,address links with ld.gold, which warns once for each of the ASan
# runtime's local assembly stubs ("Cannot export local symbol '__asan_report_load1_asm'" and about
# 140 more per fuzzer): the toolchain's own runtime, nothing of ours. Exactly those lines are
# dropped from the fuzzers' link output; every other line, other warnings included, passes, and
# pipefail keeps swiftc's exit status.
ASAN_LINK_NOISE := sed -E "/^\/usr\/bin\/ld\.gold: warning: Cannot export local symbol '__asan_[A-Za-z0-9_]+'$$/d"

all: build

# Installs whatever Debian packages are missing: itself when root, otherwise prints the command.
# Services the packages bring (nginx, PostgreSQL) are not started: the tests start their own.
deps:
	@missing=""; for p in $(DEB_PACKAGES); do \
	  dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q "install ok installed" || missing="$$missing $$p"; \
	done; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ]; then \
	    echo "installing:$$missing"; \
	    policy=""; if [ ! -e /usr/sbin/policy-rc.d ]; then \
	      printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d && chmod +x /usr/sbin/policy-rc.d && policy=1; fi; \
	    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing); status=$$?; \
	    [ -n "$$policy" ] && rm -f /usr/sbin/policy-rc.d; \
	    [ $$status = 0 ] || exit 1; \
	  else \
	    echo "missing Debian packages; run: sudo apt-get install -y$$missing" >&2; exit 1; \
	  fi; \
	fi

# Migrations/*.sql are embedded into the binaries; the script rewrites the Swift file only on change.
migrations:
	@scripts/embed-migrations.sh

# VERSION and the commit (git rev-parse HEAD) into the headers `--version` prints; rewritten only on change.
version:
	@scripts/embed-version.sh

# The Python the cloud test stubs run on (Tests/Support/cloud-stubs: Bedrock and Vertex AI over
# TLS); the stamp keeps it a no-op until requirements.txt changes.
CLOUD_STUB_REQUIREMENTS := Tests/Support/cloud-stubs/requirements.txt
venv: .venv/.stamp

.venv/.stamp: $(CLOUD_STUB_REQUIREMENTS)
	python3 -m venv .venv && .venv/bin/pip install -q --disable-pip-version-check -r $(CLOUD_STUB_REQUIREMENTS)
	touch $@

# A debug build (.build/debug/), what the tests run.
build: deps migrations version
	$(SWIFT) build

# An optimised build for this machine (.build/release/): make run, the benchmarks. It loads the
# Swift runtime from the toolchain (/opt/swift/usr/lib/swift/linux); a server's binaries come from
# `make dist` instead.
release: deps migrations version
	$(SWIFT) build -c release

run: release
	./.build/release/attestd serve --db $(DB) $(ARGS)

# The suite takes about 6–7 minutes on a 2-core machine (the console's browser tests, two
# PostgreSQL clusters, the cloud stubs); the timeout turns a hang into a clear failure.
# The release attestctl is built too: a test checks that the operator's binary carries no private key.
test: deps migrations version venv
	@if [ -n "$$CI" ] && [ ! -d ../shared/fixtures/apple ]; then \
	  echo "CI: ../shared/fixtures/apple is missing; the real-device verification tests would be skipped" >&2; exit 1; fi
	$(SWIFT) build --build-tests
	$(SWIFT) build -c release --product attestctl
	timeout 1200 $(SWIFT) test --skip-build --no-parallel

# The binaries a server runs: optimised, with the Swift runtime linked in (--static-swift-stdlib),
# so they need only the Debian libraries they name. Their own build directory (.build/dist/), so
# that neither this nor `make release` undoes the other.
DIST_BIN := .build/dist/release
dist: deps migrations version
	set -o pipefail; for product in attestd attestctl; do \
	  $(SWIFT) build -c release --static-swift-stdlib --scratch-path .build/dist --product $$product 2>&1 | $(STATIC_LINK_NOISE) || exit 1; done

# Static Foundation (libFoundationEssentials.a) calls mktemp, and the linker says once that "the use
# of `mktemp' is dangerous": the toolchain's archive, nothing of ours. Exactly that line is dropped.
STATIC_LINK_NOISE := sed -E "/^[^ ]*\/swift_static\/linux\/lib[A-Za-z]+\.a\([^)]*\):.*: warning: the use of .mktemp. is dangerous, better use .mkstemp. or .mkdtemp.$$/d"

# make install [PREFIX=/usr/local] [DESTDIR=…]: the binaries, the systemd unit (its ExecStart
# pointed at PREFIX/bin), and the nginx, certbot and Prometheus files as examples under
# PREFIX/share/attestd. Creates no user and starts nothing (docs/deploying.md; the package does both but the starting).
PREFIX ?= /usr/local
DESTDIR ?=
UNITDIR ?= $(PREFIX)/lib/systemd/system
install: dist
	install -d $(DESTDIR)$(PREFIX)/bin $(DESTDIR)$(UNITDIR) $(DESTDIR)$(PREFIX)/share/attestd/nginx $(DESTDIR)$(PREFIX)/share/attestd/prometheus \
	  $(DESTDIR)$(PREFIX)/share/doc/attestd
	install -m 0755 $(DIST_BIN)/attestd $(DIST_BIN)/attestctl $(DESTDIR)$(PREFIX)/bin/
	sed 's|/usr/local/bin/attestd|$(PREFIX)/bin/attestd|' deploy/systemd/attestd.service > $(DESTDIR)$(UNITDIR)/attestd.service
	chmod 0644 $(DESTDIR)$(UNITDIR)/attestd.service
	install -m 0644 deploy/nginx/*.conf $(DESTDIR)$(PREFIX)/share/attestd/nginx/
	install -m 0644 deploy/prometheus/*.yml $(DESTDIR)$(PREFIX)/share/attestd/prometheus/
	install -m 0644 CHANGELOG.md docs/deploying.md $(DESTDIR)$(PREFIX)/share/doc/attestd/

# attestd_VERSION_amd64.deb in this directory: `make install PREFIX=/usr` staged, Depends from
# dpkg-shlibdeps, a postinst that creates the attestd user and its directories (the unit is
# installed, neither enabled nor started). scripts/deb-check.sh installs and removes it (CI, as root).
deb: dist
	scripts/make-deb.sh $(VERSION) $(DIST_BIN)

deb-check:
	scripts/deb-check.sh

# libFuzzer over the CBOR decoder: make fuzz RUNS=1000000 (seeds: fuzz-seeds/ plus, when
# present, the real attestation and assertion objects from ../shared and their iOS 27 / macOS 27
# extension maps, decoded into the scratch corpus only).
RUNS ?= 1000000
fuzz: deps
	mkdir -p .build/fuzz fuzz-corpus
	set -o pipefail; swiftc -O -sanitize=fuzzer,address -parse-as-library -module-name CBORFuzz \
	  Sources/CBOR/*.swift Fuzz/CBORFuzz/*.swift -o .build/fuzz/cbor-fuzz 2>&1 | $(ASAN_LINK_NOISE)
	-python3 scripts/fuzz-seeds.py cbor fuzz-corpus ../shared/fixtures/apple
	SWIFT_BACKTRACE=enable=no ./.build/fuzz/cbor-fuzz -runs=$(RUNS) -max_len=8192 -rss_limit_mb=6144 fuzz-corpus fuzz-seeds

# libFuzzer over the strict credential-certificate parser, seeded with the test authority's
# certificates and the real leaves from ../shared when present.
fuzz-leaf: deps
	mkdir -p .build/fuzz fuzz-corpus-leaf
	set -o pipefail; swiftc -O -sanitize=fuzzer,address -parse-as-library -module-name LeafFuzz -I Sources/COpenSSL \
	  Sources/AttestCrypto/*.swift Fuzz/LeafFuzz/*.swift -lcrypto -o .build/fuzz/leaf-fuzz 2>&1 | $(ASAN_LINK_NOISE)
	openssl x509 -in Fixtures/test-authority/intermediate.pem -outform der -out fuzz-corpus-leaf/intermediate.der
	-for f in ../shared/fixtures/apple/*.json; do \
	  python3 -c "import json,base64,sys; d=json.load(open(sys.argv[1])); o=base64.b64decode(d['attestation']['object']); i=o.find(b'\x59\x02'); n=int.from_bytes(o[i+1:i+3],'big'); sys.stdout.buffer.write(o[i+3:i+3+n])" "$$f" > fuzz-corpus-leaf/$$(basename $$f .json).der; done
	SWIFT_BACKTRACE=enable=no ./.build/fuzz/leaf-fuzz -runs=$(RUNS) -max_len=4096 -rss_limit_mb=6144 fuzz-corpus-leaf

# libFuzzer over the request bodies the device routes parse (form, base64, JSON shapes), seeded
# with fuzz-seeds-wire/.
fuzz-wire: deps
	mkdir -p .build/fuzz fuzz-corpus-wire
	set -o pipefail; swiftc -O -sanitize=fuzzer,address -parse-as-library -module-name WireFuzz \
	  Sources/AttestWire/*.swift Fuzz/WireFuzz/*.swift -o .build/fuzz/wire-fuzz 2>&1 | $(ASAN_LINK_NOISE)
	SWIFT_BACKTRACE=enable=no ./.build/fuzz/wire-fuzz -runs=$(RUNS) -max_len=4096 -rss_limit_mb=6144 fuzz-corpus-wire fuzz-seeds-wire

# libFuzzer over whole-assertion verification (CBOR, authenticator data, signature, RP ID,
# counter). The four modules are compiled as one; empty stand-in modules answer their imports.
fuzz-assertion: deps
	mkdir -p .build/fuzz/standins fuzz-corpus-assertion fuzz-seeds-assertion
	for m in CBOR AttestCrypto AttestWire; do echo > .build/fuzz/standins/$$m.swift; \
	  swiftc -parse-as-library -emit-module -module-name $$m .build/fuzz/standins/$$m.swift -o .build/fuzz/standins/$$m.swiftmodule; done
	set -o pipefail; swiftc -O -sanitize=fuzzer,address -parse-as-library -module-name AssertionFuzz -I .build/fuzz/standins -I Sources/COpenSSL \
	  Sources/CBOR/*.swift Sources/AttestCrypto/*.swift Sources/AttestWire/*.swift Sources/AppAttest/*.swift \
	  Fuzz/AssertionFuzz/*.swift -lcrypto -o .build/fuzz/assertion-fuzz 2>&1 | $(ASAN_LINK_NOISE)
	-python3 scripts/fuzz-seeds.py assertion fuzz-corpus-assertion ../shared/fixtures/apple
	ASSERTION_SEEDS=fuzz-seeds-assertion SWIFT_BACKTRACE=enable=no ./.build/fuzz/assertion-fuzz -runs=$(RUNS) -max_len=2048 -rss_limit_mb=6144 \
	  fuzz-corpus-assertion fuzz-seeds-assertion

# libFuzzer over receipts: the payload parser alone and the whole CMS read, seeded with every
# receipt in ../shared (the ATTEST ones in the attestations, the refreshed RECEIPT ones) and their payloads.
fuzz-receipt: deps
	mkdir -p .build/fuzz/standins fuzz-corpus-receipt
	for m in CBOR AttestCrypto AttestWire; do echo > .build/fuzz/standins/$$m.swift; \
	  swiftc -parse-as-library -emit-module -module-name $$m .build/fuzz/standins/$$m.swift -o .build/fuzz/standins/$$m.swiftmodule; done
	set -o pipefail; swiftc -O -sanitize=fuzzer,address -parse-as-library -module-name ReceiptFuzz -I .build/fuzz/standins -I Sources/COpenSSL \
	  Sources/CBOR/*.swift Sources/AttestCrypto/*.swift Sources/AttestWire/*.swift Sources/AppAttest/*.swift \
	  Fuzz/ReceiptFuzz/*.swift -lcrypto -o .build/fuzz/receipt-fuzz 2>&1 | $(ASAN_LINK_NOISE)
	-python3 scripts/fuzz-seeds.py receipt fuzz-corpus-receipt ../shared/fixtures/apple
	SWIFT_BACKTRACE=enable=no ./.build/fuzz/receipt-fuzz -runs=$(RUNS) -max_len=16384 -rss_limit_mb=6144 fuzz-corpus-receipt

# libFuzzer over the AWS event-stream decoder and the Bedrock stream translator: the files of
# Sources/CloudUpstreams that need no OpenSSL, with AttestWire's sources (an empty stand-in
# module satisfies `import AttestWire`), seeded with fuzz-seeds-eventstream/.
fuzz-eventstream: deps
	mkdir -p .build/fuzz/standins-eventstream fuzz-corpus-eventstream
	echo > .build/fuzz/standins-eventstream/AttestWire.swift
	swiftc -parse-as-library -emit-module -module-name AttestWire .build/fuzz/standins-eventstream/AttestWire.swift \
	  -o .build/fuzz/standins-eventstream/AttestWire.swiftmodule
	set -o pipefail; swiftc -O -sanitize=fuzzer,address -parse-as-library -module-name EventStreamFuzz -I .build/fuzz/standins-eventstream \
	  $(addprefix Sources/CloudUpstreams/,CRC32.swift EventStream.swift JSONScan.swift CloudErrors.swift BedrockStreamTranslator.swift) \
	  Sources/AttestWire/*.swift Fuzz/EventStreamFuzz/*.swift -o .build/fuzz/eventstream-fuzz 2>&1 | $(ASAN_LINK_NOISE)
	SWIFT_BACKTRACE=enable=no ./.build/fuzz/eventstream-fuzz -runs=$(RUNS) -max_len=4096 -rss_limit_mb=6144 fuzz-corpus-eventstream fuzz-seeds-eventstream

# libFuzzer over what the Messages relay reads and edits as bytes: the JSON member scan, each
# cloud's request edit, the policy's scan of a request body, usage from a JSON reply and from an
# SSE stream cut anywhere, and the token endpoints' answers. Sources/MessagesBody imports nothing;
# from Sources/CloudUpstreams, the files that import nothing (RELAY_FUZZ_CLOUD_FILES: a token
# endpoint's parser joins them). Seeded with fuzz-seeds-relay/.
RELAY_FUZZ_CLOUD_FILES := JSONScan.swift GoogleTokenResponse.swift CredentialReplies.swift
fuzz-relay: deps
	mkdir -p .build/fuzz fuzz-corpus-relay
	set -o pipefail; swiftc -O -sanitize=fuzzer,address -parse-as-library -module-name RelayFuzz \
	  Sources/MessagesBody/*.swift $(addprefix Sources/CloudUpstreams/,$(RELAY_FUZZ_CLOUD_FILES)) \
	  Fuzz/RelayFuzz/*.swift -o .build/fuzz/relay-fuzz 2>&1 | $(ASAN_LINK_NOISE)
	SWIFT_BACKTRACE=enable=no ./.build/fuzz/relay-fuzz -runs=$(RUNS) -max_len=4096 -rss_limit_mb=6144 fuzz-corpus-relay fuzz-seeds-relay

# Every fuzzer for a bounded count (CI: about 200,000 inputs each, a few minutes in all).
fuzz-all: fuzz fuzz-leaf fuzz-wire fuzz-assertion fuzz-receipt fuzz-eventstream fuzz-relay

bench: release
	./.build/release/attest-sim bench verify --seconds 5
	openssl speed -seconds 3 ecdsap384 ecdsap256 2>/dev/null | tail -3

clean:
	rm -rf .build
