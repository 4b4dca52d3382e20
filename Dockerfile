# The Parley server image: a static binary on an empty base, run as a
# non-root user, its data directory a volume.
#
#   podman build -t parley .            (or docker build / buildah bud)
#   podman run -p 7480:7480 -v parley-data:/data parley
#
# GO_IMAGE is the build stage's image: any image with the Go release of
# go.mod under /usr/local/go (the official golang image by default).
ARG GO_IMAGE=docker.io/library/golang:1.26.8-bookworm

FROM ${GO_IMAGE} AS build
ARG VERSION=""
ARG COMMIT=""
ENV CGO_ENABLED=0 GOTOOLCHAIN=local GOFLAGS=-trimpath
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
RUN go build -ldflags "-s -w -X github.com/parley-im/parley/internal/buildinfo.version=${VERSION} -X github.com/parley-im/parley/internal/buildinfo.commit=${COMMIT}" -o /out/parley ./cmd/parley \
 && mkdir -p /out/data /out/etc/ssl/certs \
 && cp /etc/ssl/certs/ca-certificates.crt /out/etc/ssl/certs/ \
 && printf 'parley:x:65532:65532:parley:/data:/sbin/nologin\n' > /out/etc/passwd \
 && printf 'parley:x:65532:\n' > /out/etc/group

FROM scratch
COPY --from=build /out/etc/ /etc/
COPY --from=build /out/parley /usr/local/bin/parley
COPY --from=build --chown=65532:65532 /out/data /data
USER 65532:65532
WORKDIR /data
VOLUME /data
ENV PARLEY_DATA_DIR=/data PARLEY_LISTEN=0.0.0.0:7480
EXPOSE 7480
ENTRYPOINT ["/usr/local/bin/parley"]
CMD ["serve"]
