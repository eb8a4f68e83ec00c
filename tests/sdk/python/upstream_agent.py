"""An a2a-sdk (Python) agent that a2ad fronts in tests/sdk/run: the official server over
JSON-RPC (1.0 and 0.3), HTTP+JSON and gRPC, in memory, with an echo-like executor.

    upstream_agent.py HTTP_PORT GRPC_PORT

What it does with a message (its text):
- "ask ...": input-required ("what more?"); the next message of the task completes it
  ("got: <text>").
- "slow ...": working for up to a minute, then completed; a cancel stops it.
- anything else: working ("working on it"), an artifact `echo` in two chunks (the message's
  parts, every kind as it came, then a text "the end"), completed "echo: <text>" and
  "turn <n>" (the messages seen in its context so far).
"""

import asyncio
import sys

import grpc
import uvicorn
from starlette.applications import Starlette

from a2a.helpers import get_message_text, new_task_from_user_message, new_text_part
from a2a.server.agent_execution import AgentExecutor, RequestContext
from a2a.server.events import EventQueue
from a2a.server.request_handlers import DefaultRequestHandler, GrpcHandler
from a2a.server.routes import (
    create_agent_card_routes,
    create_jsonrpc_routes,
    create_rest_routes,
)
from a2a.server.tasks import InMemoryTaskStore, TaskUpdater
from a2a.types import (
    AgentCapabilities,
    AgentCard,
    AgentInterface,
    AgentSkill,
    TaskState,
    a2a_pb2_grpc,
)


class Echo(AgentExecutor):
    def __init__(self):
        self.turns: dict[str, int] = {}

    async def execute(self, context: RequestContext, event_queue: EventQueue) -> None:
        message = context.message
        text = get_message_text(message)
        task = context.current_task
        continuing = task is not None and task.status.state in (
            TaskState.TASK_STATE_INPUT_REQUIRED,
            TaskState.TASK_STATE_AUTH_REQUIRED,
        )
        if task is None:
            task = new_task_from_user_message(message)
            task.id = context.task_id or task.id
            task.context_id = context.context_id or task.context_id
            await event_queue.enqueue_event(task)
        updater = TaskUpdater(event_queue, task.id, task.context_id)
        turn = self.turns.get(task.context_id, 0) + 1
        self.turns[task.context_id] = turn
        say = lambda *texts: updater.new_agent_message([new_text_part(t) for t in texts])
        if continuing:
            await updater.complete(say(f"got: {text}"))
            return
        if text.startswith("ask"):
            await updater.requires_input(say("what more?"))
            return
        await updater.start_work(say("working on it"))
        if text.startswith("slow"):
            for _ in range(600):
                await asyncio.sleep(0.1)
            await updater.complete(say("slept"))
            return
        await updater.add_artifact(
            list(message.parts), artifact_id="echo", name="echo", append=False, last_chunk=False
        )
        await updater.add_artifact(
            [new_text_part("the end")], artifact_id="echo", append=True, last_chunk=True
        )
        await updater.complete(say(f"echo: {text}", f"turn {turn}"))

    async def cancel(self, context: RequestContext, event_queue: EventQueue) -> None:
        task = context.current_task
        if task is not None:
            await TaskUpdater(event_queue, task.id, task.context_id).cancel()


async def main(http_port: int, grpc_port: int) -> None:
    base = f"http://127.0.0.1:{http_port}"
    card = AgentCard(
        name="Python upstream",
        description="An a2a-sdk agent behind a2ad",
        version="1.0.0",
        capabilities=AgentCapabilities(streaming=True),
        default_input_modes=["text/plain", "application/json", "*/*"],
        default_output_modes=["text/plain", "application/json"],
        skills=[AgentSkill(id="echo", name="Echo", description="Echoes", tags=["echo"])],
        supported_interfaces=[
            AgentInterface(url=f"{base}/rpc", protocol_binding="JSONRPC", protocol_version="1.0"),
            AgentInterface(url=f"{base}/rest", protocol_binding="HTTP+JSON", protocol_version="1.0"),
            AgentInterface(url=f"127.0.0.1:{grpc_port}", protocol_binding="GRPC", protocol_version="1.0"),
            AgentInterface(url=f"{base}/rpc", protocol_binding="JSONRPC", protocol_version="0.3"),
        ],
    )
    handler = DefaultRequestHandler(
        agent_executor=Echo(), task_store=InMemoryTaskStore(), agent_card=card
    )
    routes = [
        *create_agent_card_routes(card),
        *create_jsonrpc_routes(handler, "/rpc", enable_v0_3_compat=True),
        *create_rest_routes(handler, path_prefix="/rest"),
    ]
    server = grpc.aio.server()
    a2a_pb2_grpc.add_A2AServiceServicer_to_server(GrpcHandler(handler), server)
    server.add_insecure_port(f"127.0.0.1:{grpc_port}")
    await server.start()
    config = uvicorn.Config(
        Starlette(routes=routes), host="127.0.0.1", port=http_port, log_level="warning"
    )
    print(f"upstream at {base}", flush=True)
    await uvicorn.Server(config).serve()
    await server.stop(1)


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]), int(sys.argv[2])))
