// An @a2a-js/sdk agent that a2ad fronts in tests/sdk/run: the official server over JSON-RPC,
// HTTP+JSON and gRPC, in memory, with the same echo-like executor as
// tests/sdk/python/upstream_agent.py.
//
//     node upstream_agent.mjs HTTP_PORT GRPC_PORT
//
// "ask ...": input-required ("what more?"), the next message completes it ("got: <text>");
// "slow ...": working for up to a minute (a cancel stops it); anything else: working
// ("working on it"), an artifact `echo` in two chunks (the message's parts as they came, then
// "the end"), completed "echo: <text>" and "turn <n>".

import crypto from "node:crypto";
import express from "express";
import * as grpc from "@grpc/grpc-js";
import { AgentCard, Role, TaskState } from "@a2a-js/sdk";
import { DefaultRequestHandler, InMemoryTaskStore } from "@a2a-js/sdk/server";
import {
  agentCardHandler,
  jsonRpcHandler,
  restHandler,
  UserBuilder,
} from "@a2a-js/sdk/server/express";
import { A2AService, grpcService } from "@a2a-js/sdk/server/grpc";

const [httpPort, grpcPort] = process.argv.slice(2).map(Number);
const base = `http://127.0.0.1:${httpPort}`;

const card = AgentCard.fromJSON({
  name: "JavaScript upstream",
  description: "An @a2a-js/sdk agent behind a2ad",
  version: "1.0.0",
  capabilities: { streaming: true },
  defaultInputModes: ["text/plain", "application/json", "*/*"],
  defaultOutputModes: ["text/plain", "application/json"],
  skills: [{ id: "echo", name: "Echo", description: "Echoes", tags: ["echo"] }],
  supportedInterfaces: [
    { url: `${base}/rpc`, protocolBinding: "JSONRPC", protocolVersion: "1.0" },
    { url: `${base}/rest`, protocolBinding: "HTTP+JSON", protocolVersion: "1.0" },
    { url: `127.0.0.1:${grpcPort}`, protocolBinding: "GRPC", protocolVersion: "1.0" },
  ],
});

const text = (t) => ({ content: { $case: "text", value: t }, metadata: undefined, filename: "", mediaType: "" });

function agentMessage(taskId, contextId, ...texts) {
  return {
    messageId: crypto.randomUUID(),
    contextId,
    taskId,
    role: Role.ROLE_AGENT,
    parts: texts.map(text),
    metadata: undefined,
    extensions: [],
    referenceTaskIds: [],
  };
}

function status(taskId, contextId, state, message) {
  return {
    kind: "statusUpdate",
    data: {
      taskId,
      contextId,
      status: { state, message, timestamp: new Date().toISOString() },
      metadata: undefined,
    },
  };
}

function chunk(taskId, contextId, parts, append, lastChunk) {
  return {
    kind: "artifactUpdate",
    data: {
      taskId,
      contextId,
      artifact: { artifactId: "echo", name: "echo", description: "", parts, metadata: undefined, extensions: [] },
      append,
      lastChunk,
      metadata: undefined,
    },
  };
}

const turns = new Map();
const canceled = new Set();
const contexts = new Map();

const executor = {
  async execute(ctx, bus) {
    const { taskId, contextId } = ctx;
    const message = ctx.userMessage;
    const said = message.parts
      .filter((p) => p.content?.$case === "text")
      .map((p) => p.content.value)
      .join("\n");
    const continuing = [TaskState.TASK_STATE_INPUT_REQUIRED, TaskState.TASK_STATE_AUTH_REQUIRED].includes(
      ctx.task?.status?.state,
    );
    // The first event of every turn is the task; a continued task is working again.
    const task = ctx.task
      ? { ...ctx.task, status: { state: TaskState.TASK_STATE_WORKING, message: undefined, timestamp: new Date().toISOString() } }
      : {
          id: taskId,
          contextId,
          status: { state: TaskState.TASK_STATE_SUBMITTED, message: undefined, timestamp: new Date().toISOString() },
          artifacts: [],
          history: [message],
          metadata: undefined,
        };
    contexts.set(taskId, contextId);
    bus.publish({ kind: "task", data: task });
    const turn = (turns.get(contextId) ?? 0) + 1;
    turns.set(contextId, turn);
    const say = (...t) => agentMessage(taskId, contextId, ...t);
    if (continuing) {
      bus.publish(status(taskId, contextId, TaskState.TASK_STATE_COMPLETED, say(`got: ${said}`)));
    } else if (said.startsWith("ask")) {
      bus.publish(status(taskId, contextId, TaskState.TASK_STATE_INPUT_REQUIRED, say("what more?")));
    } else {
      bus.publish(status(taskId, contextId, TaskState.TASK_STATE_WORKING, say("working on it")));
      if (said.startsWith("slow")) {
        for (let i = 0; i < 600 && !canceled.has(taskId); i++) {
          await new Promise((r) => setTimeout(r, 100));
        }
        if (canceled.has(taskId)) {
          bus.finished();
          return;
        }
        bus.publish(status(taskId, contextId, TaskState.TASK_STATE_COMPLETED, say("slept")));
      } else {
        bus.publish(chunk(taskId, contextId, message.parts, false, false));
        bus.publish(chunk(taskId, contextId, [text("the end")], true, true));
        bus.publish(status(taskId, contextId, TaskState.TASK_STATE_COMPLETED, say(`echo: ${said}`, `turn ${turn}`)));
      }
    }
    bus.finished();
  },
  async cancelTask(taskId, bus) {
    canceled.add(taskId);
    bus.publish(status(taskId, contexts.get(taskId) ?? "", TaskState.TASK_STATE_CANCELED, undefined));
    bus.finished();
  },
};

const store = new InMemoryTaskStore();
const handler = new DefaultRequestHandler(card, store, executor);
const userBuilder = UserBuilder.noAuthentication;

const app = express();
app.use("/.well-known/agent-card.json", agentCardHandler({ agentCardProvider: handler }));
app.use("/rpc", jsonRpcHandler({ requestHandler: handler, userBuilder }));
app.use("/rest", restHandler({ requestHandler: handler, userBuilder }));

const server = new grpc.Server();
server.addService(A2AService, grpcService({ requestHandler: handler, userBuilder }));
server.bindAsync(`127.0.0.1:${grpcPort}`, grpc.ServerCredentials.createInsecure(), (err) => {
  if (err) {
    console.error(err);
    process.exit(1);
  }
  app.listen(httpPort, "127.0.0.1", () => console.log(`upstream at ${base}`));
});
