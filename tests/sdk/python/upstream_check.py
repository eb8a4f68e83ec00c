"""a2ad in front of the official SDK servers (tests/sdk/run; the `a2a` backend,
docs/CONFIG.md): each AGENT is an a2ad agent fronting an a2a-sdk or @a2a-js/sdk agent
(upstream_agent.py / upstream_agent.mjs) over one of the bindings that server offers.
Through a2ad's own 1.0 JSON-RPC interface and the seed dialect, for each agent: a blocking
send whose message holds every part kind (text, inline file, file by URL, data) and comes
back whole in the upstream's artifact; a stream whose artifact arrives in two chunks, in
order; a multi-turn conversation (the same upstream context); input-required continued on
the same task; a cancel of a slow upstream task that reaches the upstream.

    upstream_check.py A2AD_BASE KEY UPSTREAM_RPC_URL AGENT [AGENT ...]

UPSTREAM_RPC_URL: the upstream's 1.0 JSON-RPC endpoint, where the cancel is checked.
Exits non-zero when a check fails; prints one line per check.
"""

import json
import sys
import time
import uuid

import httpx

BASE, KEY, UPSTREAM_RPC = sys.argv[1], sys.argv[2], sys.argv[3]
AGENTS = sys.argv[4:]
failures = 0
passed = 0


def check(name, ok, detail=""):
    global failures, passed
    if ok:
        passed += 1
        print(f"ok   {name}")
    else:
        failures += 1
        print(f"FAIL {name}: {detail}")


def rpc(client, url, method, params, headers=None):
    body = {"jsonrpc": "2.0", "id": str(uuid.uuid4()), "method": method, "params": params}
    r = client.post(url, json=body, headers=headers or {})
    r.raise_for_status()
    return r.json()


def events(client, url, method, params):
    """A streaming call's events (1.0 results), to the end of the stream."""
    body = {"jsonrpc": "2.0", "id": 1, "method": method, "params": params}
    out = []
    with client.stream("POST", url, json=body, headers={"accept": "text/event-stream"}) as r:
        data = []
        for line in r.iter_lines():
            if line.startswith("data:"):
                data.append(line[5:].strip())
            elif not line and data:
                out.append(json.loads("\n".join(data)).get("result", {}))
                data = []
    return out


def message(*parts, context=None, task=None):
    m = {"messageId": str(uuid.uuid4()), "role": "ROLE_USER", "parts": list(parts)}
    if context:
        m["contextId"] = context
    if task:
        m["taskId"] = task
    return m


def texts(m):
    return [p["text"] for p in (m or {}).get("parts", []) if "text" in p]


EVERY_PART = [
    {"text": "hello"},
    {"raw": "aGVsbG8=", "mediaType": "text/plain", "filename": "hello.txt"},
    {"url": "https://files.example/report.pdf", "mediaType": "application/pdf", "filename": "report.pdf"},
    {"data": {"k": [1, "two", {"three": True}]}, "mediaType": "application/json"},
]


def kinds(parts):
    return [next(k for k in ("text", "raw", "url", "data") if k in p) for p in parts]


def check_agent(client, agent):
    url = f"{BASE}/api/v1/a2a/{agent}/jsonrpc/v1"
    # Every part kind, there and back (the upstream echoes them in its artifact).
    r = rpc(client, url, "SendMessage", {"message": message(*EVERY_PART)})
    task = r.get("result", {}).get("task", {})
    check(f"{agent}: a blocking send completes", task.get("status", {}).get("state") == "TASK_STATE_COMPLETED", r)
    reply = texts(task.get("status", {}).get("message"))
    check(f"{agent}: the upstream's reply is the task's", reply[:1] == ["echo: hello"], reply)
    arts = task.get("artifacts", [])
    parts = arts[0]["parts"] if arts else []
    check(
        f"{agent}: every part kind passes both ways",
        kinds(parts) == ["text", "raw", "url", "data", "text"]
        and parts[1].get("raw") == "aGVsbG8="
        and parts[1].get("filename") == "hello.txt"
        and parts[2].get("url") == "https://files.example/report.pdf"
        and parts[3].get("data") == {"k": [1, "two", {"three": True}]},
        parts,
    )
    # Multi-turn: the same a2ad context is the same upstream conversation.
    ctx = task.get("contextId")
    again = rpc(client, url, "SendMessage", {"message": message({"text": "again"}, context=ctx)})
    reply = texts(again.get("result", {}).get("task", {}).get("status", {}).get("message"))
    check(f"{agent}: the conversation goes on upstream", reply == ["echo: again", "turn 2"], reply)
    # A stream: the artifact in two chunks, in order, then the end.
    evs = events(client, url, "SendStreamingMessage", {"message": message({"text": "streamed"})})
    chunks = [e["artifactUpdate"] for e in evs if "artifactUpdate" in e]
    check(
        f"{agent}: artifacts stream in order",
        len(chunks) == 2 and not chunks[0].get("append") and chunks[1].get("append")
        and texts(chunks[1]["artifact"]) == ["the end"],
        evs,
    )
    last = evs[-1] if evs else {}
    check(
        f"{agent}: the stream ends completed",
        last.get("statusUpdate", {}).get("status", {}).get("state") == "TASK_STATE_COMPLETED",
        last,
    )
    # input-required, continued on the same task.
    r = rpc(client, url, "SendMessage", {"message": message({"text": "ask me"})})
    asked = r.get("result", {}).get("task", {})
    check(
        f"{agent}: input-required comes through",
        asked.get("status", {}).get("state") == "TASK_STATE_INPUT_REQUIRED"
        and texts(asked["status"].get("message")) == ["what more?"],
        r,
    )
    r = rpc(
        client,
        url,
        "SendMessage",
        {"message": message({"text": "blue"}, context=asked.get("contextId"), task=asked.get("id"))},
    )
    done = r.get("result", {}).get("task", {})
    check(
        f"{agent}: input-required continues the same task",
        done.get("id") == asked.get("id")
        and done.get("status", {}).get("state") == "TASK_STATE_COMPLETED"
        and texts(done["status"].get("message")) == ["got: blue"],
        r,
    )
    # The seed dialect (Evo AI's clients) reaches the same upstream.
    seed = rpc(
        client,
        f"{BASE}/api/v1/a2a/{agent}",
        "message/send",
        {"message": {"role": "user", "parts": [{"type": "text", "text": "seed"}], "messageId": str(uuid.uuid4())}},
    )
    state = seed.get("result", {}).get("status", {}).get("state")
    check(f"{agent}: the seed dialect reaches it", state == "completed", seed)


def check_cancel(client, agent, upstream):
    """A slow task canceled at the front is canceled upstream."""
    url = f"{BASE}/api/v1/a2a/{agent}/jsonrpc/v1"
    r = rpc(
        client,
        url,
        "SendMessage",
        {"message": message({"text": f"slow {agent}"}), "configuration": {"returnImmediately": True}},
    )
    task_id = r.get("result", {}).get("task", {}).get("id")
    # Working upstream first (the upstream has named its task).
    deadline = time.time() + 30
    up_task = None
    while time.time() < deadline and up_task is None:
        listed = rpc(upstream, UPSTREAM_RPC, "ListTasks", {}, {"A2A-Version": "1.0"})
        for t in listed.get("result", {}).get("tasks", []):
            hist = [texts(m) for m in t.get("history", [])]
            if [f"slow {agent}"] in hist and t["status"]["state"] == "TASK_STATE_WORKING":
                up_task = t["id"]
        time.sleep(0.2)
    check(f"{agent}: the slow task works upstream", up_task is not None, "never seen upstream")
    # Let the front note the upstream task before canceling (a cancel before is fine too).
    time.sleep(0.5)
    r = rpc(client, url, "CancelTask", {"id": task_id})
    state = r.get("result", {}).get("status", {}).get("state")
    check(f"{agent}: canceled at the front", state == "TASK_STATE_CANCELED", r)
    seen = None
    deadline = time.time() + 30
    while up_task and time.time() < deadline:
        got = rpc(upstream, UPSTREAM_RPC, "GetTask", {"id": up_task}, {"A2A-Version": "1.0"})
        seen = got.get("result", {}).get("status", {}).get("state")
        if seen == "TASK_STATE_CANCELED":
            break
        time.sleep(0.2)
    check(f"{agent}: the cancel reached the upstream", seen == "TASK_STATE_CANCELED", seen)


def main():
    headers = {"x-api-key": KEY, "A2A-Version": "1.0"}
    with httpx.Client(headers=headers, timeout=60) as client, httpx.Client(timeout=30) as upstream:
        for agent in AGENTS:
            try:
                check_agent(client, agent)
                check_cancel(client, agent, upstream)
            except Exception as e:  # noqa: BLE001 — a check that cannot run fails
                check(f"{agent}: the checks ran", False, repr(e))
    print(f"{passed} passed, {failures} failed")
    sys.exit(1 if failures else 0)


main()
