# syntax=docker/dockerfile:1
# sigwatch service image: a static binary on distroless (CA certificates, a
# non-root user, no shell).
#
#   docker build -t sigwatch .
#   docker run --rm -p 8080:8080 -v $PWD/my.yaml:/etc/sigwatch/sigwatch.yaml:ro sigwatch
#
# The demo (an embedded NATS server and a simulated fleet) is not in it: it
# is built only with the demo tag (make demo).

FROM golang:1.26 AS build
WORKDIR /src
# Modules first, so the download layer survives source changes.
COPY go.mod go.sum ./
RUN --mount=type=cache,target=/go/pkg/mod go mod download
COPY . .
ARG VERSION=dev
# The same command deploy/check's TestDockerBuildIsStatic runs.
RUN --mount=type=cache,target=/go/pkg/mod --mount=type=cache,target=/root/.cache/go-build \
    CGO_ENABLED=0 go build -trimpath -ldflags "-s -w -X main.version=${VERSION}" -o /out/sigwatch ./cmd/sigwatch

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/sigwatch /usr/local/bin/sigwatch
# The default config: Redis, NATS and the broker on localhost. Mount your own
# over it, or override keys with SIGWATCH_* variables. To reach the API from
# outside the container set SIGWATCH_HTTP_ADDR=0.0.0.0:8080 and
# SIGWATCH_HTTP_TOKEN (a non-loopback address needs a token).
COPY deploy/sigwatch.yaml /etc/sigwatch/sigwatch.yaml
USER nonroot:nonroot
EXPOSE 8080
ENTRYPOINT ["/usr/local/bin/sigwatch"]
CMD ["run", "--config", "/etc/sigwatch/sigwatch.yaml"]
