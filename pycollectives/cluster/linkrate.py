"""The rate a TCP stream reaches between two simulated hosts (run as a script inside a host's
network namespace; imports nothing of pycollectives, so it starts in milliseconds).

    linkrate.py serve ADDR PORT      accept one stream, print the bits per second received
    linkrate.py send ADDR PORT SECS  send to ADDR:PORT for SECS seconds

The receiver's clock runs from the first byte to the end of the stream, so the rate is the
stream's payload (TCP's goodput: the link's rate less the headers, about 94-96% at MTU 1500).
"""
import socket
import sys
import time


def serve(addr, port, ready=None):
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((addr, port))
    s.listen(1)
    s.settimeout(30)
    if ready:
        print("ready", flush=True)
    conn, _ = s.accept()
    n, t0 = 0, None
    buf = bytearray(1 << 20)
    while True:
        got = conn.recv_into(buf)
        if not got:
            break
        if t0 is None:
            t0 = time.perf_counter()
        n += got
    elapsed = time.perf_counter() - t0 if t0 else 0.0
    conn.close()
    s.close()
    return n * 8 / elapsed if elapsed > 0 else 0.0


def send(addr, port, seconds):
    deadline = time.monotonic() + 10
    while True:
        try:
            c = socket.create_connection((addr, port), timeout=10)
            break
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.02)
    buf = b"\0" * (1 << 20)
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        c.sendall(buf)
    c.shutdown(socket.SHUT_WR)
    c.recv(1)  # wait until the receiver has read everything and closed
    c.close()


if __name__ == "__main__":
    mode, addr, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
    if mode == "serve":
        print(f"{serve(addr, port, ready=True):.0f}", flush=True)
    else:
        send(addr, port, float(sys.argv[4]))
