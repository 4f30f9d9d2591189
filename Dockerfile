# kproxy's container image: a static kproxy on Debian bookworm-slim with
# the tools every proxy mode calls (deploy/image-packages.txt).
#
#   docker build -t localhost/kproxy:v0.1.0-dev .      # or: podman build ...
#
# hack/image.sh builds the same image without docker or podman (Debian
# packages with mmdebstrap, committed with umoci) as an OCI archive.
# The image's tag is the version cmd/kproxy/main.go reports; deploy/kproxy.yaml
# refers to it.

ARG GO_VERSION=1.26

FROM docker.io/library/golang:${GO_VERSION}-bookworm AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
ARG VERSION=v0.1.0-dev
# Static (no cgo): the binary needs nothing of the image's libc.
RUN CGO_ENABLED=0 go build -trimpath -ldflags "-s -w -X main.version=${VERSION}" \
      -o /out/kproxy ./cmd/kproxy

FROM docker.io/library/debian:bookworm-slim
# The package list is shared with hack/image.sh: comments and blank lines
# are dropped, the rest installed without recommends.
COPY deploy/image-packages.txt /tmp/image-packages.txt
RUN apt-get update \
 && sed -e 's/#.*//' -e '/^[[:space:]]*$/d' /tmp/image-packages.txt \
      | xargs apt-get install -y --no-install-recommends \
 && rm -rf /var/lib/apt/lists/* /tmp/image-packages.txt
COPY --from=build /out/kproxy /usr/local/bin/kproxy
ARG VERSION=v0.1.0-dev
ARG REVISION=unknown
LABEL org.opencontainers.image.title="kproxy" \
      org.opencontainers.image.description="A Kubernetes service proxy: a drop-in replacement for kube-proxy (nftables, iptables and ipvs modes)" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.base.name="docker.io/library/debian:bookworm-slim"
ENTRYPOINT ["/usr/local/bin/kproxy"]
