"""A gRPC control stream with grpcio on both ends, for the stall tests.

server PORT BEAT_MS BEATS [CERT KEY]: serves a server-streaming method
`/selfheal.Control/Attach` on 127.0.0.1:PORT whose application sends a
heartbeat message every BEAT_MS ms, BEATS of them (0: forever), and then
stops while its process and HTTP/2 transport stay up (the transport
still answers PINGs). Prints "listening" when it is. With CERT and KEY
(PEM files), over TLS, as a provider serves.

client PORT KEEPALIVE_MS [CA]: attaches with channel keepalive every
KEEPALIVE_MS ms (`grpc.keepalive_time_ms`, permitted without calls) and
prints "beat N" per heartbeat received, "ended CODE" when the stream
fails. With CA (a PEM file), over TLS, trusting that CA only
(`grpc.ssl_channel_credentials(root_certificates=...)`).
"""

import sys
import threading
import time

import grpc

METHOD = "/selfheal.Control/Attach"


def read(path):
    with open(path, "rb") as f:
        return f.read()


def server(port, beat_ms, beats, tls=None):
    def attach(request, context):
        n = 0
        while beats == 0 or n < beats:
            n += 1
            yield b"heartbeat %06d" % n
            time.sleep(beat_ms / 1000)
        # The application is stuck; the transport is not.
        threading.Event().wait()

    handler = grpc.method_handlers_generic_handler(
        "selfheal.Control",
        {"Attach": grpc.unary_stream_rpc_method_handler(attach)},
    )
    s = grpc.server(
        __import__("concurrent.futures").futures.ThreadPoolExecutor(4),
        handlers=[handler],
        options=[
            ("grpc.keepalive_permit_without_calls", 1),
            ("grpc.http2.min_recv_ping_interval_without_data_ms", 50),
            ("grpc.http2.min_ping_interval_without_data_ms", 50),
            ("grpc.http2.max_ping_strikes", 0),
        ],
    )
    if tls:
        cert, key = tls
        creds = grpc.ssl_server_credentials([(read(key), read(cert))])
        s.add_secure_port("127.0.0.1:%d" % port, creds)
    else:
        s.add_insecure_port("127.0.0.1:%d" % port)
    s.start()
    print("listening", flush=True)
    s.wait_for_termination()


def client(port, keepalive_ms, ca=None):
    target = "127.0.0.1:%d" % port
    options = [
        ("grpc.keepalive_time_ms", keepalive_ms),
        ("grpc.keepalive_timeout_ms", 20000),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.max_pings_without_data", 0),
    ]
    if ca:
        creds = grpc.ssl_channel_credentials(root_certificates=read(ca))
        ch = grpc.secure_channel(target, creds, options=options)
    else:
        ch = grpc.insecure_channel(target, options=options)
    call = ch.unary_stream(METHOD)(b"attach")
    try:
        for n, _ in enumerate(call, 1):
            print("beat %d" % n, flush=True)
        print("ended OK", flush=True)
    except grpc.RpcError as e:
        print("ended %s" % e.code().name, flush=True)


if __name__ == "__main__":
    if sys.argv[1] == "server":
        tls = (sys.argv[5], sys.argv[6]) if len(sys.argv) > 6 else None
        server(int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), tls)
    else:
        ca = sys.argv[4] if len(sys.argv) > 4 else None
        client(int(sys.argv[2]), int(sys.argv[3]), ca)
