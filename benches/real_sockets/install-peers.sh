#!/usr/bin/env bash
# The real-socket benchmark's peers: Debian's nginx and HAProxy (reverse proxies with passive
# health checking) and grpcio from PyPI (gRPC's C-core client). Installs only what is missing.
set -euo pipefail
missing=()
[ -x /usr/sbin/nginx ] || missing+=(nginx-light)
[ -x /usr/sbin/haproxy ] || missing+=(haproxy)
if [ ${#missing[@]} -gt 0 ]; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${missing[@]}" > /dev/null
    # The packages start their services; the benchmark runs its own instances.
    systemctl stop nginx haproxy 2> /dev/null || service nginx stop 2> /dev/null || true
    pkill -x nginx 2> /dev/null || true
    pkill -x haproxy 2> /dev/null || true
fi
python3 -c 'import grpc' 2> /dev/null || pip install --quiet grpcio
/usr/sbin/nginx -v 2>&1
/usr/sbin/haproxy -v | sed -n 1p
python3 -c 'import grpc; print("grpcio", grpc.__version__)'
