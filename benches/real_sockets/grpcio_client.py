"""grpcio's own client (C-core) for the real-socket detection benchmark.

One channel over every backend, round robin under `outlier_detection_experimental` at gRPC's
defaults (A50: 10 s interval, 30 s base ejection, 10 % at most, success rate with a 1.9 stdev
factor, 5 hosts and 100 requests minimum), calling grpc.health.v1.Health/Check with a per-call
deadline and no retries. Prints "ready" once connected, waits for "go" on stdin, then prints one
line per request: start (seconds since go), latency (seconds), 1 if it succeeded.
"""

import argparse
import json
import sys
import threading
import time

import grpc

METHOD = "/grpc.health.v1.Health/Check"
# HealthCheckRequest { service: "" } serializes to no bytes.
REQUEST = b""


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--targets", required=True)
    parser.add_argument("--shape", choices=["serial", "concurrent", "open"], required=True)
    parser.add_argument("--rate", type=float, default=200.0)
    parser.add_argument("--callers", type=int, default=16)
    parser.add_argument("--duration", type=float, required=True)
    parser.add_argument("--timeout", type=float, default=1.0)
    args = parser.parse_args()

    service_config = {
        "loadBalancingConfig": [
            {
                "outlier_detection_experimental": {
                    "interval": "10s",
                    "baseEjectionTime": "30s",
                    "maxEjectionTime": "300s",
                    "maxEjectionPercent": 10,
                    "successRateEjection": {},
                    "childPolicy": [{"round_robin": {}}],
                }
            }
        ],
        # No retries: every failure reaches the caller, as for the other stacks.
        "methodConfig": [],
    }
    options = [
        ("grpc.service_config", json.dumps(service_config)),
        ("grpc.enable_retries", 0),
        # The target lists every backend; its text ("127.0.0.1:a,127.0.0.1:b") is not a valid
        # :authority, which the backends' HTTP/2 server refuses.
        ("grpc.default_authority", "backends"),
    ]
    target = "ipv4:" + args.targets
    channel = grpc.insecure_channel(target, options=options)
    grpc.channel_ready_future(channel).result(timeout=10)
    check = channel.unary_unary(
        METHOD, request_serializer=None, response_deserializer=None
    )
    try:
        check(REQUEST, timeout=args.timeout)
    except grpc.RpcError as error:
        print(f"grpcio: a first call failed: {error.code()} {error.details()}", file=sys.stderr)
    print("ready", flush=True)
    if sys.stdin.readline().strip() != "go":
        sys.exit("expected go")

    t0 = time.monotonic()
    lines = []
    lock = threading.Lock()

    def record(start, ok):
        now = time.monotonic()
        with lock:
            lines.append(f"{start - t0:.6f} {now - start:.6f} {1 if ok else 0}")

    def serial_caller():
        while time.monotonic() - t0 < args.duration:
            start = time.monotonic()
            try:
                check(REQUEST, timeout=args.timeout)
                record(start, True)
            except grpc.RpcError:
                record(start, False)

    if args.shape == "serial":
        serial_caller()
    elif args.shape == "concurrent":
        threads = [threading.Thread(target=serial_caller) for _ in range(args.callers)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    else:
        pending = []
        interval = 1.0 / args.rate
        n = 0
        while True:
            due = t0 + n * interval
            if due - t0 >= args.duration:
                break
            delay = due - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            start = time.monotonic()
            future = check.future(REQUEST, timeout=args.timeout)

            def done(f, start=start):
                record(start, f.exception() is None)

            future.add_done_callback(done)
            pending.append(future)
            n += 1
        for future in pending:
            try:
                future.result()
            except grpc.RpcError:
                pass
        # Callbacks run on grpc's threads; give the last ones a moment.
        time.sleep(0.05)

    with lock:
        sys.stdout.write("\n".join(lines) + "\n")
    sys.stdout.flush()
    channel.close()


if __name__ == "__main__":
    main()
