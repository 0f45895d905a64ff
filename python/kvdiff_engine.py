"""An engine for kvdiff in Python: subclass Engine, implement its methods, call run().

kvdiff starts the program (`--backends exec:"python3 my_engine.py"`) and speaks the kvdiff engine
protocol (docs/protocol.md) on its stdin and stdout; this module does the framing. Each request
becomes one method call; a Python exception becomes an error reply, never a traceback on the wire:

    InputError("token id 300 ...")  -> status 1, invalid input: the caller's fault (kvdiff exit 2)
    any other exception              -> status 2, engine failure (kvdiff fails the case, exit 1)

    import kvdiff_engine
    np = kvdiff_engine.numpy_or_refuse()   # numpy, or a clear refusal on the wire if missing

    class MyEngine(kvdiff_engine.Engine):
        name, version = "mine", "0.1"
        def open(self, model_dir, options): ...   # options: {"key": "value"}
        def info(self): return kvdiff_engine.Info(vocab_size=256, max_length=512)
        def session_new(self): return MySession()
        def append(self, session, tokens): ...    # tokens: int32 array -> float32 [n, vocab]
        def length(self, session): ...
        def truncate(self, session, length): ...
        def fork(self, session): ...              # a deep copy: a new session object
        def reset(self, session): ...

    if __name__ == "__main__":
        MyEngine().run()

Optional: session_free(session) (the default drops it), append_batch(items) (items: a list of
(session, tokens, flags); returns one float32 [flagged rows, vocab] array per item; an engine
that defines it reports abi_version 2, else kvdiff runs batch steps one item at a time) and
shift(session, keep, discard) (a context shift: drop positions [keep, keep + discard), move the
later ones down and re-rotate their cached keys by -discard positions; called only with
0 <= keep, 0 <= discard, keep + discard <= length and discard > 0, which this module checks; an
engine that defines it reports abi_version 3 and "shifts 1", and kvdiff runs shift steps on it).
Standard library only, but for numpy, which the logits need.
"""

import os
import struct
import sys
import traceback

PROTOCOL_VERSION = 1

# The ops and statuses of docs/protocol.md: the numbers are the protocol.
(HELLO, OPEN, INFO, SESSION_NEW, SESSION_FREE, APPEND, LENGTH, TRUNCATE, FORK, RESET, APPEND_BATCH,
 SHIFT) = range(12)
OK, INVALID_INPUT, ENGINE_FAILURE = 0, 1, 2

REQUEST_HEADER = struct.Struct("<IIqqq")  # op, reserved, session, arg, count: 32 bytes
REPLY_HEADER = struct.Struct("<IIqq")  # status, reserved, value, bytes: 24 bytes
BATCH_ITEM = struct.Struct("<qq")  # session, n: 16 bytes
MAX_TOKENS = 1 << 30
MAX_ITEMS = 1 << 20
MAX_TEXT = 1 << 20


class InputError(Exception):
    """The caller's input was refused (a token out of range, truncate beyond the length, an
    unknown option, an unreadable model): kvdiff reports it as bad input. Nothing may change."""


class Info:
    """What engine_info reports (include/kvdiff/engine.h); 0 means no limit."""

    def __init__(self, vocab_size, max_length, cache_dtype="f32", max_sessions=0,
                 max_batch_tokens=0, sizes=()):
        self.vocab_size, self.max_length, self.cache_dtype = vocab_size, max_length, cache_dtype
        self.max_sessions, self.max_batch_tokens = max_sessions, max_batch_tokens
        self.sizes = list(sizes)  # [("name", value)]: sizes where the engine changes behaviour


def numpy_or_refuse():
    """numpy, imported; or, when this interpreter has none, a program that answers kvdiff's open
    with that error (and says so on stderr), then exits 1: a clear refusal, never a traceback."""
    try:
        import numpy
        return numpy
    except ImportError:
        message = ("numpy is not installed for {}: apt-get install python3-numpy (or pip install "
                   "numpy for this interpreter)".format(sys.executable))
        sys.stderr.write("kvdiff_engine: {}\n".format(message))
        _Refuser(message).run()
        sys.exit(1)


class Engine:
    """The base of an engine: subclass it and implement the methods below (the names and meanings
    of include/kvdiff/engine.h's calls). Sessions are whatever objects session_new returns."""

    name = "python"
    version = "0"

    def open(self, model_dir, options):
        raise NotImplementedError("open")

    def info(self):
        raise NotImplementedError("info")

    def session_new(self):
        raise NotImplementedError("session_new")

    def session_free(self, session):
        pass

    def append(self, session, tokens):
        raise NotImplementedError("append")

    def length(self, session):
        raise NotImplementedError("length")

    def truncate(self, session, length):
        raise NotImplementedError("truncate")

    def fork(self, session):
        raise NotImplementedError("fork")

    def reset(self, session):
        raise NotImplementedError("reset")

    append_batch = None  # optional: see the module's documentation
    shift = None  # optional: see the module's documentation

    def run(self, stdin_fd=0, stdout_fd=1):
        """Serves kvdiff until it closes the stream. Returns the exit code: 0 after a clean close,
        3 when the peer sent a request header outside the protocol (said on stderr)."""
        # The protocol owns fd 1: print() and C code writing to fd 1 go to stderr from here on.
        out_fd = os.dup(stdout_fd)
        os.dup2(2, stdout_fd)
        sys.stdout = sys.stderr
        return _Server(self, stdin_fd, out_fd).serve()


class _Server:
    def __init__(self, engine, in_fd, out_fd):
        self.engine, self.in_fd, self.out_fd = engine, in_fd, out_fd
        self.sessions, self.next_id = {}, 0

    def read(self, n):
        """n bytes, or None at the end of the stream."""
        chunks, left = [], n
        while left > 0:
            chunk = os.read(self.in_fd, min(left, 1 << 20))
            if not chunk:
                return None
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)

    def write(self, data):
        view = memoryview(data)
        while view:
            view = view[os.write(self.out_fd, view):]

    def reply(self, status, value=0, payload=b""):
        self.write(REPLY_HEADER.pack(status, 0, value, len(payload)))
        if payload:
            self.write(payload)

    def serve(self):
        while True:
            header = self.read(REQUEST_HEADER.size)
            if header is None:
                return 0
            op, _, session, arg, count = REQUEST_HEADER.unpack(header)
            size = body_size(op, arg, count)
            if size < 0:
                sys.stderr.write("kvdiff_engine: a request header kvdiff would not send: op {} "
                                 "arg {} count {}; not the kvdiff engine protocol\n"
                                 .format(op, arg, count))
                return 3
            body = self.read(size) if size else b""
            if body is None:
                return 0
            try:
                value, payload = self.call(op, session, arg, count, body)
                self.reply(OK, value, payload)
            except InputError as e:
                self.reply(INVALID_INPUT, 0, _text(e))
            except Exception as e:  # an engine failure, whatever its type: said, not raised
                traceback.print_exc(file=sys.stderr)
                self.reply(ENGINE_FAILURE, 0, _text(e, type(e).__name__ + ": "))

    def find(self, session):
        if session not in self.sessions:
            raise RuntimeError("no session {}".format(session))
        return self.sessions[session]

    def keep(self, session):
        self.sessions[self.next_id] = session
        self.next_id += 1
        return self.next_id - 1

    def call(self, op, session, arg, count, body):
        """(value, payload) of the reply to one request."""
        e = self.engine
        if op == HELLO:
            if not count <= PROTOCOL_VERSION <= arg:
                raise InputError("this engine speaks protocol version {}; kvdiff offered {} to {}"
                                 .format(PROTOCOL_VERSION, count, arg))
            return PROTOCOL_VERSION, b""
        if op == OPEN:
            model_dir = body[:arg].decode("utf-8")
            e.open(model_dir, parse_options(body[arg:].decode("utf-8")))
            return 0, b""
        if op == INFO:
            return 0, encode_info(e, e.info())
        if op == SESSION_NEW:
            return self.keep(e.session_new()), b""
        if op == SESSION_FREE:
            e.session_free(self.sessions.pop(session, None))
            return 0, b""
        if op == APPEND:
            import numpy as np
            tokens = np.frombuffer(body, dtype="<i4").astype(np.int32)
            logits = _rows(e.append(self.find(session), tokens), len(tokens))
            return logits.shape[0], logits.astype("<f4").tobytes()
        if op == LENGTH:
            return int(e.length(self.find(session))), b""
        if op == TRUNCATE:
            e.truncate(self.find(session), arg)
            return 0, b""
        if op == FORK:
            return self.keep(e.fork(self.find(session))), b""
        if op == RESET:
            e.reset(self.find(session))
            return 0, b""
        if op == APPEND_BATCH:
            return self.batch(arg, count, body)
        if op == SHIFT:
            return self.shift(self.find(session), arg, count)
        raise RuntimeError("unknown op {}".format(op))

    def shift(self, session, keep, discard):
        """engine.h's refusals, then the engine's shift (discard 0 changes nothing)."""
        if self.engine.shift is None:
            raise InputError("this engine does not shift (its info says shifts 0)")
        length = int(self.engine.length(session))
        if keep < 0 or discard < 0 or keep > length or discard > length - keep:
            raise InputError("shift(keep={}, discard={}): expected 0 <= keep, 0 <= discard and "
                             "keep + discard <= {} (the session's length)"
                             .format(keep, discard, length))
        if discard > 0:
            self.engine.shift(session, keep, discard)
        return 0, b""

    def batch(self, n_items, n_tokens, body):
        import numpy as np
        if self.engine.append_batch is None and self.engine.shift is None:
            raise InputError("this engine has no append_batch (it reports abi_version 1)")
        heads = [BATCH_ITEM.unpack_from(body, i * BATCH_ITEM.size) for i in range(n_items)]
        at = n_items * BATCH_ITEM.size
        tokens = np.frombuffer(body, dtype="<i4", count=n_tokens, offset=at).astype(np.int32)
        flags = np.frombuffer(body, dtype=np.uint8, count=n_tokens, offset=at + 4 * n_tokens)
        items, begin = [], 0
        for session, n in heads:
            if n < 1 or begin + n > n_tokens:
                raise RuntimeError("batch items of {} tokens in a request of {}".format(n, n_tokens))
            items.append((self.find(session), tokens[begin:begin + n], flags[begin:begin + n] != 0))
            begin += n
        if self.engine.append_batch is None:  # abi_version 3 for shift: one item after another
            outs = [_rows(self.engine.append(s, t), len(t))[f] for s, t, f in items]
        else:
            outs = self.engine.append_batch(items)
        if len(outs) != len(items):
            raise RuntimeError("append_batch returned {} results for {} items"
                               .format(len(outs), len(items)))
        rows = [_rows(out, int(flag.sum())) for out, (_, _, flag) in zip(outs, items)]
        return sum(r.shape[0] for r in rows), b"".join(r.astype("<f4").tobytes() for r in rows)


def _rows(logits, n):
    """logits as a float32 [n, vocab] array; RuntimeError (an engine failure) if it is not."""
    import numpy as np
    logits = np.asarray(logits, dtype=np.float32)
    if logits.ndim != 2 or logits.shape[0] != n:
        raise RuntimeError("the engine returned logits of shape {} for {} rows"
                           .format(logits.shape, n))
    return np.ascontiguousarray(logits)


def _text(error, prefix=""):
    return (prefix + str(error)).encode("utf-8", "replace")[:MAX_TEXT]


def body_size(op, arg, count):
    """The bytes of a request's body, or -1 when its header is out of the protocol's bounds."""
    if op == OPEN:
        return arg + count if 0 <= arg <= MAX_TEXT and 0 <= count <= MAX_TEXT else -1
    if op == APPEND:
        return 4 * count if 0 < count <= MAX_TOKENS else -1
    if op == APPEND_BATCH:
        if not (0 < arg <= MAX_ITEMS and arg <= count <= MAX_TOKENS):
            return -1
        return BATCH_ITEM.size * arg + 5 * count
    return 0 if 0 <= op <= SHIFT else -1


def parse_options(text):
    """engine.h's options, "key=value,key=value" (or one a line), as a dict; InputError for an
    item without '='. Unknown keys are the engine's to refuse."""
    options = {}
    for item in text.replace("\n", ",").split(","):
        if not item:
            continue
        key, eq, value = item.partition("=")
        if not eq:
            raise InputError("option '{}': expected key=value".format(item))
        options[key] = value
    return options


def encode_info(engine, info):
    # abi_version 3 says whether the engine shifts (line 9), and takes append_batch, which this
    # module then runs one item after another for an engine without one.
    abi = 3 if engine.shift is not None else 1 if engine.append_batch is None else 2
    lines = [engine.name, engine.version, abi, info.vocab_size, info.max_length,
             info.cache_dtype, info.max_sessions, info.max_batch_tokens]
    if abi == 3:
        lines.append(1)
    lines += ["{} {}".format(name, value) for name, value in info.sizes]
    return "".join("{}\n".format(line) for line in lines).encode("utf-8")


class _Refuser(Engine):
    """Speaks the protocol only to refuse opening: the engine cannot run here, and says why."""

    name = "unavailable"

    def __init__(self, message):
        self.message = message

    def open(self, model_dir, options):
        raise InputError(self.message)
