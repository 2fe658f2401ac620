"""The sync client: one channel to a broker, admin calls, producers, readers and consumers.

    with Client("localhost:6650") as client:
        client.admin.create_topic("my-topic")
        with client.create_producer("my-topic") as p:
            p.send(b"hello", key="k1")
        with client.create_reader("my-topic", start="earliest") as r:
            for msg in r:
                print(msg)  # id, key, payload (as text), properties
        with client.subscribe("my-topic", "my-sub", consumer_type="shared") as consumer:
            msg = consumer.receive(timeout=10)
            consumer.acknowledge(msg)

Temporary errors are retried by the client itself. While a broker restarts, or a topic is
reloaded or changes owner, brokers answer retriable errors (`TopicNotOwned`,
`ServiceUnavailable`, `ConnectError`, `Timeout`: `errors.X.retriable`). Opening a producer,
consumer or reader (its lookup included) and admin calls retry them with backoff (50 ms
doubling to 1 s, jittered) until `operation_timeout` seconds have passed (default: `timeout`,
30 s as Pulsar's operationTimeout), then raise the last one, typed, with its reason; a
non-retriable error (`NotAllowed`, `TopicNotFound`, `ConsumerBusy`, ...) raises at once.
Admin calls that are not idempotent retry only errors that guarantee nothing was applied.
source/client/retry.py has the loop and the reasons.

A producer whose stream breaks looks the topic up again, attaches with the same identity and
resends everything unacknowledged, in order; the broker drops what it already stored
(idempotent producing, on by default: source/client/producer.py).

Consumers and readers reconnect by themselves when their stream breaks or the broker ends
them with a retriable error (a broker restart, a lost lease, a moved topic): each partition
is looked up again and subscribes again where it left off, within the operation timeout
(source/client/reconnect.py).
"""
from __future__ import annotations

import inspect
import threading
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, TypeVar, Unpack

from shadowtopic.client.ack_timeout import AckTimer, check_ack_timeout
from shadowtopic.client.admin import Admin, TopicMetadata, position_pb
from shadowtopic.client.connection import Connection, client_dial
from shadowtopic.client.consumer import Consumer, ConsumerControl
from shadowtopic.client.dead_letter import DeadLetterPolicy, DeadLetters, check_dead_letter_policy
from shadowtopic.client.listener import Callback, FrameCallback, Listeners
from shadowtopic.client.options import DEFAULT_TIMEOUT_S, check_options, parse_consumer_type
from shadowtopic.client.producer import Producer, ProducerOptions, _Stream
from shadowtopic.client.reader import Reader
from shadowtopic.client.reconnect import Reconnector
from shadowtopic.client.retry import Deadline
from shadowtopic.client.retry_letter import RetryLetters
from shadowtopic.client.stream import CLOSE_TIMEOUT_S, Multiplexer
from shadowtopic.client.table_view import TableView
from shadowtopic.core import errors
from shadowtopic.core.message_id import MessageId
from shadowtopic.core.names import canonical, check_subscription
from shadowtopic.security.dial import AuthToken

if TYPE_CHECKING:
    import pyarrow as pa

T = TypeVar("T")


def check_listener(listener: object) -> None:
    """A listener must take (message, recipients): a wrong one would fail on every message,
    in a thread, where nobody sees it."""
    if not callable(listener):
        raise errors.InvalidArgument("a message listener must be callable")
    try:
        inspect.signature(listener).bind(None, None)
    except TypeError:
        raise errors.InvalidArgument("a message listener must take (message, recipients)") \
            from None
    except ValueError:  # no signature to look at (a builtin): trust it
        pass


class Client:
    def __init__(self, url: str | None = None, timeout: float = DEFAULT_TIMEOUT_S,
                 operation_timeout: float | None = None, *,
                 tls_trust_certs_file: str | None = None, tls_cert_file: str | None = None,
                 tls_key_file: str | None = None, auth_token: AuthToken | None = None):
        """A client of the broker at `url` (default $SHADOWTOPIC_URL or localhost:6650).
        `timeout`: the longest one call may take. `operation_timeout` (default: `timeout`):
        how long opening a producer, consumer or reader, and an admin call, keep retrying
        temporary errors before raising the last one (see the module doc).

        TLS (docs/SECURITY.md): with a `shadowtopic+ssl://host:port` URL, or any `tls_`
        file, every broker is dialled with TLS, never plaintext: `tls_trust_certs_file`,
        the CA certificates trusted (default: the system's); `tls_cert_file` and
        `tls_key_file`, this client's certificate (mutual TLS). The files are read again
        for each new connection.

        `auth_token` (docs/SECURITY.md, "Authentication"): the token every call presents;
        the token itself (a string), a file holding it (a `pathlib.Path`, or a
        "file:///path" string: read again at each call, so a rewritten file is followed), or
        a callable returning the current token (called at each call: how a token is
        refreshed). A broker that refuses it answers `Unauthenticated`."""
        self._dial_url, self._dial = client_dial(url, tls_trust_certs_file, tls_cert_file,
                                                 tls_key_file, auth_token)
        self._conn = Connection(self._dial_url, timeout, operation_timeout, self._dial)
        self.url = self._conn.url
        self.admin = Admin(self._conn)
        self._timeout = timeout
        self._operation_timeout = self._conn.operation_timeout
        # per broker address: its connection and its consumer stream (the first is `url`'s)
        self._conns: dict[str, Connection] = {self.url: self._conn}
        self._muxes: dict[str, Multiplexer] = {}
        self._lock = threading.Lock()
        self._children: list[Producer | Reader | Consumer | Listeners | TableView] = []
        self._controls: list[ConsumerControl] = []  # the consumers' among the children
        self._closed = False
        # consumers and readers whose stream broke reconnect through it (reconnect.py)
        self._reconnector = Reconnector(self._reroute, self._operation_timeout)
        self._ack_timer = AckTimer()  # every consumer's ack timeouts, one thread (ack_timeout.py)

    def _open(self, topic: str, make: Callable[[TopicMetadata, Connection, Deadline], T]) -> T:
        """`make(meta, conn, deadline)` for `topic`'s metadata and the connection serving it,
        the whole (metadata, lookup, open) retried as one within the operation timeout."""
        def attempt(deadline: Deadline) -> T:
            once = Admin(self._conn, deadline)  # each call once: this attempt is retried
            meta = once.get_topic(topic)
            return make(meta, self._route(meta, once), deadline)
        return self._conn.retry.run(attempt)

    def _route(self, meta: TopicMetadata, admin: Admin) -> Connection:
        """The connection for a topic: by Lookup (any broker answers, so a user names one
        broker and never needs to know which process serves a shadow), followed for a
        shadow, for a source topic another live broker owns (several source brokers), or
        when the asked broker says it does not serve the topic's kind; a source topic
        nobody owns stays with the broker this client was given (it takes it, from a dead
        owner too). A connection per broker, reused."""
        try:
            answer = admin.lookup(meta.topic)
        except (errors.Unimplemented, errors.ServiceUnavailable):
            return self._conn  # no lookup, or no broker for it: the given broker says why
        url = answer.get("brokerUrl") or self.url
        if meta.kind != "shadow" and not answer.get("redirect") and (
                not answer.get("epoch") or url == self.url):
            return self._conn
        with self._lock:
            if self._closed:
                raise errors.AlreadyClosed("client is closed")
            conn = self._conns.get(url)
            if conn is None:
                conn = self._conns[url] = Connection(url, self._timeout,
                                                     self._operation_timeout, self._dial)
            return conn

    def _reroute(self, topic: str, timeout: float) -> tuple[Connection, Multiplexer]:
        """For a consumer or reader that reconnects: the connection serving `topic` now
        (routed as `_open` does, each call once within `timeout`) and its live stream."""
        once = Admin(self._conn, Deadline(timeout))
        conn = self._route(once.get_topic(topic), once)
        return conn, self._multiplexer(conn)

    def create_producer(self, topic: str, producer_name: str = "",
                        **options: Unpack[ProducerOptions]) -> Producer:
        """A producer; options: batch_max_messages, batch_max_bytes, linger_ms, max_inflight,
        idempotent (default True: see source/client/producer.py). It reconnects by itself
        through this client's open path when its stream breaks."""
        topic = canonical(topic)

        def reopen(connect: Callable[[Connection, Deadline], _Stream]) -> _Stream:
            return self._open(topic, lambda meta, conn, deadline: connect(conn, deadline))
        p = self._open(topic, lambda meta, conn, deadline: Producer(
            conn, topic, meta.partitions, producer_name, reopen=reopen, deadline=deadline,
            **options))
        self._children.append(p)
        return p

    def create_reader(self, topic: str, start: str | MessageId = "earliest",
                      inclusive: bool = False, receiver_queue_size: int = 1000,
                      read_compacted: bool = False) -> Reader:
        """A non-durable reader from "earliest", "latest" or a MessageId ("L:E" text too).
        With `read_compacted`, it reads the topic's compacted view: the latest message of
        each key up to the compaction horizon, then every message after it."""
        topic = canonical(topic)
        r = self._open(topic, lambda meta, conn, deadline: Reader(
            conn, self._multiplexer(conn), topic, meta.partitions, start, inclusive,
            receiver_queue_size, subscribe_timeout=deadline.budget(conn.timeout),
            read_compacted=read_compacted, reconnector=self._reconnector))
        self._children.append(r)
        return r

    def read_table(self, topic: str, compacted: bool = False, start: MessageId | str | None = None,
                   end: MessageId | str | None = None, columns: Sequence[str] = (),
                   timeout: float | None = None) -> pa.Table:
        """The messages of `topic` as one pyarrow table (source/client/arrow_reads.py: the
        ledger files' columns and `partition`; only `columns` when given), from `start`
        (inclusive; default the earliest) up to `end` (exclusive; default: every message
        there when called). With `compacted`, the compacted view (the latest message per
        key, deletes included while kept, then every message after the horizon). Works on a
        shadow as on its source. Needs pyarrow (`shadowtopic[arrow]`)."""
        from shadowtopic.client.arrow_reads import read_table
        name = canonical(topic)
        first = None if start is None else MessageId.parse(start) if isinstance(start, str) \
            else start
        last = None if end is None else MessageId.parse(end) if isinstance(end, str) else end
        budget = self._operation_timeout if timeout is None else timeout
        return self._open(name, lambda meta, conn, deadline: read_table(
            conn.channel, name, meta.partitions, compacted, first, last, columns, budget))

    def table_view(self, topic: str, timeout: float | None = None) -> TableView:
        """The latest message of every key of `topic` (all its partitions), kept current by a
        thread of its own (source/client/table_view.py). Returns once it holds every key up
        to the last message that existed when called; `Timeout` after `timeout` seconds
        (default: the client's operation timeout). Works on a shadow as on its source."""
        reader = self.create_reader(topic, "earliest", read_compacted=True)
        try:
            view = TableView(reader, self._operation_timeout if timeout is None else timeout)
        except BaseException:
            self._forget(reader)
            raise
        self._forget(reader)  # the view closes it
        self._children.append(view)
        return view

    def _forget(self, child: Producer | Reader | Consumer | Listeners | TableView) -> None:
        with self._lock:
            if child in self._children:
                self._children.remove(child)

    def subscribe(self, topic: str, subscription_name: str, consumer_type: str = "exclusive",
                  initial_position: str | MessageId | int = "latest", consumer_name: str = "",
                  receiver_queue_size: int = 1000, priority: int = 0,
                  negative_ack_redelivery_delay_ms: int = 1000,
                  on_active_change: Callable[[bool], None] | None = None,
                  read_compacted: bool = False, ack_timeout_ms: int = 0,
                  dead_letter_policy: DeadLetterPolicy | None = None,
                  ack_receipt: bool = False, retry_enable: bool = False) -> Consumer:
        """A consumer of the durable subscription `subscription_name` (created when missing,
        at `initial_position`: "latest" (default, as Pulsar), "earliest", a MessageId or
        "L:E", or a publish time in ms since the epoch). `consumer_type`: "exclusive",
        "shared", "failover" or "key_shared" (any case). `priority`: failover, lower
        values become active first. `on_active_change(is_active)` is called (on a thread of
        the consumer's own) when the broker makes this consumer active or inactive.
        `read_compacted` (Exclusive or Failover only, as in Pulsar): the subscription reads
        the topic's compacted view, the latest message of each key up to the compaction
        horizon and then every message after it.

        `ack_timeout_ms` (0: off, else >= 1000; Pulsar's ackTimeoutMillis): a message
        received and not acknowledged for that long is asked for again, counted as
        redelivered (source/client/ack_timeout.py). `dead_letter_policy`: after
        `max_redeliver_count` redeliveries, the next nack (or ack timeout) of a message sends
        it to the dead-letter topic, created when missing, and acknowledges it here
        (source/client/dead_letter.py).

        `ack_receipt` (Pulsar's ackReceiptEnabled): `acknowledge` and
        `acknowledge_cumulative` return only once the broker applied the ack and wrote the
        subscription's cursor to storage, raising its typed refusal or `Timeout` (the
        operation timeout); `acknowledge_async(msg, callback)` is the form that does not
        wait (source/client/acks.py). Off: acks are fire-and-forget, grouped into ranges.

        `retry_enable` (Pulsar's enableRetry; needs a `dead_letter_policy`): the consumer
        also reads the policy's retry-letter topic (default `<topic>-<subscription>-RETRY`,
        created when missing) under the same subscription, and
        `consumer.reconsume_later(msg, delay_s)` has a message come again after a delay,
        at most `max_redeliver_count` times, then go to the dead-letter topic
        (source/client/retry_letter.py).

        Raises `InvalidArgument` for a bad argument before sending anything, and the broker's
        typed error when it refuses (`ConsumerBusy`: a second exclusive consumer or another
        type than the subscription's; `TooManyConsumers`, `TooManySubscriptions`, ...).
        A temporary error (`TopicNotOwned`, `ServiceUnavailable`, ...) is retried within the
        client's operation timeout, then raised (see the module doc)."""
        check_subscription(subscription_name)
        parse_consumer_type(consumer_type)
        position_pb(initial_position, "initial position")
        check_options(consumer_name, receiver_queue_size, priority,
                      negative_ack_redelivery_delay_ms, on_active_change)
        check_ack_timeout(ack_timeout_ms)
        policy = check_dead_letter_policy(dead_letter_policy)
        if not isinstance(retry_enable, bool):
            raise errors.InvalidArgument(f"retry_enable must be True or False, "
                                         f"got {retry_enable!r}")
        if retry_enable and policy is None:
            raise errors.InvalidArgument("retry_enable needs a dead_letter_policy (its "
                                         "max_redeliver_count bounds the retries)")
        topic = canonical(topic)
        dead_topic = policy.topic_for(topic, subscription_name) if policy else None
        retry_topic = (policy.retry_topic_for(topic, subscription_name)
                       if policy is not None and retry_enable else None)
        if retry_topic is not None and retry_topic in (topic, dead_topic):
            raise errors.InvalidArgument(f"the retry-letter topic {retry_topic} must differ "
                                         f"from the topic and the dead-letter topic")

        def make(meta: TopicMetadata, conn: Connection, deadline: Deadline
                 ) -> ConsumerControl:
            controls: list[ConsumerControl] = []
            dead = (DeadLetters(policy, dead_topic, topic, subscription_name,
                                self._dead_letter_producer)
                    if policy is not None and dead_topic is not None else None)
            Consumer(conn, self._multiplexer(conn), topic, meta.partitions,
                     subscription_name, consumer_type, initial_position, consumer_name,
                     receiver_queue_size, priority, negative_ack_redelivery_delay_ms,
                     on_active_change, wait=False, read_compacted=read_compacted,
                     reconnector=self._reconnector, controls=controls,
                     ack_timeout_ms=ack_timeout_ms, dead_letters=dead,
                     ack_timer=self._ack_timer, ack_receipt=ack_receipt,
                     retry_letters=letters)
            controls[0].await_subscribed(time.monotonic() + deadline.budget(conn.timeout))
            return controls[0]
        letters = (None if retry_topic is None or policy is None or dead_topic is None
                   else self._retry_letters(
                       topic, retry_topic, dead_topic, policy, subscription_name,
                       consumer_type, consumer_name, receiver_queue_size, priority,
                       negative_ack_redelivery_delay_ms, ack_receipt))
        try:
            control = self._open(topic, make)
        except BaseException:
            if letters is not None:
                letters.close()
            raise
        self._children.append(control.consumer)
        self._controls.append(control)
        return control.consumer

    def _retry_letters(self, topic: str, retry_topic: str, dead_topic: str,
                       policy: DeadLetterPolicy, subscription_name: str, consumer_type: str,
                       consumer_name: str, receiver_queue_size: int, priority: int,
                       negative_ack_redelivery_delay_ms: int, ack_receipt: bool
                       ) -> RetryLetters:
        """A consumer of `topic`'s retry-letter topic (created when missing), subscribed
        from the earliest letter, in its `RetryLetters` (source/client/retry_letter.py): the
        consumer of `topic` closes it, it is not among this client's children."""
        self.admin.get_topic(topic)  # (TopicNotFound before a retry topic is made for it)
        try:
            self.admin.create_topic(retry_topic)
        except errors.TopicAlreadyExists:
            pass
        dead = DeadLetters(policy, dead_topic, topic, subscription_name,
                           self._dead_letter_producer, keep_origin=True)

        def make(meta: TopicMetadata, conn: Connection, deadline: Deadline
                 ) -> ConsumerControl:
            controls: list[ConsumerControl] = []
            Consumer(conn, self._multiplexer(conn), retry_topic, meta.partitions,
                     subscription_name, consumer_type, "earliest", consumer_name,
                     receiver_queue_size, priority, negative_ack_redelivery_delay_ms,
                     wait=False, reconnector=self._reconnector, controls=controls,
                     dead_letters=dead, ack_timer=self._ack_timer, ack_receipt=ack_receipt)
            controls[0].await_subscribed(time.monotonic() + deadline.budget(conn.timeout))
            return controls[0]
        control = self._open(retry_topic, make)
        return RetryLetters(control.consumer, retry_topic, topic, dead,
                            self._dead_letter_producer, self._ack_timer, receiver_queue_size)

    def _dead_letter_producer(self, topic: str) -> Producer:
        """A producer of the dead-letter (or retry-letter) topic `topic`, created when
        missing (a consumer's `DeadLetters` or `RetryLetters` asks, and closes it: it is not
        among this client's children)."""
        try:
            self.admin.create_topic(topic)
        except errors.TopicAlreadyExists:
            pass

        def reopen(connect: Callable[[Connection, Deadline], _Stream]) -> _Stream:
            return self._open(topic, lambda meta, conn, deadline: connect(conn, deadline))
        return self._open(topic, lambda meta, conn, deadline: Producer(
            conn, topic, meta.partitions, reopen=reopen, deadline=deadline))

    def subscribe_many(self, topic: str, subscription_names: list[str],
                       consumer_type: str = "exclusive",
                       initial_position: str | MessageId | int = "latest",
                       consumer_name: str = "", receiver_queue_size: int = 1000,
                       message_listener: Callback | None = None,
                       read_compacted: bool = False,
                       frame_listener: FrameCallback | None = None) -> list[Consumer]:
        """One consumer per name in `subscription_names`, all on this client's one stream:
        the subscribes go up together (a few stream messages for thousands of them) and are
        answered together, and the broker writes their metadata in batched etcd
        transactions, so attaching 10,000 subscriptions takes seconds, not a round trip
        each. Options as in `subscribe`, but for `ack_timeout_ms` and
        `dead_letter_policy`, which it does not take yet.

        `message_listener(message, recipients)`: the way to consume at this scale. It is
        called once per message on one thread of this call's own, with every consumer of
        the call that got the message (a broadcast entry comes once per stream for all of
        them); `recipients.acknowledge(message)` acknowledges it for all of them in one
        command (or `recipients.acknowledge(message, some)` for some). Messages then come
        only through the listener, not `receive`. `frame_listener(messages, recipients)`
        instead: called once per frame the broker sent, with all its messages (in order)
        and the consumers that got every one of them.

        All or nothing: when the broker refuses one, every consumer of the call is closed
        and its typed error raised (a temporary error: the whole call is retried within the
        operation timeout first)."""
        names = list(subscription_names)
        for name in names:
            check_subscription(name)
        if len(set(names)) != len(names):
            raise errors.InvalidArgument("subscription names must be distinct")
        kind, _ = parse_consumer_type(consumer_type)
        position_pb(initial_position, "initial position")
        check_options(consumer_name, receiver_queue_size, 0, 1000, None)
        if message_listener is not None and frame_listener is not None:
            raise errors.InvalidArgument("give message_listener or frame_listener, not both")
        for listener in (message_listener, frame_listener):
            if listener is not None:
                check_listener(listener)
        topic = canonical(topic)

        def make(meta: TopicMetadata, conn: Connection, deadline: Deadline
                 ) -> tuple[list[ConsumerControl], Listeners | None]:
            mux = self._multiplexer(conn)
            listeners = (Listeners(message_listener, mux, frame_listener,
                                   cumulative=kind not in ("shared", "key_shared"))
                         if message_listener is not None or frame_listener is not None
                         else None)
            controls: list[ConsumerControl] = []
            try:
                for name in names:
                    Consumer(conn, mux, topic, meta.partitions, name, consumer_type,
                             initial_position, consumer_name, receiver_queue_size,
                             message_listener=listeners, wait=False,
                             read_compacted=read_compacted, reconnector=self._reconnector,
                             controls=controls)
                until = time.monotonic() + deadline.budget(conn.timeout) + len(names) / 1000
                for control in controls:
                    control.await_subscribed(until)
            except BaseException:
                for control in controls:
                    control.consumer.close()
                if listeners is not None:
                    listeners.close()
                raise
            return controls, listeners
        controls, listeners = self._open(topic, make)
        consumers = [control.consumer for control in controls]
        self._children.extend(consumers)
        self._controls.extend(controls)
        if listeners is not None:
            self._children.append(listeners)
        return consumers

    def _multiplexer(self, conn: Connection | None = None) -> Multiplexer:
        """The client's consumer stream to `conn`'s broker (default: the one it was given;
        a broken stream is replaced)."""
        conn = conn or self._conn
        with self._lock:
            if self._closed:
                raise errors.AlreadyClosed("client is closed")
            mux = self._muxes.get(conn.url)
            if mux is None or mux.dead:
                if mux is not None:
                    mux.close()
                mux = self._muxes[conn.url] = Multiplexer(conn)
            return mux

    def close(self) -> None:
        """Close every producer, reader and consumer, then the consumer stream, then the
        channel (even when something before fails). A `read_next` or `receive` waiting in
        another thread raises `AlreadyClosed`; later calls raise it too. Closing twice is a
        no-op."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            children, self._children = self._children, []
            controls, self._controls = self._controls, []
            muxes = list(self._muxes.values())
        self._reconnector.close(wait=False)  # no reconnect attempt starts from now on
        self._ack_timer.close()
        try:
            # consumers first send every close, then wait once for all the answers
            closing = [(control, control.start_close()) for control in controls]
            deadline = time.monotonic() + CLOSE_TIMEOUT_S
            for control, sent in closing:
                try:
                    control.finish_close(sent, deadline)
                except Exception:  # noqa: BLE001 - closing everything regardless
                    pass
            for child in children:
                try:
                    child.close()
                except Exception:  # noqa: BLE001 - closing everything regardless
                    pass
            for mux in muxes:
                mux.close()
            self._reconnector.close()  # its attempts end with their owners and streams
        finally:
            for conn in self._conns.values():
                conn.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
