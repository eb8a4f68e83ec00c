"""The official Python SDK (a2a-sdk 1.3.0) as a client of a running a2ad.

Run by tests/sdk/run (which starts the server); not part of `cargo test`.
Usage: client_check.py BASE_URL API_KEY

Every public method of the SDK client is used against the 1.0 interfaces (JSON-RPC,
HTTP+JSON and gRPC, each picked by the SDK from the agent card) and against the 0.3 interface (the
SDK's compat transport), on the `echo` agent (instant) and the `slow` agent (an echo that
takes a few seconds).
Push notifications are received by a local HTTP server. Exits 1 on the first failure.
"""

import asyncio
import http.server
import json
import sys
import threading
import time
import uuid

import grpc
import httpx
from google.protobuf import struct_pb2
from a2a.client import ClientConfig, ClientFactory
from a2a.client.client import ClientCallContext
from a2a.client.service_parameters import ServiceParametersFactory, with_a2a_extensions
from a2a.types.a2a_pb2 import (
    AuthenticationInfo,
    CancelTaskRequest,
    DeleteTaskPushNotificationConfigRequest,
    GetExtendedAgentCardRequest,
    GetTaskPushNotificationConfigRequest,
    GetTaskRequest,
    ListTaskPushNotificationConfigsRequest,
    ListTasksRequest,
    Message,
    Part,
    Role,
    SendMessageConfiguration,
    SendMessageRequest,
    SubscribeToTaskRequest,
    TaskPushNotificationConfig,
    TaskState,
)

BASE, KEY = sys.argv[1], sys.argv[2]
DEADLINE_S = 30.0
CHECKS = []


class Receiver(http.server.BaseHTTPRequestHandler):
    """Keeps every webhook POST it gets."""

    received = []
    lock = threading.Lock()

    def do_POST(self):  # noqa: N802 (http.server's name)
        body = self.rfile.read(int(self.headers.get("content-length", "0")))
        with Receiver.lock:
            headers = {k.lower(): v for k, v in self.headers.items()}
            Receiver.received.append((headers, body))
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args):
        pass


def check(name, ok, detail=""):
    CHECKS.append(name)
    if not ok:
        print(f"FAIL {name}: {detail}")
        sys.exit(1)
    print(f"ok   {name}")


def user_message(text, task_id=None):
    return Message(
        message_id=str(uuid.uuid4()),
        role=Role.ROLE_USER,
        parts=[Part(text=text)],
        task_id=task_id,
    )


def http_client():
    return httpx.AsyncClient(headers={"x-api-key": KEY}, timeout=DEADLINE_S)


def with_key(d):
    """Call details with the key added (the SDK's channel factory is the caller's to make)."""
    md = grpc.aio.Metadata(*(d.metadata or ()))
    md.add("x-api-key", KEY)
    return grpc.aio.ClientCallDetails(d.method, d.timeout, md, d.credentials, d.wait_for_ready)


# grpc.aio files an interceptor under one kind only: one object per kind.
class UnaryKey(grpc.aio.UnaryUnaryClientInterceptor):
    async def intercept_unary_unary(self, continuation, details, request):
        return await continuation(with_key(details), request)


class StreamKey(grpc.aio.UnaryStreamClientInterceptor):
    async def intercept_unary_stream(self, continuation, details, request):
        return await continuation(with_key(details), request)


def grpc_channel(url):
    # The card's gRPC interface is a bare host:port.
    return grpc.aio.insecure_channel(url, interceptors=[UnaryKey(), StreamKey()])


def client_config(binding, streaming=True):
    return ClientConfig(
        streaming=streaming,
        httpx_client=http_client(),
        supported_protocol_bindings=[binding],
        grpc_channel_factory=grpc_channel,
    )


async def client_on(agent, version, binding, streaming=True):
    from a2a.client.card_resolver import A2ACardResolver

    async with httpx.AsyncClient() as h:
        card = await A2ACardResolver(h, f"{BASE}/api/v1/a2a/{agent}").get_agent_card()
    if binding != "JSONRPC":
        # The SDK picks the card's interface of the binding it is told to speak.
        return ClientFactory(client_config(binding, streaming)).create(card)
    factory = ClientFactory(ClientConfig(streaming=streaming, httpx_client=http_client()))
    keep = [
        i
        for i in card.supported_interfaces
        if i.protocol_version == version and i.protocol_binding == "JSONRPC"
    ]
    if len(keep) != 1:
        check(f"[{version}] the card lists a {version} JSONRPC interface", False, card)
    del card.supported_interfaces[:]
    card.supported_interfaces.extend(keep)
    return factory.create(card)


async def last_task(stream):
    """Drains a send/subscribe stream; returns (number of events, last task seen)."""
    n, task = 0, None
    async for item in stream:
        n += 1
        if isinstance(item, tuple):  # older shape (task, update)
            item = item[0]
        if item.HasField("task"):
            task = item.task
        elif item.HasField("status_update") and task is not None:
            task.status.CopyFrom(item.status_update.status)
        elif item.HasField("message"):
            return n, item.message
    return n, task


async def wait_for(predicate, what):
    deadline = time.monotonic() + DEADLINE_S
    while time.monotonic() < deadline:
        if predicate():
            return True
        await asyncio.sleep(0.05)
    check(what, False, "timed out")
    return False


async def run(version, binding):
    v = f"[{version} {binding}]"
    # Discovery: the SDK resolves the card and picks the 1.0 interface on its own.
    if version == "1.0":
        factory = ClientFactory(client_config(binding))
        auto = await factory.create_from_url(f"{BASE}/api/v1/a2a/echo")
        card = await auto.get_extended_agent_card(GetExtendedAgentCardRequest())
        check(f"{v} GetExtendedAgentCard names the agent", card.name != "", card)
        await auto.close()

    blocking = await client_on("echo", version, binding, streaming=False)
    streaming = await client_on("echo", version, binding, streaming=True)
    slow = await client_on("slow", version, binding, streaming=False)
    slow_stream = await client_on("slow", version, binding, streaming=True)

    # Blocking send: the completed task, its reply in status.message and history.
    n, task = await last_task(blocking.send_message(SendMessageRequest(message=user_message("hello"))))
    check(f"{v} send returns a completed task", task is not None and task.status.state == TaskState.TASK_STATE_COMPLETED, task)
    reply = " ".join(p.text for p in task.status.message.parts)
    check(f"{v} the reply echoes the text", "echo: hello" in reply, reply)
    check(f"{v} history holds the user message and the reply", len(task.history) == 2, task.history)

    # Every part kind: a data part and a file by URL go in, come back in the reply and the
    # task (docs/PROTOCOL.md §12).
    data = struct_pb2.Value()
    data.struct_value.update({"form": {"name": "Ada", "tags": ["x", 1.5, True]}})
    url = "https://files.example/report.pdf"
    content = Message(
        message_id=str(uuid.uuid4()),
        role=Role.ROLE_USER,
        parts=[Part(text="content"), Part(data=data), Part(url=url, filename="report.pdf", media_type="application/pdf")],
    )
    _, ct = await last_task(blocking.send_message(SendMessageRequest(message=content)))
    lines = [p.text for p in ct.status.message.parts if p.HasField("text")]
    check(f"{v} a file by URL is named in the echo", f"file report.pdf (application/pdf, {url})" in lines, lines)
    echoed = [p.data for p in ct.status.message.parts if p.HasField("data")]
    check(f"{v} the data part comes back unchanged", echoed == [data], echoed)
    kept = (await blocking.get_task(GetTaskRequest(id=ct.id))).history[0].parts
    check(f"{v} the task keeps the data part and the URL", len(kept) == 3 and kept[1].data == data and kept[2].url == url, kept)

    # An extension activated by the SDK's own means (service parameters: the A2A-Extensions
    # header, or gRPC metadata): the echo names it, the reply lists it.
    ext = "https://ext.example/trace/v1"
    cx = ClientCallContext(service_parameters=ServiceParametersFactory.create([with_a2a_extensions([ext])]))
    _, et = await last_task(blocking.send_message(SendMessageRequest(message=user_message("ext")), context=cx))
    lines = [p.text for p in et.status.message.parts if p.HasField("text")]
    check(f"{v} an activated extension is named by the echo", f"extensions: {ext}" in lines, lines)
    check(f"{v} the reply lists the activated extension", list(et.status.message.extensions) == [ext], et.status.message)

    # Streaming send: the task first, then updates to completed.
    n, streamed = await last_task(streaming.send_message(SendMessageRequest(message=user_message("stream me"))))
    check(f"{v} streaming send ends completed", streamed is not None and streamed.status.state == TaskState.TASK_STATE_COMPLETED, streamed)
    check(f"{v} the stream carried several events", n >= 2, n)

    # GetTask, with and without history.
    got = await blocking.get_task(GetTaskRequest(id=task.id))
    check(f"{v} GetTask returns the task", got.id == task.id and got.status.state == TaskState.TASK_STATE_COMPLETED, got)
    short = await blocking.get_task(GetTaskRequest(id=task.id, history_length=1))
    check(f"{v} historyLength=1 keeps the last message", len(short.history) == 1, short.history)

    # Unknown task: the SDK's own error type for -32001.
    try:
        await blocking.get_task(GetTaskRequest(id=str(uuid.uuid4())))
        check(f"{v} an unknown task is an error", False, "no error")
    except Exception as e:  # noqa: BLE001 (the SDK raises its own error types)
        check(f"{v} an unknown task is TaskNotFound", "TaskNotFound" in type(e).__name__ or "not found" in str(e).lower(), repr(e))

    # ListTasks (1.0 only; the SDK's 0.3 transport has none).
    if version == "1.0":
        page = await blocking.list_tasks(ListTasksRequest(page_size=100))
        ids = [t.id for t in page.tasks]
        check(f"{v} ListTasks lists this caller's tasks", task.id in ids and streamed.id in ids, ids)

    # Non-blocking send, then cancel.
    config = SendMessageConfiguration(return_immediately=True)
    _, running = await last_task(slow.send_message(SendMessageRequest(message=user_message("cancel me"), configuration=config)))
    check(f"{v} a non-blocking send returns at once", running.status.state in (TaskState.TASK_STATE_SUBMITTED, TaskState.TASK_STATE_WORKING), running)
    canceled = await slow.cancel_task(CancelTaskRequest(id=running.id))
    check(f"{v} CancelTask cancels", canceled.status.state == TaskState.TASK_STATE_CANCELED, canceled)
    try:
        await slow.cancel_task(CancelTaskRequest(id=running.id))
        check(f"{v} canceling twice is an error", False, "no error")
    except Exception as e:  # noqa: BLE001 (the SDK raises its own error types)
        check(f"{v} canceling twice is TaskNotCancelable", "Cancel" in type(e).__name__ or "cancel" in str(e).lower(), repr(e))

    # Subscribe to a running task: the task first, then to completed.
    _, running = await last_task(slow.send_message(SendMessageRequest(message=user_message("follow me"), configuration=config)))
    n, followed = await last_task(slow_stream.subscribe(SubscribeToTaskRequest(id=running.id)))
    check(f"{v} SubscribeToTask follows to completed", followed is not None and followed.status.state == TaskState.TASK_STATE_COMPLETED, followed)

    # Push configurations: create, get, list, delete; deliveries reach the receiver.
    _, running = await last_task(slow.send_message(SendMessageRequest(message=user_message("notify me"), configuration=config)))
    tag = f"{version}-{binding}"
    url = f"http://127.0.0.1:{RECEIVER_PORT}/hook/{tag}"
    created = await slow.create_task_push_notification_config(
        TaskPushNotificationConfig(
            task_id=running.id,
            url=url,
            token="tok-" + tag,
            authentication=AuthenticationInfo(scheme="Bearer", credentials="cred-" + tag),
        )
    )
    check(f"{v} CreateTaskPushNotificationConfig fills the id", created.id != "" and created.url == url, created)
    fetched = await slow.get_task_push_notification_config(
        GetTaskPushNotificationConfigRequest(task_id=running.id, id=created.id)
    )
    check(f"{v} GetTaskPushNotificationConfig returns it", fetched.id == created.id, fetched)
    listed = await slow.list_task_push_notification_configs(ListTaskPushNotificationConfigsRequest(task_id=running.id))
    check(f"{v} ListTaskPushNotificationConfigs lists it", [c.id for c in listed.configs] == [created.id], listed)

    def delivered():
        with Receiver.lock:
            return [
                (h, b)
                for h, b in Receiver.received
                if h.get("authorization") == f"Bearer cred-{tag}"
                and h.get("x-a2a-notification-token") == f"tok-{tag}"
            ]

    def completed_delivered():
        for h, body in delivered():
            text = body.decode()
            if "TASK_STATE_COMPLETED" in text or '"completed"' in text:
                return True
        return False

    await wait_for(completed_delivered, f"{v} the completed event is delivered")
    headers, body = delivered()[-1]
    expected_type = "application/a2a+json" if version == "1.0" else "application/json"
    check(f"{v} deliveries carry {expected_type}", headers.get("content-type", "").startswith(expected_type), headers)
    payload = json.loads(body)
    if version == "1.0":
        check(f"{v} the payload is a StreamResponse", any(k in payload for k in ("task", "statusUpdate", "artifactUpdate")), payload)
    else:
        check(f"{v} the payload is the task", payload.get("kind") == "task" and payload.get("id") == running.id, payload)
    await slow.delete_task_push_notification_config(
        DeleteTaskPushNotificationConfigRequest(task_id=running.id, id=created.id)
    )
    listed = await slow.list_task_push_notification_configs(ListTaskPushNotificationConfigsRequest(task_id=running.id))
    check(f"{v} DeleteTaskPushNotificationConfig removes it", len(listed.configs) == 0, listed)

    # The server counted these calls under the binding the client was to speak.
    label = {"HTTP+JSON": "rest", "GRPC": "grpc"}.get(binding, "jsonrpc")
    dialect = "a2a-1.0" if version == "1.0" else "a2a-0.3"
    method = "SendMessage" if version == "1.0" else "message/send"
    async with httpx.AsyncClient() as h:
        metrics = (await h.get(f"{BASE}/metrics")).text
    series = f'a2ad_requests_total{{dialect="{dialect}",binding="{label}",method="{method}",outcome="ok"}}'
    check(f"{v} the server saw the calls over {binding}", series in metrics, series)

    for c in (blocking, streaming, slow, slow_stream):
        await c.close()


RECEIVER_PORT = 0


async def main():
    global RECEIVER_PORT
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Receiver)
    RECEIVER_PORT = server.server_address[1]
    threading.Thread(target=server.serve_forever, daemon=True).start()
    for version, binding in (
        ("1.0", "JSONRPC"),
        ("1.0", "HTTP+JSON"),
        ("1.0", "GRPC"),
        ("0.3", "JSONRPC"),
    ):
        await run(version, binding)
    server.shutdown()
    print(f"python a2a-sdk: {len(CHECKS)} checks passed")


asyncio.run(main())
