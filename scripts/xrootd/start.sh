#!/usr/bin/env bash
# Starts a loopback-only XRootD (Debian xrootd-server 5.5.x) HTTP(S) storage endpoint that
# issues and accepts macaroons, in the background. Waits until it answers on 127.0.0.1:PORT,
# then prints its pid on stdout (everything else goes to stderr). Stop it with `kill <pid>`.
#
# usage: start.sh PORT DATADIR [STATEDIR]
#   PORT      one port for xroot://, http:// and https:// (TLS detected per connection)
#   DATADIR   served namespace root: URL path /x <-> DATADIR/x
#   STATEDIR  default DATADIR.state; holds etc/ (throwaway CA + certs, macaroon secret, the
#             config files copied from here), admin/, run/, xrootd.log
# env:
#   HTFAAS_XRD_WAIT_S=20     max seconds to wait for readiness
#   HTFAAS_XRD_ALLOW_DNS=1   do not run xrootd in the no-DNS mount namespace (nodns.sh)
#   HTFAAS_XRD_EXTRA_CFG=F   append the config lines of file F (e.g. notify-fifo.cfg: ofs.notify to
#                            a FIFO in the state dir); they may use $(xPort) $(xData) $(xState) $(xHome)
#   HTFAAS_XRD_AUTHDB=F      use authdb F instead of ./authdb (e.g. authdb-delete, which lets the
#                            issuer also delete, for tests that remove files)
# Afterwards:
#   issuer (x509): curl --cacert S/etc/ca.pem --cert S/etc/client.pem --key S/etc/client.key \
#                    -X POST -H 'Content-Type: application/macaroon-request' \
#                    -d '{"caveats":["activity:DOWNLOAD"],"validity":"PT2H"}' https://127.0.0.1:PORT/path
#   bearer:        curl -H "Authorization: Bearer $MAC" http://127.0.0.1:PORT/path
# Needs: xrootd-server xrootd-server-plugins openssl curl util-linux (scripts/install-deps.sh).
# Every address involved is 127.0.0.1; as root, xrootd runs as user `xrootd` (it refuses to run
# as root) inside a private mount namespace without DNS (see nodns.sh).
set -euo pipefail
usage="usage: start.sh PORT DATADIR [STATEDIR]"
PORT=${1:?$usage}
DATADIR=${2:?$usage}
STATEDIR=${3:-${DATADIR%/}.state}
WAIT_S=${HTFAAS_XRD_WAIT_S:-20}
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

command -v xrootd >/dev/null || { echo "xrootd is not installed (scripts/install-deps.sh)" >&2; exit 1; }
compgen -G "/usr/lib/*/libXrdMacaroons-5.so" >/dev/null || compgen -G "/usr/lib*/libXrdMacaroons-5.so" >/dev/null \
  || { echo "libXrdMacaroons-5.so is missing (apt-get install -y xrootd-server-plugins)" >&2; exit 1; }

mkdir -p "$DATADIR" "$STATEDIR"/{etc,admin,run}
DATADIR=$(cd "$DATADIR" && pwd)
STATEDIR=$(cd "$STATEDIR" && pwd)
ETC=$STATEDIR/etc

# Throwaway PKI (once per state dir): CA, server cert for 127.0.0.1/localhost, client cert of
# the token issuer (DN /O=htfaas/CN=faas-admin -> gridmap name faasadmin).
if [[ ! -s $ETC/client.pem ]]; then
  (
    cd "$ETC"
    openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.pem -days 3650 \
      -subj "/O=htfaas/CN=htfaas throwaway test CA" 2>/dev/null
    openssl req -newkey rsa:2048 -nodes -keyout server.key -out server.csr -subj "/O=htfaas/CN=localhost" 2>/dev/null
    printf 'subjectAltName=DNS:localhost,IP:127.0.0.1\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n' >server.ext
    openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out server.pem -days 3650 \
      -extfile server.ext 2>/dev/null
    openssl req -newkey rsa:2048 -nodes -keyout client.key -out client.csr -subj "/O=htfaas/CN=faas-admin" 2>/dev/null
    printf 'basicConstraints=CA:FALSE\nextendedKeyUsage=clientAuth\n' >client.ext
    openssl x509 -req -in client.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out client.pem -days 3650 \
      -extfile client.ext 2>/dev/null
    rm -f ./*.csr ./*.ext ca.srl
  )
fi
# Macaroon HMAC secret: base64, at least 32 bytes decoded.
[[ -s $ETC/macaroon-secret ]] || openssl rand -base64 -out "$ETC/macaroon-secret" 64
chmod 600 "$ETC"/*.key "$ETC/macaroon-secret"
# The config files are copied into the state dir so that user xrootd can read them wherever
# the checkout lives.
cp -f "$HERE/xrootd.cfg" "$HERE/gridmap" "$ETC/"
cp -f "${HTFAAS_XRD_AUTHDB:-$HERE/authdb}" "$ETC/authdb"
if [[ -n ${HTFAAS_XRD_EXTRA_CFG:-} ]]; then
  { printf '\n# --- appended by start.sh from %s\n' "$HTFAAS_XRD_EXTRA_CFG"; cat "$HTFAAS_XRD_EXTRA_CFG"; } >>"$ETC/xrootd.cfg"
fi

# xrootd refuses to run as root: drop to user `xrootd` (created by the Debian package), which
# must own the data and state dirs and be able to traverse their parents.
RUNAS=()
if [[ $(id -u) -eq 0 ]]; then
  id xrootd >/dev/null 2>&1 || useradd --system --no-create-home --shell /usr/sbin/nologin xrootd
  chown -R xrootd: "$DATADIR" "$STATEDIR"
  for d in "$DATADIR" "$STATEDIR"; do
    runuser -u xrootd -- test -w "$d" \
      || { echo "user xrootd cannot write $d (is a parent dir not traversable? chmod o+x it)" >&2; exit 1; }
  done
  RUNAS=(-R xrootd)
fi

# libXrdUtils reverse-resolves this host's non-loopback interface addresses when it loads (DNS
# PTR queries to the system resolver). As root, run xrootd in a private mount namespace whose
# nsswitch.conf says "hosts: files".
NODNS=()
if [[ ${HTFAAS_XRD_ALLOW_DNS:-0} != 1 ]]; then
  if [[ $(id -u) -eq 0 ]] && unshare --mount --propagation private true 2>/dev/null; then
    NODNS=("$HERE/nodns.sh")
  else
    echo "warning: not root (or unshare does not work here): xrootd may send reverse-DNS queries" \
      "for this host's interface addresses" >&2
  fi
fi

export HTFAAS_XRD_PORT=$PORT HTFAAS_XRD_DATA=$DATADIR HTFAAS_XRD_STATE=$STATEDIR HTFAAS_XRD_HOME=$ETC
LOG=$STATEDIR/xrootd.log
rm -f "$STATEDIR/run/xrootd.pid"
# -l =FILE: log to FILE without daily renaming. No -b: the pid printed is xrootd's own
# (nodns.sh execs).
"${NODNS[@]}" xrootd "${RUNAS[@]}" -c "$ETC/xrootd.cfg" -l "=$LOG" -s "$STATEDIR/run/xrootd.pid" \
  </dev/null >>"$STATEDIR/xrootd.stdout" 2>&1 &
PID=$!

deadline=$(($(date +%s) + WAIT_S))
until code=$(curl -s -o /dev/null -w '%{http_code}' --max-time 1 "http://127.0.0.1:$PORT/" 2>/dev/null) \
  && [[ $code != 000 ]]; do
  if ! kill -0 "$PID" 2>/dev/null; then
    echo "xrootd exited early; last log lines:" >&2
    tail -n 30 "$LOG" "$STATEDIR/xrootd.stdout" >&2 2>/dev/null || true
    exit 1
  fi
  if (($(date +%s) >= deadline)); then
    echo "xrootd did not answer on 127.0.0.1:$PORT within ${WAIT_S}s" >&2
    kill "$PID" 2>/dev/null || true
    exit 1
  fi
  sleep 0.05
done
if ! grep -q "Creating new Macaroon handler object" "$LOG"; then
  echo "warning: the macaroon handler was not loaded (see $LOG)" >&2
fi
echo "$PID"
