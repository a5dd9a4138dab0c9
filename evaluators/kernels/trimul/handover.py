"""The wire between the timer and the kernel process (docs/method.md §5c, the two-process clock).

Standalone (standard library only): its text precedes both driver.py (the timer) and
kernel_process.py (the candidate's process). One AF_UNIX SOCK_SEQPACKET socket pair: every message
is one JSON object in one packet, with file descriptors (the shared input and output buffers on
CPU) riding along as SCM_RIGHTS. The timer never unpickles or imports anything the kernel process
sends: it reads JSON objects of at most MAX_MESSAGE bytes and checks every field it uses.
"""

import array
import json
import socket

MAX_MESSAGE = 1 << 16
MAX_FDS = 8


class ProtocolError(Exception):
    """The other side broke the protocol (closed the socket, sent garbage or the wrong reply)."""


def send_message(sock, message, fds=()):
    data = json.dumps(message).encode("utf-8")
    if len(data) > MAX_MESSAGE:
        raise ProtocolError(f"a message of {len(data)} bytes is over the limit of {MAX_MESSAGE}")
    ancillary = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))] if fds else []
    sock.sendmsg([data], ancillary)


def receive_message(sock):
    """(message dict, [fds]); raises ProtocolError on a closed socket or anything but a JSON object."""
    data, ancillary, flags, _ = sock.recvmsg(MAX_MESSAGE + 1, socket.CMSG_SPACE(MAX_FDS * 4))
    fds = []
    for level, kind, payload in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            got = array.array("i")
            got.frombytes(payload[: len(payload) - len(payload) % got.itemsize])
            fds.extend(got)
    if not data:
        raise ProtocolError("the other process closed the connection")
    if len(data) > MAX_MESSAGE or flags & (socket.MSG_TRUNC | socket.MSG_CTRUNC):
        raise ProtocolError("a message over the size limit")
    try:
        message = json.loads(data.decode("utf-8"))
    except ValueError as err:
        raise ProtocolError(f"a message that is not JSON ({err})") from None
    if not isinstance(message, dict):
        raise ProtocolError("a message that is not a JSON object")
    return message, fds
