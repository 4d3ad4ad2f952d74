# loopvol — make help lists the targets.
SHELL := /bin/bash
GO ?= go
# Every go build, vet and test here that is not -race runs with the
# settings the images' static binaries and hack/tools/build.sh's tools are
# built with: CGO_ENABLED=0 and -trimpath. Packages compiled with other
# settings are other build cache entries; with one set of settings, and one
# version of every shared module (hack/alignmods), a package of the client
# stack (client-go, gRPC, …) compiles once for the tools, the binaries, vet
# and the tests of every module (a cold make test compiled it five times).
GOSTATIC_ENV := CGO_ENABLED=0 GOFLAGS="-trimpath $(GOFLAGS)"
GOSTATIC := $(GOSTATIC_ENV) $(GO)
BIN := $(CURDIR)/bin
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
LDFLAGS := -X main.version=$(VERSION)
RUN := $(CURDIR)/_run
# Packages of `make unit`: every package but the suites under test/ (they
# need the built binaries) and those whose tests start the control plane
# (ENVTEST_PKGS: bin/kube-apiserver and bin/etcd, `make tools`).
ENVTEST_PKGS := ./internal/harness/testenv/ ./internal/harness/cluster/
UNIT_PKGS := $(shell $(GO) list ./... | grep -v -e /test/ -e /internal/harness/testenv -e /internal/harness/cluster)

.PHONY: help build kubectl-plugin test-krew krew-release tools all-tools run test unit test-fmt test-vet test-logcheck test-mods test-go test-unit test-envtest test-sanity test-e2e bench clean

help: ##@ Show this help.
	@awk 'BEGIN {FS = ":.*##@ "} /^[a-zA-Z0-9_-]+:.*##@ / {printf "  %-19s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

build: kubectl-plugin ##@ Build bin/driver, bin/attacher and bin/kubectl-loopvol.
	@echo "### build"
	$(GOSTATIC) build -ldflags "$(LDFLAGS)" -o $(BIN)/driver ./cmd/driver
	$(GOSTATIC) build -ldflags "$(LDFLAGS)" -o $(BIN)/attacher ./cmd/attacher

# krew itself, for test-krew: the version whose manifest format
# deploy/krew/loopvol.yaml is written in.
KREW_VERSION := v0.4.3

test-krew: ##@ Make the release's archive of this machine's platform and its manifest (hack/krew/release.sh, _output/krew), install it with krew into a krew root of its own, and run it.
	@echo "### test-krew"
	@[ -x $(BIN)/krew ] || GOBIN=$(BIN) $(GOSTATIC) install sigs.k8s.io/krew/cmd/krew@$(KREW_VERSION)
	hack/krew/install-test.sh $(BIN) $(CURDIR)/_output/krew $(PLUGIN_VERSION)

# The version krew-release publishes (and test-krew installs):
# deploy/krew/loopvol.yaml's unless given.
PLUGIN_VERSION ?= $(shell sed -n 's/^  version: //p' deploy/krew/loopvol.yaml)

krew-release: ##@ The krew release of kubectl-loopvol: linux amd64 and arm64 archives and the manifest with their sha256 (_output/release; PLUGIN_VERSION=vX.Y.Z).
	@echo "### krew-release"
	hack/krew/release.sh $(CURDIR)/_output/release $(PLUGIN_VERSION)

kubectl-plugin: ##@ Build bin/kubectl-loopvol, the kubectl plugin (put it on PATH: kubectl loopvol; docs/kubectl-plugin.md).
	$(GOSTATIC) build -ldflags "$(LDFLAGS) -s -w" -o $(BIN)/kubectl-loopvol ./cmd/kubectl-loopvol

tools: ##@ Build bin/kube-apiserver and bin/etcd once (the first build takes ~10-15 minutes; cached after).
	@echo "### tools"
	@hack/tools/build.sh $(BIN)

all-tools: ##@ Build every tool make test runs (make tools, cluster-tools and e2e-k8s-tools in one go: ~25-30 minutes cold, cached).
	@echo "### all-tools"
	@hack/tools/build.sh $(BIN) cluster e2e-k8s

run: build ##@ Start the driver (all services) on pool ./_run/pool, socket ./_run/csi.sock.
	@mkdir -p $(RUN)/pool $(RUN)/kubelet
	@echo "loopvol driver: socket unix://$(RUN)/csi.sock, pool default=$(RUN)/pool, kubelet dir $(RUN)/kubelet, metrics http://127.0.0.1:9808/metrics"
	@echo "try: csc or grpcurl against unix://$(RUN)/csi.sock (Ctrl-C stops it)"
	$(BIN)/driver --mode=all --endpoint=unix://$(RUN)/csi.sock --pool=default=$(RUN)/pool \
		--kubelet-dir=$(RUN)/kubelet --node-id=$$(hostname) --http-endpoint=127.0.0.1:9808 --v=2

# How make test spends a cold machine's two cores (docs/development.md
# "CI's budget"). The tools' build (hack/tools/build.sh, half an hour of CPU
# cold, a second warm) and test-unit (the -race build, which shares no
# compiled package with anything else) run first, side by side. When the
# tools are built, test-images (one of its tests reads the e2e suite's image
# list from k8s.io/kubernetes, which the tools' build fetches) and every
# binary and image the suites run are built once; then three streams run at
# once, each mostly waiting on kubelet, pods or disks:
#   - the one-node clusters: test-cluster, then test-e2e-k8s;
#   - beside them (bin/beside.log): test-envtest and test-e2e (a control
#     plane of their own on loopback), then test-multinode (a cluster of
#     nodes: internal/harness/cluster runs one of each kind at once, each
#     in a network namespace of its own, and never two of a kind);
#   - the checks (bin/checks.log): vet, logcheck, the modules' alignment,
#     csi-sanity, monitoring, Helm and krew. They start only once the tools
#     are built because they compile the same client stack at the same
#     settings: after the tools they find it in the build cache (GOSTATIC,
#     hack/alignmods), beside them they would compile it a second time.
# Warm, the tools take a second, so the clusters start within two minutes
# and everything else fills the cores they leave idle. A background part's
# log is printed when it ends. The suites of a stream are independent: one
# failing, the next still runs (--keep-going), so that one run shows every
# failure. PREBUILT=1 keeps the streams from rebuilding what another is
# running or loading.
TEST_FIRST := test-fmt test-unit
TEST_CHECKS := test-vet test-logcheck test-mods test-sanity test-monitoring test-helm test-krew
TEST_ONE_NODE := test-cluster test-e2e-k8s
TEST_BESIDE := test-envtest test-e2e test-multinode

# PREBUILT=1 runs a test target without building what it runs first: make
# test builds it once, before the streams run tests side by side (none may
# write a binary or an image another is running or loading).
PREBUILT ?=
prereq = $(if $(PREBUILT),,$(1))

test: ##@ Run every check and test (root: real loop devices, mounts and the real cluster); the tools build meanwhile (logs: bin/tools.log, bin/checks.log, bin/beside.log).
	@echo "### test: hack/tools/build.sh builds the tools (bin/tools.log) beside $(TEST_FIRST) (bin/checks.log)"
	@mkdir -p $(BIN); rm -f $(BIN)/.test-built; bg=(); \
	stop() { echo failed >$(BIN)/.test-built; for p in "$${bg[@]}"; do kill -TERM -- -$$p 2>/dev/null; wait $$p; done; \
		echo "### test: stopped; bin/checks.log so far:"; cat $(BIN)/checks.log; exit 1; }; \
	trap stop INT TERM; \
	setsid hack/tools/build.sh $(BIN) cluster e2e-k8s >$(BIN)/tools.log 2>&1 & tools=$$!; \
	parent=$$$$ setsid bash -c '$(MAKE) --no-print-directory --keep-going $(TEST_FIRST); rc=$$?; \
		until [ -s $(BIN)/.test-built ]; do kill -0 $$parent 2>/dev/null || exit 1; sleep 2; done; \
		[ "$$(cat $(BIN)/.test-built)" = built ] || exit 1; \
		$(MAKE) --no-print-directory --keep-going PREBUILT=1 $(TEST_CHECKS) || rc=1; exit $$rc' >$(BIN)/checks.log 2>&1 & checks=$$!; \
	bg=($$tools $$checks); \
	wait $$tools; rc=$$?; cat $(BIN)/tools.log; [ $$rc -eq 0 ] || stop; \
	$(MAKE) --no-print-directory test-images build e2e-k8s-images || stop; \
	echo built >$(BIN)/.test-built; \
	echo "### test: $(TEST_BESIDE) (bin/beside.log) and $(TEST_CHECKS) (bin/checks.log) beside $(TEST_ONE_NODE)"; \
	setsid $(MAKE) --no-print-directory --keep-going PREBUILT=1 $(TEST_BESIDE) >$(BIN)/beside.log 2>&1 & beside=$$!; bg=($$checks $$beside); \
	$(MAKE) --no-print-directory --keep-going PREBUILT=1 $(TEST_ONE_NODE); rc=$$?; \
	wait $$beside; brc=$$?; echo "### test: $(TEST_BESIDE) (bin/beside.log)"; cat $(BIN)/beside.log; \
	wait $$checks; crc=$$?; bg=(); echo "### test: $(TEST_FIRST) $(TEST_CHECKS) (bin/checks.log)"; cat $(BIN)/checks.log; \
	for r in $$rc $$brc $$crc; do [ $$r -eq 0 ] || exit $$r; done

unit: test-unit ##@ The fast developer loop: every unit and real-device test that needs no tool (no kube-apiserver, -race).

test-fmt: ##@ gofmt -l of every Go file git tracks (hack/tools' aside).
	@echo "### test-fmt"
	@out=$$(gofmt -l $$(git ls-files '*.go' | grep -v '^hack/tools/')); if [ -n "$$out" ]; then echo "not gofmt'ed:"; echo "$$out"; exit 1; fi

test-vet: ##@ go vet ./...
	@echo "### test-vet"
	$(GOSTATIC) vet ./...

LOGCHECK_VERSION := v0.11.0
$(BIN)/logcheck:
	GOBIN=$(BIN) $(GOSTATIC) install sigs.k8s.io/logtools/logcheck@$(LOGCHECK_VERSION)

test-logcheck: $(BIN)/logcheck ##@ Structured, contextual logging only (klog logcheck).
	@echo "### test-logcheck"
	$(GOSTATIC_ENV) $(BIN)/logcheck -check-contextual -check-structured -config hack/logcheck.conf ./...

test-mods: ##@ The modules make test builds side by side share every common module at one version (hack/alignmods; `go run ./hack/alignmods -w` aligns them).
	@echo "### test-mods"
	$(GOSTATIC) run ./hack/alignmods

test-go: test-unit test-envtest ##@ Unit tests and real-device tests of every package (-race): test-unit, then test-envtest.

test-unit: ##@ The packages' tests that need no tool: pkg/, cmd/, internal/kube … (-race; root for the real-device ones).
	@echo "### test-unit"
	$(GO) test -race -count=1 $(UNIT_PKGS)

test-envtest: $(call prereq,tools) ##@ The packages' tests that start the control plane: internal/harness/testenv, internal/harness/cluster (-race).
	@echo "### test-envtest"
	$(GO) test -race -count=1 $(ENVTEST_PKGS)

test-sanity: $(call prereq,build) ##@ csi-sanity and the driver scenario tests against the real driver binary (root: loop devices and mounts).
	@echo "### test-sanity"
	$(GOSTATIC) test -count=1 -timeout 30m -v ./test/sanity/ ./test/driver/ 2>&1 | tee $(BIN)/sanity.log | grep -E '^(=== RUN|--- |PASS|FAIL|ok|sanity:)|Ran [0-9]+ of' ; exit $${PIPESTATUS[0]}

test-e2e: $(call prereq,build tools) ##@ Real binaries against a real kube-apiserver and etcd.
	@echo "### test-e2e"
	$(GOSTATIC) test -count=1 -timeout 40m ./test/e2e/

bench: build tools ##@ Benchmarks that print figures (see docs/benchmarks.md).
	@command -v fio >/dev/null || apt-get install -y fio # BenchmarkFio (Debian's package)
	$(GOSTATIC) test -run '^$$' -bench . -benchtime 1x -timeout 60m -v ./test/bench/

clean: ##@ Remove built binaries (not the tools cache) and _run.
	rm -rf $(BIN)/driver $(BIN)/attacher $(RUN)

# Images (docs/images.md). `images` builds them without Docker, from Debian
# packages (apt) and the static binaries; `image` builds the same with Docker.
STATIC := $(BIN)/static
IMAGE_REPO ?= localhost/loopvol
IMAGE_TAG ?= $(VERSION)
IMAGES_OUT := $(CURDIR)/_output/images
IMAGES_CACHE ?= $(HOME)/.cache/loopvol
IMAGES_CREATED := $(shell git log -1 --format=%ct 2>/dev/null || echo 0)
DOCKER ?= docker

.PHONY: static images image test-images

static: ##@ Static binaries for the images: bin/static/driver, bin/static/attacher (CGO_ENABLED=0).
	@echo "### static"
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags "$(LDFLAGS)" -o $(STATIC)/driver ./cmd/driver
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags "$(LDFLAGS)" -o $(STATIC)/attacher ./cmd/attacher

images: static ##@ OCI images without Docker: _output/images/<image>/ (layout) and <image>.tar (ctr images import).
	@echo "### images"
	$(GOSTATIC) -C hack/images build -o $(BIN)/images .
	$(BIN)/images -bin $(STATIC) -out $(IMAGES_OUT) -cache $(IMAGES_CACHE) -repo $(IMAGE_REPO) \
		-tag $(IMAGE_TAG) -tag dev -created $(IMAGES_CREATED)

image: ##@ The same images with Docker (where a Docker engine runs): loopvol-node, loopvol-controller.
	@echo "### image"
	for i in loopvol-node loopvol-controller; do \
		$(DOCKER) build --build-arg VERSION=$(VERSION) --target $$i \
			-t $(IMAGE_REPO)/$$i:$(IMAGE_TAG) -t $(IMAGE_REPO)/$$i:dev . || exit 1; \
	done

test-images: ##@ hack/images' tests: both image recipes agree; the node image runs what the node plugin runs (root: chroot, loop devices).
	@echo "### test-images"
	$(GOSTATIC) -C hack/images vet .
	$(GOSTATIC) -C hack/images test -count=1 .

# deploy/monitoring (docs/operations.md): the rules' unit tests, the
# PrometheusRule equal to rules.yaml, and every metric a rule or panel names
# exported; hack/monitoring is a module of its own (Prometheus' packages).
.PHONY: test-monitoring
test-monitoring: ##@ deploy/monitoring: the alert rules' unit tests (promtool's format), PrometheusRule = rules.yaml, rule and dashboard metrics exported.
	@echo "### test-monitoring"
	$(GOSTATIC) -C hack/monitoring vet .
	$(GOSTATIC) -C hack/monitoring test -count=1 .

# deploy/helm/loopvol (docs/helm.md): the chart rendered with Helm's SDK for
# each overlay's ci values and compared object by object with its kustomize
# build; templates/generated current with the kustomize sources; lint and
# schema. hack/helm is a module of its own (Helm v4's packages).
.PHONY: test-helm
test-helm: ##@ deploy/helm: the chart equal to kustomize build of each overlay, templates/generated current, lint, schema.
	@echo "### test-helm"
	$(GOSTATIC) -C hack/helm vet ./...
	$(GOSTATIC) -C hack/helm test -count=1 ./...

# The one-node cluster (docs/cluster.md): kube-controller-manager,
# kube-scheduler, kubelet, kubectl, containerd, runc, csi-provisioner,
# csi-attacher, external-snapshotter and pause beside kube-apiserver and etcd;
# their images.
CLUSTER_DIR ?= $(RUN)/cluster

.PHONY: cluster-tools cluster-images demo test-cluster test-multinode bench-node-failure

cluster-tools: ##@ Build everything the one-node cluster and its tests run into bin/, external-snapshotter too (once; cached in ~/.cache/loopvol/tools).
	@echo "### cluster-tools"
	@hack/tools/build.sh $(BIN) cluster

cluster-images: static cluster-tools ##@ make images plus the cluster's tool images: csi-provisioner, csi-attacher, csi-snapshotter, snapshot-controller, pause, busybox (OCI archives for containerd).
	@echo "### cluster-images"
	$(GOSTATIC) -C hack/images build -o $(BIN)/images .
	$(BIN)/images -bin $(STATIC) -tools $(BIN) -out $(IMAGES_OUT) -cache $(IMAGES_CACHE) -repo $(IMAGE_REPO) \
		-tag $(IMAGE_TAG) -tag dev -created $(IMAGES_CREATED)

test-cluster: $(call prereq,cluster-images) ##@ Tests on a real one-node cluster with loopvol deployed by kustomize (root; docs/cluster.md).
	@echo "### test-cluster"
	$(GOSTATIC) test -count=1 -timeout 30m -v ./test/cluster/ 2>&1 | tee $(BIN)/cluster.log | grep -E '^(=== RUN|--- |PASS|FAIL|ok)|cluster_test.go|cluster: (up|down)' ; exit $${PIPESTATUS[0]}

test-multinode: $(call prereq,cluster-images) ##@ Tests on a real cluster of two nodes on this machine: a shared pool, pools per node, fencing, moves, drain, failover (root; docs/cluster.md).
	@echo "### test-multinode"
	$(GOSTATIC) test -count=1 -timeout 30m -v ./test/multinode/ 2>&1 | tee $(BIN)/multinode.log | grep -E '^(=== RUN|--- |PASS|FAIL|ok)|_test.go|cluster: (up|down)' ; exit $${PIPESTATUS[0]}

bench-node-failure: cluster-images ##@ The baseline of fencing (issue 26): a node frozen or cut off on two nodes without fencing, 6 minutes watched per case (~21 min); then fencing with an operator's early taint on a reflink pool (~6 min) (docs/benchmarks.md).
	@echo "### bench-node-failure"
	LOOPVOL_NODE_FAILURE_BASELINE=1 $(GOSTATIC) test -count=1 -timeout 60m -v -run '^TestNodeFailure(FencedEarlyTaint)?$$' ./test/multinode/ 2>&1 | tee $(BIN)/node-failure.log | grep -E '^(=== RUN|--- |PASS|FAIL|ok)|_test.go|cluster: (up|down)' ; exit $${PIPESTATUS[0]}

# What the demo runs, and no more: no csi-attacher, external-snapshotter or
# e2e suite tools or images, which only the tests use.
DEMO_TOOLS := etcd kube-apiserver kube-controller-manager kube-scheduler kubelet kubectl kube-proxy \
	containerd containerd-shim-runc-v2 ctr runc csi-provisioner pause
DEMO_IMAGES := loopvol-node,loopvol-controller,csi-provisioner,pause,busybox

# make demo NODES=2 OVERLAY=shared: the demo's cluster and overlay
# (hack/demo -nodes, -overlay).
NODES ?= 1
OVERLAY ?= local

demo: static kubectl-plugin ##@ A real cluster (NODES=1..8, default 1), loopvol deployed with kubectl apply -k (OVERLAY=local|shared|distributed), a PVC taken to a Pod and back (root). KEEP=1 keeps it up until Ctrl-C.
	@echo "### demo"
	@hack/tools/build.sh $(BIN) $(DEMO_TOOLS)
	$(GOSTATIC) -C hack/images build -o $(BIN)/images .
	$(BIN)/images -bin $(STATIC) -tools $(BIN) -out $(IMAGES_OUT) -cache $(IMAGES_CACHE) -repo $(IMAGE_REPO) \
		-tag $(IMAGE_TAG) -tag dev -created $(IMAGES_CREATED) -images $(DEMO_IMAGES)
	$(GOSTATIC) build -o $(BIN)/demo ./hack/demo
	$(BIN)/demo -repo $(CURDIR) -dir $(CLUSTER_DIR) -bin $(BIN) -images $(IMAGES_OUT) -nodes $(NODES) -overlay $(OVERLAY) $(if $(KEEP),-keep)

# The upstream Kubernetes storage e2e suite (docs/e2e-k8s.md): e2e.test
# v1.37.2, external-snapshotter v8.7.0 and the suite's test images on the
# one-node cluster in a network namespace of its own.
E2E_K8S_IMAGES := agnhost,nginx,glibc-dns-testing,hello-populator

.PHONY: e2e-k8s-tools e2e-k8s-images test-e2e-k8s test-e2e-k8s-rest test-e2e-k8s-two-nodes

e2e-k8s-tools: cluster-tools ##@ Build e2e.test, ginkgo, agnhost and hello-populator into bin/ (e2e.test ~10 minutes cold; cached).
	@echo "### e2e-k8s-tools"
	@hack/tools/build.sh $(BIN) e2e-k8s

e2e-k8s-images: cluster-images e2e-k8s-tools ##@ make cluster-images plus the suite's images (agnhost, nginx, glibc-dns-testing, hello-populator, busybox by the names it asks for).
	@echo "### e2e-k8s-images"
	$(BIN)/images -bin $(STATIC) -tools $(BIN) -out $(IMAGES_OUT) -cache $(IMAGES_CACHE) -repo $(IMAGE_REPO) \
		-tag $(IMAGE_TAG) -tag dev -created $(IMAGES_CREATED) -images $(E2E_K8S_IMAGES)

test-e2e-k8s: $(call prereq,e2e-k8s-images) ##@ The storage e2e suite's External.Storage specs but Serial, Disruptive and Slow, on a real cluster (root; E2E_K8S_FOCUS/E2E_K8S_SKIP narrow it).
	@echo "### test-e2e-k8s"
	$(GOSTATIC) test -count=1 -timeout 150m -v ./test/e2e-k8s/ 2>&1 | tee $(BIN)/e2e-k8s.log | grep -E '^(=== RUN|--- |PASS|FAIL|ok|e2e-k8s:)|e2e_test.go|nodessh_test.go|cluster: (up|down)|^ *\|' ; exit $${PIPESTATUS[0]}

# Not in make test: two more clusters and ~10 minutes, past the CI budget
# (docs/e2e-k8s.md "On two nodes").
test-e2e-k8s-two-nodes: e2e-k8s-images ##@ The suite's specs that need two nodes or two topologies, on two-node clusters: a shared pool, a pool per node (root).
	@echo "### test-e2e-k8s-two-nodes"
	E2E_K8S_NODES=2 $(GOSTATIC) test -count=1 -timeout 90m -v -run TestExternalStorageTwoNodes ./test/e2e-k8s/ 2>&1 | tee $(BIN)/e2e-k8s-two-nodes.log | grep -E '^(=== RUN|--- |PASS|FAIL|ok|e2e-k8s:)|e2e_test.go|twonodes_test.go|cluster: (up|down)|^ *\|' ; exit $${PIPESTATUS[0]}

test-e2e-k8s-rest: e2e-k8s-images ##@ The same suite's Serial, Disruptive and Slow External.Storage specs (root).
	@echo "### test-e2e-k8s-rest"
	E2E_K8S_SUITE=rest $(GOSTATIC) test -count=1 -timeout 300m -v ./test/e2e-k8s/ 2>&1 | tee $(BIN)/e2e-k8s-rest.log | grep -E '^(=== RUN|--- |PASS|FAIL|ok|e2e-k8s:)|e2e_test.go|nodessh_test.go|cluster: (up|down)|^ *\|' ; exit $${PIPESTATUS[0]}
