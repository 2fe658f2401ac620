"""The CLI commands that move messages: `produce`, `read`, `consume`.

`produce` sends the `-m` messages (`-n` times), or one message per line of `-f FILE`
(`-f -`: stdin, read as it arrives, so `tail -f log | shadowtopic produce t -f -` works).
A line is bytes up to its newline (`\\n` or `\\r\\n`, not part of the message); empty lines
are skipped. `-k KEY` keys every message; `--key-separator SEP` instead splits each message
at its first SEP into key and payload (Kafka's console producer's `parse.key=true
key.separator=SEP`), so `user-1:` is a tombstone for `user-1`; a message without SEP is an
error. Ctrl-C stops reading and waits for the receipts of what was sent (a second Ctrl-C
stops waiting), then says on stderr how many messages were acknowledged and exits 130.
"""
from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from typing import BinaryIO, NoReturn

from shadowtopic.cli.commands import connect
from shadowtopic.cli.output import emit, fail, message_line
from shadowtopic.core import errors

#: exit code after Ctrl-C (128 + SIGINT), as shells report it
INTERRUPTED = 130


class _Interrupts:
    """SIGINT while producing. The first one raises KeyboardInterrupt only while the input
    is being waited for (a read can only be left that way); anywhere else it is counted and
    the send loop stops at the next message, so a message is never half queued. A second
    one raises wherever it lands: the wait for receipts ends."""

    def __init__(self) -> None:
        self.count = 0
        self.reading = False

    def __call__(self, signum, frame) -> None:
        self.count += 1
        if self.reading or self.count > 1:
            raise KeyboardInterrupt


@contextmanager
def _on_sigint(handler) -> Iterator[None]:
    """`handler` as the SIGINT handler for the block (only the main thread may set one)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


class _Tally:
    """Messages sent (main thread) and receipts (the producer's receipt thread): the
    acknowledged messages until the first failure (receipts come in send order, so these
    are the first N sent)."""

    def __init__(self) -> None:
        self.sent = self.acked = 0
        self.first = self.last = None
        self.failure: errors.ShadowTopicError | None = None  # of a send: what follows fails
        self.bad_input: errors.ShadowTopicError | None = None  # sending stopped before it

    def __call__(self, mid, exc) -> None:
        if exc is not None:
            self.failure = self.failure or exc
        elif self.failure is None:
            self.acked += 1
            self.first = self.first or mid
            self.last = mid

    def error(self) -> errors.ShadowTopicError | None:
        return self.failure or self.bad_input

    def interrupted(self) -> str:
        err = self.error()
        why = f"; {err.reason}: {err.message}" if err else ""
        return f"interrupted: {self.acked} of {self.sent} messages sent were acknowledged{why}"


def _split(message: bytes, sep: bytes | None, key: str | None, where: str
           ) -> tuple[bytes | str | None, bytes]:
    if sep is None:
        return key, message
    k, found, payload = message.partition(sep)
    if not found:
        raise errors.InvalidArgument(f"{where} has no key separator {sep.decode()!r}")
    return k, payload


def _lines(src: BinaryIO, interrupts: _Interrupts) -> Iterator[bytes]:
    """The lines of `src` without their line ends, empty ones skipped; Ctrl-C while a line
    is awaited raises KeyboardInterrupt."""
    while True:
        interrupts.reading = True
        try:
            line = src.readline()
        finally:
            interrupts.reading = False
        if not line:
            return
        line = line.removesuffix(b"\n").removesuffix(b"\r")
        if line:
            yield line


def _open_input(args) -> BinaryIO | None:
    """The -f input (None for -m): stdin's bytes for `-`, else the file, opened now so a
    wrong path fails before anything is sent."""
    if args.file is None:
        return None
    if args.file == "-":
        return sys.stdin.buffer
    try:
        return open(args.file, "rb")
    except OSError as exc:
        fail(f"cannot read {args.file}: {exc.strerror or exc}")


def _messages(args, src: BinaryIO | None, interrupts: _Interrupts
              ) -> Iterator[tuple[bytes | str | None, bytes]]:
    """(key, payload) of every message to send, in order."""
    sep = args.key_separator.encode() if args.key_separator is not None else None
    if src is None:
        payloads = [m.encode() for m in args.message]
        for _ in range(args.num_produce):
            for i, m in enumerate(payloads):
                yield _split(m, sep, args.key, f"message {i + 1} (-m)")
        return
    name = "stdin" if args.file == "-" else args.file
    for n, line in enumerate(_lines(src, interrupts), 1):
        yield _split(line, sep, args.key, f"line {n} of {name}")


def _check(args) -> None:
    """What the parser cannot say (it requires one of -m and -f)."""
    if args.file is not None and args.num_produce != 1:
        fail("-n/--num-produce repeats the -m messages; it cannot be used with -f")
    if args.key is not None and args.key_separator is not None:
        fail("-k/--key and --key-separator exclude each other (the separator takes each "
             "message's key from the message)")
    if args.key_separator == "":
        fail("--key-separator must not be empty")


def produce(args) -> int:
    """Send every message; stop at the first failure and say how many were acknowledged
    before it. Ctrl-C: see the module doc."""
    _check(args)
    src = _open_input(args)
    tally = _Tally()
    interrupts = _Interrupts()
    with _on_sigint(interrupts), (nullcontext() if src is None or args.file in (None, "-")
                                  else src):
        try:
            with connect(args) as c:
                with c.create_producer(args.topic, producer_name="cli",
                                       compression_type=args.compression) as p:
                    try:
                        _send(p, args, src, tally, interrupts)
                    except KeyboardInterrupt:  # the second Ctrl-C: stop waiting, now
                        _leave_now(tally)
        except KeyboardInterrupt:  # the second Ctrl-C while connecting
            _leave_now(tally)
        except errors.ShadowTopicError as exc:
            tally.failure = tally.failure or exc
    if interrupts.count:
        sys.stderr.write(tally.interrupted() + "\n")
        return INTERRUPTED
    err = tally.error()
    if err is not None:
        if tally.sent:  # of all -m messages planned, or of the lines sent
            total = tally.sent if src is not None else args.num_produce * len(args.message)
            err = type(err)(f"{err.message} ({tally.acked} of {total} messages "
                            f"acknowledged before the error)")
        raise err
    first = str(tally.first) if tally.first else None
    last = str(tally.last) if tally.last else None
    if args.output == "json":
        emit({"produced": tally.sent, "first_message_id": first, "last_message_id": last},
             "json")
    elif tally.sent:
        print(f"{tally.sent} messages produced to {args.topic} ({first} .. {last})")
    else:
        print(f"0 messages produced to {args.topic} (no input)")
    return 0


def _send(p, args, src: BinaryIO | None, tally: _Tally, interrupts: _Interrupts) -> None:
    """Queue the messages until the input ends, a failure or Ctrl-C; then wait for every
    receipt."""
    props = dict(args.property)
    try:
        for key, payload in _messages(args, src, interrupts):
            if interrupts.count or tally.failure:
                break
            p.send_async(payload, key=key, properties=props, callback=tally)
            tally.sent += 1
            if tally.sent % 100_000 == 0:
                p.flush()
    except KeyboardInterrupt:  # the first Ctrl-C, while waiting for input
        if interrupts.count > 1:
            raise
    except errors.ShadowTopicError as exc:  # a bad line: what was sent before goes on
        tally.bad_input = exc
    p.flush()


def _leave_now(tally: _Tally) -> NoReturn:
    """Say what was acknowledged and exit at once, without closing the producer (closing
    waits for its receipts again)."""
    sys.stderr.write(tally.interrupted() + "\n")
    sys.stderr.flush()
    try:
        sys.stdout.flush()
    except OSError:
        pass
    os._exit(INTERRUPTED)


def read(args) -> int:
    limit = args.num_messages
    if limit is None:
        limit = 0 if args.until_end else 1
    if args.parquet:
        return _read_parquet(args, limit)
    count = 0
    with connect(args) as c:
        with c.create_reader(args.topic, start=args.start, inclusive=args.inclusive,
                             read_compacted=args.compacted) as r:
            while limit == 0 or count < limit:
                if args.until_end and not r.has_message_available():
                    break
                try:
                    msg = r.read_next(timeout=args.timeout)
                except errors.Timeout:
                    if args.until_end:
                        break
                    raise
                message_line(msg, args.output)
                count += 1
    sys.stdout.flush()
    if args.output == "table":
        print(f"# {count} messages", file=sys.stderr)
    return 0


def _read_parquet(args, limit: int) -> int:
    """`read --parquet FILE`: what the reader reads, written as Parquet (the columns of
    `Reader.read_batch`: docs/FORMAT.md), batch by batch; the count on stderr."""
    try:
        import pyarrow.parquet as pq
    except ImportError:
        fail("read --parquet needs pyarrow: pip install 'shadowtopic[arrow]'")
    count = 0
    writer = None
    with connect(args) as c:
        with c.create_reader(args.topic, start=args.start, inclusive=args.inclusive,
                             read_compacted=args.compacted) as r:
            try:
                while limit == 0 or count < limit:
                    if args.until_end and not r.has_message_available():
                        break
                    want = 10_000 if limit == 0 else min(10_000, limit - count)
                    batch = r.read_batch(want, timeout=args.timeout)
                    if not batch.num_rows:
                        if args.until_end:
                            break
                        raise errors.Timeout(f"no message within {args.timeout:g}s ({count} "
                                             f"messages written)")
                    if writer is None:
                        writer = pq.ParquetWriter(args.parquet, batch.schema,
                                                  compression="zstd")
                    writer.write_batch(batch)
                    count += batch.num_rows
            finally:
                if writer is not None:
                    writer.close()
    print(f"# {count} messages written to {args.parquet}", file=sys.stderr)
    return 0


def consume(args) -> int:
    """Receive -n messages (0: until Ctrl-C) from a durable subscription, print each as
    `read` does and acknowledge the messages once they are printed and flushed (unless
    --no-ack): at least once on stdout."""
    limit = args.num_messages
    count = 0
    with connect(args) as c:
        with c.subscribe(args.topic, args.subscription, consumer_type=args.type,
                         initial_position=args.position,
                         consumer_name=args.consumer_name) as consumer:
            while limit == 0 or count < limit:
                try:
                    batch = [consumer.receive(timeout=args.timeout)]
                except errors.Timeout:
                    raise errors.Timeout(f"no message within {args.timeout:g}s ({count} "
                                         f"messages consumed)") from None
                more = 1000 if limit == 0 else min(1000, limit - count - 1)
                if more > 0:
                    batch += consumer.batch_receive(more, timeout=0)
                for msg in batch:
                    message_line(msg, args.output)
                sys.stdout.flush()
                if not args.no_ack:
                    for msg in batch:
                        consumer.acknowledge(msg)
                count += len(batch)
    if args.output == "table":
        print(f"# {count} messages", file=sys.stderr)
    return 0
