"""Producer.Produce: a stream of batches in, a stream of receipts out, in request order.

Requests arrive as bytes and are read through `RawProduceRequest`, a wire-compatible view in
which each message is the bytes the producer serialized: those bytes are stored as the
entries' `raw` and the request goes to the WAL as it came, so the broker never decodes or
re-encodes a message on the produce path. Requests are read ahead while earlier batches wait
for their fsync, so one stream keeps several batches in the group commit; receipts still
leave in request order. A rejected batch (bad topic, message too big, a full disk:
`StorageFull`, a read-only disk: `StorageReadOnly`, a read-only shadow topic, ...) gets a
receipt with `error` and nothing of it is stored; the stream goes on. A shadow topic is
refused (`NotAllowed`, "topic <shadow> is a read-only shadow of <source>") before any of it
loads. A request carries at most MAX_BATCH_MESSAGES messages: 64 MiB of empty ones (30
million) held the event loop for 7 s, and the topic fenced itself.

Idempotent producing (source/ledger/dedup.py): a producer first sends an attach request
(`attach`, no messages) for each topic it writes, on every new stream. Its receipt names
the producer (the `producer_name` it gave, or one the broker assigns, the same for every
attach of the stream that gives none) and says the highest sequence id stored for that
name on the topic (0: none), from which a producer with a stable name goes on. A name
that another live stream's producer holds on the topic is refused (`ProducerBusy`, as
Pulsar): two writers under one name would drop each other's batches as duplicates. A batch with
a `sequence_id` is checked by the topic's writer; a duplicate is acknowledged with
`duplicate` set and the original's ids (0 when no longer known), and counts in no stats.

Memory (source/broker/memory.py): a request counts in the broker's `ClientMemory` from when
it is read until its task ends; one that does not fit under the cap is refused unread
(`BrokerMemoryFull`). Nothing of a request outlives its task: a refused one's error is kept
without its traceback (whose frames would hold the request), and no local keeps the last
request of a stream that waits for its next one.
"""
from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable

from shadowtopic import failpoints, wire
from shadowtopic.broker import quota
from shadowtopic.broker.authorize import OPEN, Authorizer
from shadowtopic.broker.memory import PRODUCE_FACTOR, STREAM_BYTES, ClientMemory, reader
from shadowtopic.broker.rates import Publisher
from shadowtopic.broker.topic import Topic, effective
from shadowtopic.broker.topics import TopicManager
from shadowtopic.core import errors
from shadowtopic.core.errors import error_status
from shadowtopic.core.names import TopicName
from shadowtopic.core.permissions import Action
from shadowtopic.core.policies import MAX_BATCH_MESSAGES
from shadowtopic.pb.storage.v1 import views_pb2
from shadowtopic.pb.v1 import producer_pb2, producer_pb2_grpc

MAX_INFLIGHT = 64
MAX_PRODUCER_NAME = 256  # characters; the name shows in topic stats


def _request_id(data: bytes) -> int:
    """The request_id (field 3) of a request refused unread, found by walking the fields
    before it (a serializer writes fields in number order); 0 when there is none."""
    try:
        for number, kind, value, _start, _stop in wire.walk(data):
            if number > 3:
                return 0
            if number == 3 and kind == wire.VARINT:
                return value
    except wire.WireError:
        pass
    return 0


def _parse(data: bytes) -> views_pb2.RawProduceRequest | None:
    try:
        return views_pb2.RawProduceRequest.FromString(data)
    except Exception:  # noqa: BLE001 - protobuf's DecodeError: the receipt says so
        return None


class ProducerService(producer_pb2_grpc.ProducerServicer):
    def __init__(self, topics: TopicManager, memory: ClientMemory | None = None,
                 authz: Authorizer = OPEN):
        self.topics = topics
        self.memory = memory if memory is not None else ClientMemory()
        self.authz = authz
        self._names: dict[str, TopicName] = {}
        self._readers: set[asyncio.Task] = set()

    def shutdown(self) -> None:
        """Graceful stop: read no more batches; what was read is still fsynced and acked,
        then each stream ends (the client sees the stream close, nothing acked is lost)."""
        for task in list(self._readers):
            task.cancel()

    def _name(self, text: str) -> TopicName:
        name = self._names.get(text)
        if name is None:
            name = TopicName.parse(text)
            if len(self._names) > 100_000:
                self._names.clear()
            self._names[text] = name
        return name

    async def _append(self, req: views_pb2.RawProduceRequest | None, data: bytes,
                      attached: dict[Topic, Publisher], peer: str, assigned: list[str]
                      ) -> tuple[int, int, int, bool] | producer_pb2.ProduceReceipt:
        if req is None:
            raise errors.InvalidArgument("malformed produce request")
        if len(req.producer_name) > MAX_PRODUCER_NAME:
            raise errors.InvalidArgument(f"producer_name is longer than {MAX_PRODUCER_NAME} "
                                         f"characters ({len(req.producer_name)})")
        if len(req.messages) > MAX_BATCH_MESSAGES:
            raise errors.InvalidArgument(f"a produce request carries at most "
                                         f"{MAX_BATCH_MESSAGES} messages, got {len(req.messages)}")
        name = self._name(req.topic)
        self.authz.require(Action.PRODUCE, name)  # (a stream remembers it)
        topic = await self.topics.writable(name)  # loaded: two dict lookups
        pub = attached.get(topic)
        if pub is None:
            pub = Publisher(req.producer_name, peer)
            topic.attach_producer(pub)
            attached[topic] = pub
        if req.attach:
            if req.producer_name and any(p.producer_name == req.producer_name and p is not pub
                                         for p in topic.producers):
                # two writers under one name would drop each other's batches as duplicates
                raise errors.ProducerBusy(
                    f"a producer named {req.producer_name!r} is already connected to {name}")
            if not req.producer_name and not assigned:
                assigned.append(f"p-{uuid.uuid4().hex[:20]}")
            producer = req.producer_name or assigned[0]
            return producer_pb2.ProduceReceipt(
                producer_name=producer,
                last_sequence_id=topic.write_ledger().dedup.last(producer))
        raws = list(req.messages)
        if not raws:
            raise errors.InvalidArgument("a produce request needs at least one message")
        limit = effective(topic.policies.max_message_size, "max_message_size")
        biggest = max(map(len, raws))
        if biggest > limit:
            raise errors.MessageTooBig(
                f"message of {biggest} bytes exceeds max_message_size {limit} of {name}")
        size = sum(map(len, raws))
        held = quota.admit(topic)  # backlog quota: None, or wait (in order), or raise
        if held is not None:
            await held
        sequence = None
        if req.sequence_id:
            if not req.producer_name:
                raise errors.InvalidArgument("a batch with a sequence_id needs a producer_name")
            sequence = (req.producer_name, req.sequence_id)
        lid, first, duplicate = await topic.write_ledger().append_batch(raws, data, size,
                                                                        sequence)
        if not duplicate:
            topic.counters.add_in(len(raws), size)
            pub.counters.add_in(len(raws), size)
        return lid, first, len(raws), duplicate

    async def _settled(self, work, cost: int):
        """`work`'s result, or the exception it raised (without its traceback and chained
        exceptions, whose frames would keep the request alive); `cost` is released."""
        try:
            return await work
        except Exception as exc:  # noqa: BLE001 - reported in the receipt
            exc.__traceback__ = exc.__context__ = exc.__cause__ = None
            return exc
        finally:
            self.memory.release(cost)

    async def Produce(self, request_iterator, context):
        queue: asyncio.Queue = asyncio.Queue()
        window = asyncio.Semaphore(MAX_INFLIGHT)
        attached: dict[Topic, Publisher] = {}  # a reloaded topic is a new Topic
        opened: set[TopicName] = set()  # topics this stream has checked are current
        assigned: list[str] = []  # the producer name this stream was given, once asked
        peer = context.peer()

        # the raw requests (the service reads bytes: module docstring)
        next_request: Callable[[], Awaitable[bytes | None]] = reader(request_iterator, context)

        async def read_ahead() -> None:
            try:
                while (data := await next_request()) is not None:
                    await window.acquire()
                    cost = PRODUCE_FACTOR * len(data)
                    try:
                        self.memory.admit(cost, "produce request")
                    except errors.BrokerMemoryFull as exc:
                        exc.__traceback__ = None
                        done = asyncio.get_running_loop().create_future()
                        done.set_result(exc)
                        queue.put_nowait((_request_id(data), done))
                        del data, done  # (the queue holds what is needed)
                        continue
                    req = _parse(data)
                    if req is not None:
                        # load a topic (its current incarnation: the stream's first batch to
                        # it checks with etcd) before queueing its first batch, so a later
                        # batch of this stream cannot overtake one that waits for the load;
                        # _append itself never awaits before it appends
                        try:
                            topic = self._name(req.topic)
                            if topic not in opened:
                                await self.topics.writable(topic, fresh=True)
                                opened.add(topic)
                            elif self.topics.loaded(topic) is None:
                                await self.topics.writable(topic)
                        except Exception:  # noqa: BLE001 - _append reports it in the receipt
                            pass
                    task = asyncio.ensure_future(self._settled(
                        self._append(req, data, attached, peer, assigned), cost))
                    queue.put_nowait((req.request_id if req else 0, task))
                    del data, req, task  # the task holds them until it ends
            finally:
                queue.put_nowait(None)

        ahead = asyncio.create_task(read_ahead())
        self._readers.add(ahead)
        self.memory.take(STREAM_BYTES)
        try:
            while True:
                item = await queue.get()
                if item is None:
                    break
                request_id, task = item
                item = None
                try:
                    res = await task
                    task = None
                    if isinstance(res, Exception):  # refused: in-band, the stream goes on
                        receipt = producer_pb2.ProduceReceipt(request_id=request_id,
                                                              error=error_status(res))
                    elif res.__class__ is tuple:
                        lid, first, count, duplicate = res
                        receipt = producer_pb2.ProduceReceipt(
                            request_id=request_id, ledger_id=lid, first_entry_id=first,
                            count=count, duplicate=duplicate)
                        failpoints.hit("produce.before_receipt")
                    else:  # an attach
                        receipt = res
                        receipt.request_id = request_id
                except Exception as exc:  # noqa: BLE001 - reported in-band, stream continues
                    receipt = producer_pb2.ProduceReceipt(request_id=request_id,
                                                          error=error_status(exc))
                finally:
                    window.release()
                res = None
                yield receipt
            await asyncio.gather(ahead, return_exceptions=True)
        finally:
            ahead.cancel()
            self._readers.discard(ahead)
            self.memory.release(STREAM_BYTES)
            for topic, pub in attached.items():
                topic.detach_producer(pub)
