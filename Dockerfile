# colibri in a container: the release archive's `coli` (tools/release.sh) on a slim Debian,
# run as an unprivileged user, models in a volume. docs/release.md says what was and was
# not tried (no container runtime on the machine this was written on).
#
#   tools/release.sh                        # dist/colibri-<version>-linux-x86_64.tar.gz
#   docker build -t colibri .
#   docker run -p 127.0.0.1:7878:7878 -v colibri-models:/models colibri
#   docker run -it -v colibri-models:/models colibri coli run olmoe
#
# The helper inside listens on 0.0.0.0 (the container's own network); publish the port on
# the host's loopback as above, since `--host` other than loopback exposes it to whoever
# reaches the port. The Host check still applies: it allows localhost and 127.0.0.1.
FROM debian:trixie-slim

ARG ARCHIVE=dist/colibri-*-linux-x86_64.tar.gz
# ca-certificates: `coli pull` talks to the Hugging Face hub over HTTPS (rustls reads the
# bundled webpki roots, but a proxy's CA goes there); curl: the health check.
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates curl \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --system --create-home --home-dir /home/colibri --uid 10001 colibri \
 && mkdir /models && chown colibri /models

ADD ${ARCHIVE} /opt/
RUN ln -s /opt/colibri-*/coli /usr/local/bin/coli && coli --version

USER colibri
ENV COLI_HOME=/models
VOLUME /models
EXPOSE 7878
HEALTHCHECK --interval=30s --timeout=5s --start-period=10s --retries=3 \
  CMD curl -fsS http://127.0.0.1:7878/health || exit 1
CMD ["coli", "serve", "--host", "0.0.0.0", "--port", "7878"]
