# A known amount of payload over a lab link, for netlab --wire's test (tests/netlab.cmake):
# rank 1 listens on its lab address, rank 0 connects to it and sends BYTES, rank 1
# counts them to EOF and says how many arrived. Run by benchmarks/netlab, which gives
# every rank QCOLL_RANK and QCOLL_BIND (rank r's address is PREFIX.(r+1)).
import os
import socket
import sys
import time

total = int(sys.argv[1])
rank = int(os.environ["QCOLL_RANK"])
prefix = os.environ["QCOLL_BIND"].rsplit(".", 1)[0]
receiver = (prefix + ".2", 5411)

if rank == 1:
    server = socket.create_server(receiver)
    server.settimeout(30)
    connection, _ = server.accept()
    connection.settimeout(30)
    received = 0
    while chunk := connection.recv(1 << 20):
        received += len(chunk)
    print(f"received {received} bytes")
    sys.exit(0 if received == total else 1)

deadline = time.monotonic() + 30  # rank 1 may not listen yet
while True:
    try:
        sender = socket.create_connection(receiver, timeout=30)
        break
    except OSError:
        if time.monotonic() > deadline:
            raise
        time.sleep(0.05)
block = bytes(1 << 20)
left = total
while left:
    left -= sender.send(block[: min(left, len(block))])
sender.close()
