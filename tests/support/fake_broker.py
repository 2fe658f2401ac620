"""A fake broker for the client's unit suites: a real gRPC server on a free loopback port
that answers lookups and opens, records the client's commands and pushes frames the test
builds (`entry`, `event_frame`, `status`). Its Produce stream answers a producer's attach
with `producer_name` and `last_sequence_id` (with `attach_answers_first`, as the stream
opens, before it reads the attach) and stores every batch in ledger 1 (`produced`)."""
from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import grpc

from shadowtopic.client import Client, errors
from shadowtopic.pb.v1 import admin_pb2 as apb
from shadowtopic.pb.v1 import common_pb2, consumer_pb2, producer_pb2


def entry(ledger: int, entry_id: int, payload: str = "", redelivery_count: int = 0,
          key: str | None = None) -> common_pb2.EncodedEntry:
    msg = common_pb2.Message(payload=(payload or f"m{ledger}:{entry_id}").encode())
    if key is not None:
        msg.key = key.encode()
    return common_pb2.EncodedEntry(ledger_id=ledger, entry_id=entry_id,
                                   publish_time=1000 + entry_id,
                                   redelivery_count=redelivery_count, raw=msg.SerializeToString())


def status(reason: str, message: str = "", code: str = "FAILED_PRECONDITION",
           **details) -> common_pb2.ErrorStatus:
    return common_pb2.ErrorStatus(code=code, reason=reason, message=message or reason,
                                  details=details)


def acked(ack: consumer_pb2.Ack) -> list[tuple[int, int]]:
    """Every (ledger, entry) an Ack names, by id or in a range (the client sends ranges)."""
    return [(i.ledger_id, i.entry_id) for i in ack.ids] + [
        (r.ledger_id, e) for r in ack.ranges for e in range(r.first_entry, r.last_entry + 1)]


def event_frame(handle: int, **event) -> consumer_pb2.ServerFrame:
    return consumer_pb2.ServerFrame(handles=[handle], event=consumer_pb2.Event(**event))


class FakeBroker:
    def __init__(self):
        self.partitions: dict[str, int] = {}
        self.cond = threading.Condition()
        self.log: list[consumer_pb2.ClientCommand] = []
        self.admin_calls: list[tuple[str, object]] = []
        self.streams: list = []
        #: kind -> function(cmd) -> list of frames, replacing the default answer
        self.answers: dict = {}
        #: admin method name -> errors its next calls answer, one each, before it works
        self.admin_errors: dict[str, list[errors.ShadowTopicError]] = {}
        self.admin_counts: dict[str, int] = {}
        self.seek_clamped = False
        self.subscriptions_pages = [["a", "b"], ["c"]]
        #: what a Produce stream answers an attach with: the name it gives the producer and
        #: the highest sequence id it has stored for it
        self.producer_name = "fake-producer-1"
        self.last_sequence_id = 0
        #: how many attaches a Produce stream answers as it opens, before reading them
        self.attach_answers_first = 0
        self.produced: list[producer_pb2.ProduceRequest] = []  # the batches, in order
        self.server = grpc.server(ThreadPoolExecutor(16))
        admin = {
            "GetTopicMetadata": (apb.TopicRequest, self._metadata),
            "ListSubscriptions": (apb.ListSubscriptionsRequest, self._list_subs),
            "ResetCursor": (apb.ResetCursorRequest, self._reset_cursor),
            "CreateSubscription": (apb.CreateSubscriptionRequest, self._record(apb.Empty())),
            "CreateTopic": (apb.CreateTopicRequest, self._record(apb.TopicMetadata())),
            "DeleteSubscription": (apb.DeleteSubscriptionRequest, self._record(
                apb.SubscriptionChange(
                    mark_delete_position="3:4",
                    msg_backlog=7, consumers=1, dry_run=True))),
            "Skip": (apb.SkipRequest, self._record(apb.SubscriptionChange(entries_acked=5))),
            "ClearBacklog": (apb.ClearBacklogRequest, self._record(
                apb.SubscriptionChange(entries_acked=9))),
            "PeekMessages": (apb.PeekMessagesRequest, self._record(apb.PeekMessagesResponse(
                entries=[entry(1, 0, "x", key="k"), entry(1, 1, "y")]))),
        }
        handlers = {name: grpc.unary_unary_rpc_method_handler(
            self._scripted(name, fn), request_deserializer=req.FromString,
            response_serializer=lambda m: m.SerializeToString())
            for name, (req, fn) in admin.items()}
        self.server.add_generic_rpc_handlers([
            grpc.method_handlers_generic_handler("shadowtopic.v1.Admin", handlers),
            grpc.method_handlers_generic_handler("shadowtopic.v1.Consumer", {
                "Connect": grpc.stream_stream_rpc_method_handler(
                    self._connect, request_deserializer=consumer_pb2.ClientMessage.FromString,
                    response_serializer=consumer_pb2.ServerMessage.SerializeToString)}),
            grpc.method_handlers_generic_handler("shadowtopic.v1.Producer", {
                "Produce": grpc.stream_stream_rpc_method_handler(
                    self._produce, request_deserializer=producer_pb2.ProduceRequest.FromString,
                    response_serializer=producer_pb2.ProduceReceipt.SerializeToString)})])
        self.port = self.server.add_insecure_port("127.0.0.1:0")
        self.url = f"127.0.0.1:{self.port}"
        self.server.start()

    # -- admin --
    def _scripted(self, name, fn):
        """`fn`, counted, answering the errors `admin_errors[name]` scripts first."""
        def call(req, context):
            with self.cond:
                self.admin_counts[name] = self.admin_counts.get(name, 0) + 1
                queued = self.admin_errors.get(name)
                err = queued.pop(0) if queued else None
            if err is not None:
                code, details, metadata = errors.to_status(err)
                context.set_trailing_metadata(metadata)
                context.abort(code, details)
            return fn(req, context)
        return call

    def _metadata(self, req, context):
        return apb.TopicMetadata(topic=req.topic, partitions=self.partitions.get(req.topic, 0))

    def _list_subs(self, req, context):
        self.admin_calls.append(("ListSubscriptions", req))
        i = int(req.page.page_token or 0)
        last = i + 1 >= len(self.subscriptions_pages)
        return apb.ListSubscriptionsResponse(subscriptions=self.subscriptions_pages[i],
                                             next_page_token="" if last else str(i + 1))

    def _reset_cursor(self, req, context):
        self.admin_calls.append(("ResetCursor", req))
        return apb.ResetCursorResponse(position=common_pb2.MessageIdData(ledger_id=8, entry_id=2),
                                       clamped=True)

    def _record(self, response):
        def call(req, context):
            self.admin_calls.append((type(req).__name__, req))
            return response
        return call

    # -- producer stream --
    def _attached(self) -> producer_pb2.ProduceReceipt:
        return producer_pb2.ProduceReceipt(producer_name=self.producer_name,
                                           last_sequence_id=self.last_sequence_id)

    def _produce(self, request_iterator, context):
        early = self.attach_answers_first
        for _ in range(early):
            yield self._attached()
        for req in request_iterator:
            if req.attach:
                if early:
                    early -= 1  # answered as the stream opened
                else:
                    yield self._attached()
                continue
            with self.cond:
                first = sum(len(r.messages) for r in self.produced)
                self.produced.append(req)
                self.cond.notify_all()
            yield producer_pb2.ProduceReceipt(request_id=req.request_id, ledger_id=1,
                                              first_entry_id=first, count=len(req.messages))

    # -- consumer stream --
    def _connect(self, request_iterator, context):
        import queue
        out: queue.SimpleQueue = queue.SimpleQueue()
        with self.cond:
            self.streams.append(out)

        def read():
            try:
                for msg in request_iterator:
                    for cmd in msg.commands:
                        frames = self._answer(cmd)
                        with self.cond:
                            self.log.append(cmd)
                            self.cond.notify_all()
                        for f in frames:
                            out.put(f)
            except Exception:  # noqa: BLE001 - the client went away
                pass
            out.put(None)

        threading.Thread(target=read, daemon=True).start()
        while (frame := out.get()) is not None:
            yield consumer_pb2.ServerMessage(frames=[frame])

    def _answer(self, cmd) -> list:
        kind = cmd.WhichOneof("command")
        if kind in self.answers:
            return self.answers[kind](cmd)
        h = cmd.handle
        if kind == "subscribe":
            return [event_frame(h, subscribed=consumer_pb2.Subscribed(
                topic=cmd.subscribe.topic, position=common_pb2.MessageIdData(ledger_id=1),
                created=True))]
        if kind in ("close", "unsubscribe"):
            return [event_frame(h, closed=consumer_pb2.HandleClosed())]
        if kind == "seek":
            pos = cmd.seek.position
            landed = (pos.message_id if pos.HasField("message_id")
                      else common_pb2.MessageIdData(ledger_id=4, entry_id=0))
            return [event_frame(h, seek_done=consumer_pb2.SeekDone(
                position=landed, clamped=self.seek_clamped))]
        return []

    def push(self, *frames) -> None:
        """Frames down the newest stream, in one ServerMessage each."""
        with self.cond:
            out = self.streams[-1]
        for f in frames:
            out.put(f)

    def entries(self, handle: int, *items, redeliveries=()) -> None:
        self.push(consumer_pb2.ServerFrame(handles=[handle], entries=list(items),
                                           redeliveries=list(redeliveries)))

    def commands(self, kind: str | None = None, handle: int | None = None) -> list:
        with self.cond:
            return [c for c in self.log if (kind is None or c.WhichOneof("command") == kind)
                    and (handle is None or c.handle == handle)]

    def wait_for(self, kind: str, pred=lambda c: True, count: int = 1, timeout: float = 5.0):
        deadline = time.monotonic() + timeout
        with self.cond:
            while True:
                found = [c for c in self.log if c.WhichOneof("command") == kind and pred(c)]
                if len(found) >= count:
                    return found[count - 1]
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"no {kind} command came; got "
                                         f"{[c.WhichOneof('command') for c in self.log]}")
                self.cond.wait(left)

    def sync(self, client: Client) -> None:
        """Wait until every command the client sent so far has reached the fake (a flow of
        0 permits on an unused handle is a harmless marker)."""
        marker = 10_000_000 + len(self.log)
        client._multiplexer().send(consumer_pb2.ClientCommand(handle=marker,
                                                              flow=consumer_pb2.Flow()))
        self.wait_for("flow", lambda c: c.handle == marker)

    def stop(self) -> None:
        self.server.stop(0)
