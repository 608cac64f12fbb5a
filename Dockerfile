# syntax=docker/dockerfile:1
# relayd container image: a static binary on distroless, non-root.
#
#   make image                                   # ghcr.io/relayd/relayd:<VERSION file>
#   make image IMAGE=registry.example.com/relayd # your registry's name
#
# which runs docker build -t $(IMAGE):$(VERSION) with the build args
# VERSION (the VERSION file), COMMIT and BUILDDATE.
#
# The go build flags are the Makefile's (`make build`), so the binary the
# tests run is the one shipped; test/deploy checks that they stay equal.

ARG GO_VERSION=1.26

FROM --platform=$BUILDPLATFORM golang:${GO_VERSION} AS build
ARG TARGETOS
ARG TARGETARCH
ARG VERSION=dev
ARG COMMIT=unknown
ARG BUILDDATE=unknown
WORKDIR /src
COPY go.mod go.sum ./
RUN --mount=type=cache,target=/go/pkg/mod go mod download
COPY cmd/ cmd/
COPY pkg/ pkg/
COPY internal/ internal/
RUN --mount=type=cache,target=/go/pkg/mod --mount=type=cache,target=/root/.cache/go-build \
    CGO_ENABLED=0 GOOS=${TARGETOS} GOARCH=${TARGETARCH} go build -trimpath \
      -ldflags "-s -w -X github.com/relayd/relayd/internal/version.Version=${VERSION} -X github.com/relayd/relayd/internal/version.Commit=${COMMIT} -X github.com/relayd/relayd/internal/version.BuildDate=${BUILDDATE}" \
      -o /out/relayd ./cmd/relayd

FROM gcr.io/distroless/static-debian12:nonroot
ARG VERSION=dev
ARG COMMIT=unknown
ARG BUILDDATE=unknown
LABEL org.opencontainers.image.title="relayd" \
      org.opencontainers.image.description="Relays Kubernetes changes to NATS JetStream as CloudEvents" \
      org.opencontainers.image.source="https://github.com/relayd/relayd" \
      org.opencontainers.image.url="https://github.com/relayd/relayd" \
      org.opencontainers.image.documentation="https://github.com/relayd/relayd/blob/main/docs/DEPLOY.md" \
      org.opencontainers.image.vendor="relayd" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${COMMIT}" \
      org.opencontainers.image.created="${BUILDDATE}"
COPY --from=build /out/relayd /relayd
# distroless "nonroot": uid/gid 65532 (the Deployment's runAsUser).
USER 65532:65532
# 8080: /metrics; 8081: /healthz, /readyz (the defaults of the run flags).
EXPOSE 8080 8081
ENTRYPOINT ["/relayd"]
CMD ["run", "-c", "/etc/relayd/config.yaml"]
