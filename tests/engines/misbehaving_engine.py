#!/usr/bin/env python3
"""An engine program that breaks the kvdiff engine protocol (docs/protocol.md) in one way, for the
bad-input catalogue and exec_engine_test: kvdiff must fail the call naming what it was sent, never
hang or crash. Standard library only; it speaks the protocol by hand, up to its fault.

    misbehaving_engine.py MODE

  garbage        answers hello with a line of text
  wrong-version  answers hello with protocol version 2
  short-frame    answers append with 10 bytes of a reply header, then exits 0
  wrong-floats   answers append with its rows but one float too few
  exit-mid-call  exits with code 3 in the middle of append, without a reply
  hang           never answers append
  huge           announces a reply of 2^50 bytes to append
  crash          kills itself with SIGSEGV in the middle of append
  crash-with-helper  starts a helper process (which inherits the socket), then crashes as `crash`
  close-both     closes its stdin and stdout in the middle of append, and stays
  error-lines    answers append with an engine error whose message forges report lines and
                 carries terminal escapes
  wrong-vocab    says in its info a vocab_size one more than the model's
  other-after-crash  crashes in its first append, leaving a file "crashed" in the working
                 directory; a process started where that file is says max_length 64 in its info
"""

import json
import os
import signal
import struct
import subprocess
import sys
import time

REQUEST = struct.Struct("<IIqqq")
REPLY = struct.Struct("<IIqq")
HELLO, OPEN, INFO, SESSION_NEW, APPEND = 0, 1, 2, 3, 5


def read(n):
    data = b""
    while len(data) < n:
        chunk = os.read(0, n - len(data))
        if not chunk:
            sys.exit(0)
        data += chunk
    return data


def write(data):
    while data:
        data = data[os.write(1, data):]


def reply(value=0, payload=b"", status=0):
    write(REPLY.pack(status, 0, value, len(payload)) + payload)


def main(mode):
    vocab = 0
    while True:
        op, _, session, arg, count = REQUEST.unpack(read(REQUEST.size))
        body = read(arg + count if op == OPEN else 4 * count if op == APPEND else 0)
        if op == HELLO:
            if mode == "garbage":
                write(b"Hello from my engine! Ready.\n")
                time.sleep(60)
            reply(2 if mode == "wrong-version" else 1)
        elif op == OPEN:
            with open(os.path.join(body[:arg].decode(), "config.json")) as f:
                config = json.load(f)
            vocab = config["vocab_size"]
            reply()
        elif op == INFO:
            said = vocab + 1 if mode == "wrong-vocab" else vocab
            max_length = config["max_position_embeddings"]
            if mode == "other-after-crash" and os.path.exists("crashed"):
                max_length = 64
            reply(payload="misbehaving\n1\n1\n{}\n{}\nf32\n0\n0\n".format(
                said, max_length).encode())
        elif op == SESSION_NEW:
            reply(0)
        elif op == APPEND:
            if mode == "short-frame":
                write(REPLY.pack(0, 0, count, 4 * count * vocab)[:10])
                sys.exit(0)
            if mode == "wrong-floats":
                reply(count, b"\0" * (4 * (count * vocab - 1)))
            elif mode == "exit-mid-call":
                sys.exit(3)
            elif mode == "other-after-crash" and not os.path.exists("crashed"):
                open("crashed", "w").close()
                os.kill(os.getpid(), signal.SIGSEGV)
            elif mode in ("crash", "crash-with-helper"):
                if mode == "crash-with-helper":
                    subprocess.Popen(["sleep", "60"])  # inherits stdin and stdout: the socket
                os.kill(os.getpid(), signal.SIGSEGV)
            elif mode == "close-both":
                os.close(0)
                os.close(1)
                time.sleep(600)
            elif mode == "error-lines":
                reply(payload=b"broke\nPASS: 100 of 100 cases run\x1b[2J", status=2)
            elif mode == "hang":
                time.sleep(600)
            elif mode == "huge":
                write(REPLY.pack(0, 0, count, 1 << 50))
                time.sleep(60)
            else:
                reply(count, b"\0" * (4 * count * vocab))
        else:
            reply()


if __name__ == "__main__":
    main(sys.argv[1])
