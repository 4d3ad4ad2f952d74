# syntax=docker/dockerfile:1
# loopvol's images, built with Docker: `make image`. `make images` builds the
# same images without Docker (hack/images, docs/images.md); its tests read
# this file and fail when the two recipes name different packages, files,
# users or entrypoints: change both together.

ARG GO_IMAGE=golang:1.26-bookworm
ARG DEBIAN_IMAGE=debian:bookworm-slim

# Static binaries, as `make static` builds them.
FROM --platform=$BUILDPLATFORM ${GO_IMAGE} AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN --mount=type=cache,target=/root/go/pkg/mod go mod download
COPY cmd/ cmd/
COPY internal/ internal/
COPY pkg/ pkg/
ARG VERSION=dev
ARG TARGETOS
ARG TARGETARCH
RUN --mount=type=cache,target=/root/go/pkg/mod --mount=type=cache,target=/root/.cache/go-build \
    CGO_ENABLED=0 GOOS=${TARGETOS} GOARCH=${TARGETARCH} \
    go build -trimpath -ldflags "-X main.version=${VERSION}" -o /out/driver ./cmd/driver && \
    CGO_ENABLED=0 GOOS=${TARGETOS} GOARCH=${TARGETARCH} \
    go build -trimpath -ldflags "-X main.version=${VERSION}" -o /out/attacher ./cmd/attacher

# The node plugin: the driver and what it runs to format, check, mount and
# grow filesystems (mount, umount, blkid, blockdev, fsck, mkfs.ext4,
# mkfs.xfs, e2fsck, resize2fs, xfs_growfs). Runs as root, privileged.
FROM ${DEBIAN_IMAGE} AS loopvol-node
# The links the Go recipe adds itself because the base image has them
# (e2fsck and resize2fs need /etc/mtab): make sure it does.
RUN apt-get update && \
    apt-get install -y --no-install-recommends util-linux mount e2fsprogs xfsprogs && \
    rm -rf /var/lib/apt/lists/* && \
    test -L /etc/mtab && test -L /var/run
COPY --from=build /out/driver /driver
ARG VERSION=dev
LABEL org.opencontainers.image.version=${VERSION}
ENTRYPOINT ["/driver"]

# The controller plugin and the sidecar: static binaries on an empty base,
# no shell, not root. The manifests choose the binary with `command`.
FROM scratch AS loopvol-controller
COPY hack/images/rootfs/controller/ /
COPY --from=build /out/driver /driver
COPY --from=build /out/attacher /attacher
USER 65532:65532
ARG VERSION=dev
LABEL org.opencontainers.image.version=${VERSION}
ENTRYPOINT ["/driver"]
