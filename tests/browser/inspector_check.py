"""The inspector (/ui) in a real browser: Debian's headless Chromium driven over WebDriver
(chromium-driver) by Selenium, against a real a2ad and a real local webhook receiver.

    inspector_check.py BASE_URL ALICE_KEY BOB_KEY SCREENSHOT_DIR UPSTREAM_PORT

The server (tests/browser/run starts it) has the keys of two principals, alice (every
agent) and bob (echo only), the agents `echo`, `slow` (40 s, 20 progress steps) and `llm`
(the openai backend, against the OpenAI-compatible upstream this check runs on
UPSTREAM_PORT, which streams its answer token by token), and webhooks to 127.0.0.1 allowed. Every wait polls a condition up to a generous deadline.
Prints one line per check and closes with 'inspector: N passed, N failed'.
"""

import base64
import json
import os
import sys
import tempfile
import threading
import time
import traceback
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from selenium import webdriver
from selenium.common.exceptions import StaleElementReferenceException, WebDriverException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.support.ui import Select, WebDriverWait

BASE, ALICE, BOB, SHOTS = sys.argv[1:5]
UPSTREAM_PORT = int(sys.argv[5])
DEADLINE = 45  # seconds for any one condition on a busy 2-core machine

passed = 0
failed = 0


def check(name):
    def run(fn):
        global passed, failed
        try:
            fn()
            passed += 1
            print(f"ok   {name}", flush=True)
        except Exception:  # noqa: BLE001 - every failure is reported and counted
            failed += 1
            print(f"FAIL {name}", flush=True)
            traceback.print_exc()
            shot(f"failed-{name.replace(' ', '-')}")
        return fn

    return run


# --- a webhook receiver ---------------------------------------------------------------

received = []


class Receiver(BaseHTTPRequestHandler):
    def do_POST(self):  # noqa: N802 - the http.server name
        length = int(self.headers.get("content-length", "0"))
        body = self.rfile.read(length)
        received.append({"event": self.headers.get("x-webhook-event"), "body": body})
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args):
        pass


receiver = ThreadingHTTPServer(("127.0.0.1", 0), Receiver)
threading.Thread(target=receiver.serve_forever, daemon=True).start()
HOOK_URL = f"http://127.0.0.1:{receiver.server_address[1]}/hook"


# --- an OpenAI-compatible upstream that streams its answer ----------------------------

TOKENS = ["Hello", " from", " a", " streaming", " model"]


class Upstream(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_POST(self):  # noqa: N802 - the http.server name
        self.rfile.read(int(self.headers.get("content-length", "0")))
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.send_header("connection", "close")
        self.end_headers()
        for token in TOKENS:
            chunk = {"choices": [{"index": 0, "delta": {"content": token}}]}
            self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
            self.wfile.flush()
            time.sleep(0.3)
        self.wfile.write(b"data: [DONE]\n\n")
        self.wfile.flush()
        self.close_connection = True

    def log_message(self, *args):
        pass


upstream = ThreadingHTTPServer(("127.0.0.1", UPSTREAM_PORT), Upstream)
threading.Thread(target=upstream.serve_forever, daemon=True).start()


def http(method, path, key, body=None, headers=None):
    req = urllib.request.Request(BASE + path, method=method)
    req.add_header("x-api-key", key)
    req.add_header("A2A-Version", "1.0")
    for k, v in (headers or {}).items():
        req.add_header(k, v)
    data = None
    if body is not None:
        data = json.dumps(body).encode()
        req.add_header("content-type", "application/json")
    with urllib.request.urlopen(req, data, timeout=30) as r:
        return json.loads(r.read() or b"{}")


# --- the browser ----------------------------------------------------------------------

options = webdriver.ChromeOptions()
options.binary_location = os.environ.get("CHROMIUM", "/usr/bin/chromium")
for arg in ["--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
            "--window-size=1366,900", "--no-first-run", "--disable-extensions"]:
    options.add_argument(arg)
options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
service = Service(executable_path=os.environ.get("CHROMEDRIVER", "/usr/bin/chromedriver"))
driver = webdriver.Chrome(service=service, options=options)
driver.set_page_load_timeout(60)


def shot(name):
    try:
        driver.save_screenshot(os.path.join(SHOTS, f"{name}.png"))
    except WebDriverException:
        pass


def wait(cond, what):
    def safe(d):
        try:
            return cond(d)
        except (StaleElementReferenceException, WebDriverException):
            return False

    return WebDriverWait(driver, DEADLINE, poll_frequency=0.2).until(safe, message=what)


def by_id(i):
    return driver.find_element(By.ID, i)


def nav(view):
    driver.find_element(By.CSS_SELECTOR, f'#nav button[data-view="{view}"]').click()
    wait(lambda d: by_id(f"view-{view}").is_displayed(), f"the {view} view shows")


def bubbles():
    return driver.find_elements(By.CSS_SELECTOR, "#transcript .bubble.agent")


def send_chat(text, state="completed"):
    before = len(bubbles())
    box = by_id("message")
    box.clear()
    box.send_keys(text)
    by_id("send").click()
    wait(lambda d: len(bubbles()) > before, "an agent bubble appears")
    reply = bubbles()[-1]
    if state:
        wait(lambda d: reply.get_attribute("data-state") == state, f"the reply reaches {state}")
    return reply


CUT_FIRST_RESUBSCRIBE = r"""
window.__resubscribes = [];
const original = window.fetch;
window.fetch = async (url, init) => {
  const res = await original(url, init);
  if (!String(init && init.body).includes('tasks/resubscribe')) return res;
  window.__resubscribes.push(init.headers['last-event-id']);
  if (window.__resubscribes.length > 1) return res;
  const reader = res.body.getReader();
  const decoder = new TextDecoder();
  let buffer = '';
  let frames = 0;
  const cut = new ReadableStream({ async pull(c) {
    // Cut once the two frames were read (an error drops what is still queued).
    if (frames === 2) { reader.cancel(); c.error(new TypeError('network error (cut by the test)')); return; }
    const { value, done } = await reader.read();
    if (done) { c.close(); return; }
    buffer += decoder.decode(value, { stream: true });
    let at;
    while (frames < 2 && (at = buffer.indexOf('\n\n')) >= 0) {
      const frame = buffer.slice(0, at + 2);
      buffer = buffer.slice(at + 2);
      c.enqueue(new TextEncoder().encode(frame));
      if (frame.includes('data:')) frames += 1;
    }
  } });
  return new Response(cut, { status: res.status, headers: res.headers });
};
"""


def severe_logs():
    return [e for e in driver.get_log("browser") if e.get("level") == "SEVERE"]


try:
    @check("a wrong key gets a clear message and no access")
    def _():
        driver.get(BASE + "/ui/")
        wait(lambda d: by_id("credential").is_displayed(), "the sign-in form")
        by_id("credential").send_keys("not-a-valid-key-at-all")
        driver.find_element(By.CSS_SELECTOR, "#signin-form button").click()
        wait(lambda d: by_id("signin-error").is_displayed(), "the error")
        msg = by_id("signin-error").text
        assert "not accepted" in msg and "invalid API key" in msg, msg
        assert not by_id("nav").is_displayed()
        shot("signin-refused")

    @check("sign in with a key: agents listed with their cards checked and live metrics")
    def _():
        box = by_id("credential")
        box.clear()
        box.send_keys(ALICE)
        driver.find_element(By.CSS_SELECTOR, "#signin-form button").click()
        wait(lambda d: by_id("nav").is_displayed(), "signed in")
        assert "alice" in by_id("principal").text
        names = [b.get_attribute("data-agent") for b in driver.find_elements(By.CSS_SELECTOR, "#agent-list button")]
        assert names == ["echo", "slow", "llm", "private", "broken"], names
        wait(lambda d: "checks pass" in by_id("agent-detail").text, "the card check")
        wait(lambda d: "totalRequests" in by_id("agent-detail").text, "live metrics")
        detail = by_id("agent-detail").text
        assert "JSONRPC 1.0" in detail, detail
        stored = driver.execute_script("return sessionStorage.getItem('a2ad.credential')")
        assert stored == ALICE
        assert driver.execute_script("return localStorage.length") == 0
        shot("agents")

    @check("a private card is said not to be served (its URL answers 404), the extended card checked")
    def _():
        driver.find_element(By.CSS_SELECTOR, '#agent-list button[data-agent="private"]').click()
        wait(lambda d: "Not served" in by_id("public-card-state").text
             and "404" in by_id("public-card-state").text, "the public card said not served (404)")
        wait(lambda d: "checks pass" in by_id("agent-detail").text.split("Extended card")[1], "the extended card checked")
        # The checks are under the extended card, never under the public one.
        public = by_id("agent-detail").text.split("Public card (A2A 1.0)")[1].split("Extended card")[0]
        assert "checks pass" not in public, public
        driver.find_element(By.CSS_SELECTOR, '#agent-list button[data-agent="echo"]').click()
        wait(lambda d: "checks pass" in by_id("agent-detail").text.split("Extended card")[0], "echo's public card checked")

    # Bob's task, which alice must never see.
    bob_task = http("POST", "/api/v1/a2a/echo/rest/message:send", BOB, {
        "message": {"messageId": "bob-m-1", "role": "ROLE_USER", "parts": [{"text": "bob's secret"}]}})["task"]["id"]

    @check("chat streams a reply and continues the conversation (seed wire)")
    def _():
        nav("chat")
        Select(by_id("chat-agent")).select_by_value("echo")
        Select(by_id("chat-wire")).select_by_value("seed")
        assert by_id("chat-stream").is_selected()
        reply = send_chat("hello inspector")
        assert "echo: hello inspector" in reply.text and "turn 1" in reply.text, reply.text
        context = by_id("chat-context").text
        assert context != "new"
        reply = send_chat("and again")
        assert "turn 2" in reply.text, reply.text
        assert by_id("chat-context").text == context
        frames = driver.find_elements(By.CSS_SELECTOR, "#raw li.frame")
        assert len(frames) >= 3, "the raw panel shows the SSE frames"
        raw = by_id("raw").text
        assert "message/stream" in raw and "Bearer ••••••" in raw and ALICE not in raw

    @check("chat over A2A 1.0 JSON-RPC and HTTP+JSON, streamed and not")
    def _():
        for wire in ["v1", "rest"]:
            Select(by_id("chat-wire")).select_by_value(wire)
            reply = send_chat(f"over {wire}")
            assert f"echo: over {wire}" in reply.text, reply.text
            reply = send_chat(f"more {wire}")
            assert "turn 2" in reply.text, reply.text
        by_id("chat-stream").click()  # off: a blocking send
        reply = send_chat("not streamed")
        assert "echo: not streamed" in reply.text
        by_id("chat-stream").click()
        raw = by_id("raw").text
        assert "SendStreamingMessage" in raw and "/rest/message:stream" in raw and "/rest/message:send" in raw

    @check("switching wire keeps the conversation shown; a failed send keeps the typed text")
    def _():
        before = len(bubbles())
        Select(by_id("chat-wire")).select_by_value("v1")
        assert len(bubbles()) == before, "the transcript stays"
        dividers = driver.find_elements(By.CSS_SELECTOR, "#transcript li.divider")
        assert dividers and "New conversation" in dividers[-1].text, [d.text for d in dividers]
        assert by_id("chat-context").text == "new"
        # The next send fails in the network: what was typed comes back to the editor.
        driver.execute_script("""
          const original = window.fetch;
          window.fetch = async () => { window.fetch = original; throw new TypeError('network down (the test)'); };""")
        box = by_id("message")
        box.clear()
        box.send_keys("do not lose me")
        by_id("send").click()
        wait(lambda d: d.find_elements(By.CSS_SELECTOR, "#transcript .bubble.error"), "the error shown")
        assert box.get_attribute("value") == "do not lose me", box.get_attribute("value")
        box.clear()

    @check("a small file is checked and sent; a refused type never leaves the browser")
    def _():
        Select(by_id("chat-wire")).select_by_value("seed")
        folder = tempfile.mkdtemp()
        good = os.path.join(folder, "notes.txt")
        with open(good, "w") as f:
            f.write("a small text file\n")
        bad = os.path.join(folder, "archive.zip")
        with open(bad, "wb") as f:
            f.write(b"PK\x03\x04" + b"\x00" * 26)
        driver.execute_script("arguments[0].hidden = false", by_id("file-input"))
        by_id("file-input").send_keys(bad)
        wait(lambda d: by_id("compose-error").is_displayed(), "the type refusal")
        assert "application/zip" in by_id("compose-error").text, by_id("compose-error").text
        by_id("file-input").send_keys(good)
        wait(lambda d: "notes.txt" in by_id("attachments").text, "the attachment")
        reply = send_chat("with a file")
        assert "file notes.txt (text/plain, 18 bytes)" in reply.text, reply.text
        driver.execute_script("arguments[0].hidden = true", by_id("file-input"))
        shot("chat")

    @check("files dropped on the chat: over the agent's size limit refused, a small one sent")
    def _():
        drop = """
            const [name, type, size] = arguments;
            const dt = new DataTransfer();
            const bytes = size === null ? new TextEncoder().encode('{"a":1}') : new Uint8Array(size);
            dt.items.add(new File([bytes], name, { type }));
            const zone = document.getElementById('dropzone');
            for (const kind of ['dragover', 'drop']) {
              zone.dispatchEvent(new DragEvent(kind, { dataTransfer: dt, bubbles: true, cancelable: true }));
            }"""
        driver.execute_script(drop, "big.png", "image/png", 5000)
        wait(lambda d: "over echo's limit of 4096 bytes" in by_id("compose-error").text, "the size refusal")
        assert "big.png" not in by_id("attachments").text
        driver.execute_script(drop, "data.json", "application/json", None)
        wait(lambda d: "data.json" in by_id("attachments").text, "the dropped file attached")
        reply = send_chat("dropped")
        assert "file data.json (application/json, 7 bytes)" in reply.text, reply.text

    @check("an LLM's tokens show as they arrive, then the whole reply")
    def _():
        Select(by_id("chat-agent")).select_by_value("llm")
        Select(by_id("chat-wire")).select_by_value("v1")
        driver.execute_script("""
            window.__seen = [];
            new MutationObserver(() => {
              const b = [...document.querySelectorAll('#transcript .bubble.agent .body')].pop();
              if (b) window.__seen.push(b.textContent);
            }).observe(document.getElementById('transcript'), { subtree: true, childList: true, characterData: true });""")
        reply = send_chat("say something")
        whole = "".join(TOKENS)
        assert reply.find_element(By.CSS_SELECTOR, ".body").text == whole, reply.text
        seen = driver.execute_script("return window.__seen")
        partial = [t for t in seen if t and t != whole and whole.startswith(t) and t != "…"]
        assert len(partial) >= 2, f"tokens shown as they came: {seen}"
        frames = by_id("raw").text
        assert "SendStreamingMessage" in frames

    looks = {}

    def look(b):
        return (b.value_of_css_property("background-color"), b.value_of_css_property("border-left-color"))

    @check("a slow task streams progress and is canceled from the chat")
    def _():
        Select(by_id("chat-agent")).select_by_value("slow")
        reply = send_chat("take your time", state=None)
        wait(lambda d: "progress" in reply.text, "a progress update")
        wait(lambda d: by_id("cancel").is_enabled(), "cancel enabled")
        by_id("cancel").click()
        wait(lambda d: reply.get_attribute("data-state") == "canceled", "canceled")
        assert "canceled" in reply.find_element(By.CSS_SELECTOR, ".state").text
        looks["canceled"] = look(reply)

    @check("Enter sends, Shift+Enter starts a new line, and the placeholder says so")
    def _():
        Select(by_id("chat-agent")).select_by_value("echo")
        box = by_id("message")
        assert "Enter sends" in box.get_attribute("placeholder")
        before = len(bubbles())
        box.clear()
        box.send_keys("first line")
        box.send_keys(Keys.SHIFT, Keys.ENTER)
        box.send_keys("second line")
        assert box.get_attribute("value") == "first line\nsecond line", repr(box.get_attribute("value"))
        assert len(bubbles()) == before, "Shift+Enter sent nothing"
        box.send_keys(Keys.ENTER)
        wait(lambda d: len(bubbles()) > before, "Enter sent it")
        reply = bubbles()[-1]
        wait(lambda d: reply.get_attribute("data-state") == "completed", "completed")
        assert "echo: first line\nsecond line" in reply.text, reply.text
        # A canceled reply (above) does not look like a completed one.
        assert look(reply) != looks["canceled"], (look(reply), looks["canceled"])
        Select(by_id("chat-agent")).select_by_value("slow")

    @check("a send that is not streamed can be canceled from the chat while it runs (seed and 1.0)")
    def _():
        Select(by_id("chat-agent")).select_by_value("slow")
        by_id("chat-stream").click()  # off
        assert not by_id("chat-stream").is_selected()
        for wire in ["seed", "v1"]:
            Select(by_id("chat-wire")).select_by_value(wire)
            reply = send_chat(f"block me over {wire}", state=None)
            wait(lambda d: by_id("cancel").is_enabled(), f"{wire}: cancel enabled while the send runs")
            by_id("cancel").click()
            wait(lambda d: reply.get_attribute("data-state") == "canceled", f"{wire}: canceled")
        by_id("chat-stream").click()  # on again
        assert by_id("chat-stream").is_selected()

    slow = {}

    @check("a webhook configuration on a running task, and its deliveries to a local receiver")
    def _():
        reply = send_chat("webhook me", state=None)
        wait(lambda d: reply.get_attribute("data-task"), "the task id")
        wait(lambda d: reply.get_attribute("data-state") == "working", "working")
        slow["id"] = reply.get_attribute("data-task")
        nav("hooks")
        Select(by_id("hook-agent")).select_by_value("slow")
        for field, value in [("hook-task", slow["id"]), ("hook-url", HOOK_URL), ("hook-token", "tok-123")]:
            by_id(field).clear()
            by_id(field).send_keys(value)
        driver.find_element(By.CSS_SELECTOR, "#hook-form button[type=submit]").click()
        wait(lambda d: len(d.find_elements(By.CSS_SELECTOR, "#hook-rows tr[data-config]")) == 1, "the configuration listed")
        assert HOOK_URL in by_id("hook-rows").text
        wait(lambda d: d.find_elements(By.CSS_SELECTOR, '#delivery-rows tr[data-outcome="delivered"]'), "a delivery shown")
        wait(lambda d: HOOK_URL.split("?")[0] in d.find_element(By.CSS_SELECTOR, '#delivery-rows tr[data-outcome="delivered"] small.url').text,
             "the delivery names the URL it went to")
        row = driver.find_element(By.CSS_SELECTOR, '#delivery-rows tr[data-outcome="delivered"]')
        assert "task.working" in row.text and "200" in row.text and slow["id"] in row.text, row.text
        assert received and received[0]["event"] == "task.working", received[:1]
        shot("webhooks")
        # A second configuration, then deleted: the list follows.
        by_id("hook-token").clear()
        by_id("hook-url").clear()
        by_id("hook-url").send_keys(HOOK_URL + "?second=1")
        driver.find_element(By.CSS_SELECTOR, "#hook-form button[type=submit]").click()
        wait(lambda d: len(d.find_elements(By.CSS_SELECTOR, "#hook-rows tr[data-config]")) == 2, "two configurations")
        second = [r for r in driver.find_elements(By.CSS_SELECTOR, "#hook-rows tr[data-config]") if "second" in r.text][0]
        gone = second.get_attribute("data-config")
        second.find_element(By.CSS_SELECTOR, "button").click()
        wait(lambda d: len(d.find_elements(By.CSS_SELECTOR, "#hook-rows tr[data-config]")) == 1, "one left")
        assert not driver.find_elements(By.CSS_SELECTOR, f'#hook-rows tr[data-config="{gone}"]')

    @check("the task list shows the caller's tasks only, live, with a timeline; cancel from it")
    def _():
        nav("tasks")
        Select(by_id("task-agent")).select_by_value("slow")
        wait(lambda d: d.find_elements(By.CSS_SELECTOR, f'#task-rows tr[data-task="{slow["id"]}"]'), "the slow task listed")
        row = driver.find_element(By.CSS_SELECTOR, f'#task-rows tr[data-task="{slow["id"]}"]')
        assert "working" in row.text, row.text
        # The first timeline stream is cut after two events (in the page, as a dropped
        # connection would be): the inspector resubscribes with Last-Event-ID and the
        # server replays what was missed — no gap, no duplicate (checked below).
        driver.execute_script(CUT_FIRST_RESUBSCRIBE)
        row.find_element(By.CSS_SELECTOR, "button").click()
        wait(lambda d: len(d.find_elements(By.CSS_SELECTOR, "#task-detail .timeline li")) >= 3, "a timeline")
        wait(lambda d: len(d.execute_script("return window.__resubscribes")) >= 2, "a resubscribe")
        sent = driver.execute_script("return window.__resubscribes")
        assert sent[0] == "0" and sent[1] == "2", sent
        first = driver.find_element(By.CSS_SELECTOR, "#task-detail .timeline li")
        assert first.get_attribute("data-event") == "1" and "submitted" in first.text, first.text
        wait(lambda d: by_id("task-cancel").is_enabled(), "cancel enabled")
        shot("tasks")
        by_id("task-cancel").click()
        wait(lambda d: "canceled" in d.find_elements(By.CSS_SELECTOR, "#task-detail .timeline li")[-1].text, "canceled on the timeline")
        wait(lambda d: "Canceled" in by_id("task-reason").text, "the reason shown")
        wait(lambda d: "canceled" in d.find_element(By.CSS_SELECTOR, f'#task-rows tr[data-task="{slow["id"]}"]').text, "the list updates")
        wait(lambda d: any(r["event"] == "task.canceled" for r in received), "the receiver hears the end")
        numbers = [li.get_attribute("data-event") for li in driver.find_elements(By.CSS_SELECTOR, "#task-detail .timeline li")]
        assert numbers == [str(i) for i in range(1, len(numbers) + 1)], numbers
        Select(by_id("task-agent")).select_by_value("echo")
        wait(lambda d: len(d.find_elements(By.CSS_SELECTOR, "#task-rows tr[data-task]")) >= 5, "alice's echo tasks")
        ids = [r.get_attribute("data-task") for r in driver.find_elements(By.CSS_SELECTOR, "#task-rows tr[data-task]")]
        assert bob_task not in ids, "bob's task shows to alice"

    @check("chat sends a data part from its JSON editor; invalid JSON never leaves the browser")
    def _():
        nav("chat")
        Select(by_id("chat-agent")).select_by_value("echo")
        Select(by_id("chat-wire")).select_by_value("v1")
        driver.find_element(By.CSS_SELECTOR, "#data-box summary").click()
        editor = by_id("data-json")
        editor.clear()
        editor.send_keys('{"form": ')
        box = by_id("message")
        box.clear()
        box.send_keys("with data")
        before = len(bubbles())
        by_id("send").click()
        wait(lambda d: by_id("compose-error").is_displayed(), "the JSON error")
        assert "not valid JSON" in by_id("compose-error").text, by_id("compose-error").text
        assert len(bubbles()) == before, "nothing was sent"
        assert by_id("message").get_attribute("value") == "with data", "the typed text is kept"
        editor.clear()
        editor.send_keys('{"form": {"name": "Ada", "n": [1, 2]}}')
        by_id("send").click()
        wait(lambda d: len(bubbles()) > before, "a reply")
        reply = bubbles()[-1]
        wait(lambda d: reply.get_attribute("data-state") == "completed", "completed")
        pre = reply.find_elements(By.CSS_SELECTOR, "pre.part-data")
        assert pre and '"name": "Ada"' in pre[0].text, reply.get_attribute("innerHTML")
        shot("chat-data")

    @check("a task's data parts show as JSON, files by URL as links, with its extensions")
    def _():
        url = "https://files.example/report.pdf"
        task = http("POST", "/api/v1/a2a/echo/rest/message:send", ALICE, {
            "message": {"messageId": "ui-content-1", "role": "ROLE_USER", "parts": [
                {"text": "content"}, {"data": {"k": [1, "two"]}},
                {"url": url, "filename": "report.pdf", "mediaType": "application/pdf"}]}},
            headers={"A2A-Extensions": "https://ext.example/trace/v1"})["task"]["id"]
        nav("tasks")
        Select(by_id("task-agent")).select_by_value("echo")
        wait(lambda d: d.find_elements(By.CSS_SELECTOR, f'#task-rows tr[data-task="{task}"] button'), "the task listed")
        driver.find_element(By.CSS_SELECTOR, f'#task-rows tr[data-task="{task}"] button').click()
        wait(lambda d: d.find_elements(By.CSS_SELECTOR, "#task-detail ol.history pre.part-data"), "the data part")
        # Read inside waits: the detail is drawn again as the view refreshes.
        wait(lambda d: any(
            a.get_attribute("href") == url and "noopener" in (a.get_attribute("rel") or "")
            for a in d.find_elements(By.CSS_SELECTOR, "#task-detail ol.history a")), "the file's link")
        wait(lambda d: by_id("task-extensions").text == "https://ext.example/trace/v1", "the extensions")
        shot("task-content")

    @check("an agent's reply reads as Markdown, built safely; an inline image shows")
    def _():
        nav("chat")
        Select(by_id("chat-agent")).select_by_value("echo")
        Select(by_id("chat-wire")).select_by_value("v1")
        reply = send_chat("**bold** and `code` and [a link](https://example.com/doc) <img src=x onerror=alert(1)>")
        body = reply.find_element(By.CSS_SELECTOR, ".body")
        assert body.find_element(By.TAG_NAME, "strong").text == "bold"
        assert body.find_element(By.TAG_NAME, "code").text == "code"
        link = body.find_element(By.TAG_NAME, "a")
        assert link.get_attribute("href") == "https://example.com/doc" and "noopener" in link.get_attribute("rel")
        assert not body.find_elements(By.TAG_NAME, "img"), "markup stays text"
        assert "<img src=x onerror=alert(1)>" in body.text, body.text
        assert "turn" in body.text
        # A PNG returned inline shows as an image (a data: URL, nothing fetched).
        png = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg=="
        task = http("POST", "/api/v1/a2a/echo/rest/message:send", ALICE, {
            "message": {"messageId": "ui-img-1", "role": "ROLE_USER", "parts": [
                {"text": "a picture"}, {"raw": png, "mediaType": "image/png", "filename": "dot.png"}]}})["task"]["id"]
        driver.get(f"{BASE}/ui/#tasks/echo/{task}")
        # Read inside the wait: the detail is drawn again as the view refreshes.
        wait(lambda d: d.execute_script("""
            const img = document.querySelector('#task-detail ol.history img.part-image');
            return Boolean(img && img.src.startsWith('data:image/png;base64,') && img.complete
              && img.naturalWidth === 1);"""), "the image inline, decoded")

    @check("custom request headers: an extension activated from the chat, kept for the tab, a bad line refused")
    def _():
        nav("chat")
        Select(by_id("chat-agent")).select_by_value("echo")
        Select(by_id("chat-wire")).select_by_value("v1")
        driver.find_element(By.CSS_SELECTOR, "#headers-box summary").click()
        headers = by_id("chat-headers")
        headers.clear()
        headers.send_keys("Authorization: Bearer other")
        box = by_id("message")
        box.clear()
        box.send_keys("keep me")
        by_id("send").click()
        wait(lambda d: by_id("compose-error").is_displayed(), "the refusal")
        assert "set by the inspector" in by_id("compose-error").text, by_id("compose-error").text
        assert by_id("message").get_attribute("value") == "keep me", "the typed text stays"
        headers.clear()
        headers.send_keys("A2A-Extensions: https://ext.example/trace/v1")
        reply = send_chat("with an extension")
        assert "extensions: https://ext.example/trace/v1" in reply.text, reply.text
        entry = driver.find_elements(By.CSS_SELECTOR, "#raw li.exchange")[-1]
        assert "a2a-extensions: https://ext.example/trace/v1" in entry.find_element(By.CSS_SELECTOR, "li.out pre.head").text
        assert driver.execute_script("return sessionStorage.getItem('a2ad.headers')") == \
            "A2A-Extensions: https://ext.example/trace/v1"
        assert driver.execute_script("return localStorage.length") == 0
        headers.clear()
        reply = send_chat("without")
        assert "extensions:" not in reply.text, reply.text

    @check("the pulse charts draw from /metrics")
    def _():
        nav("pulse")
        wait(lambda d: int(by_id("chart-rps").find_element(By.CSS_SELECTOR, "canvas").get_attribute("data-points")) >= 3, "samples")
        for i in range(5):
            http("POST", "/api/v1/a2a/echo/rest/message:send", ALICE, {
                "message": {"messageId": f"pulse-{i}", "role": "ROLE_USER", "parts": [{"text": "beat"}]}})
        wait(lambda d: float(by_id("chart-rps").find_element(By.CSS_SELECTOR, ".now").text.split("/")[0]) > 0, "a request rate")
        blank = driver.execute_script("""
            const c = document.querySelector('#chart-rps canvas');
            const g = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
            let blue = 0;
            for (let i = 0; i < g.length; i += 4) if (g[i] < 40 && g[i + 2] > 150) blue++;
            return blue;""")
        assert blank > 20, f"the line is drawn ({blank} line pixels)"
        for c in ["p50", "p99", "working", "streams", "commit", "batch", "hooks"]:
            assert int(by_id(f"chart-{c}").find_element(By.CSS_SELECTOR, "canvas").get_attribute("data-points")) >= 2, c
        # A time axis, and no made-up webhook success rate: nothing was delivered while
        # this view watched.
        assert int(by_id("chart-rps").find_element(By.CSS_SELECTOR, "canvas").get_attribute("data-span")) >= 20
        hooks = by_id("chart-hooks").find_element(By.CSS_SELECTOR, ".now").text
        assert hooks == "no deliveries", hooks
        shot("pulse")

    @check("a task id in Chat links to its task; Back, Forward and reload keep the address")
    def _():
        nav("chat")
        Select(by_id("chat-agent")).select_by_value("echo")
        reply = send_chat("link me")
        link = reply.find_element(By.CSS_SELECTOR, "a.tasklink")
        task = link.get_attribute("data-task-link")
        assert task and link.text == task, link.text
        link.click()
        wait(lambda d: by_id("view-tasks").is_displayed(), "the Tasks view opens")
        wait(lambda d: task in by_id("task-detail").text, "the task's detail")
        address = f"#tasks/echo/{task}"
        assert driver.execute_script("return location.hash") == address
        wait(lambda d: d.find_elements(By.CSS_SELECTOR, "#task-detail .timeline li"), "its timeline")
        driver.back()
        wait(lambda d: by_id("view-chat").is_displayed(), "Back returns to Chat")
        assert driver.execute_script("return location.hash") == "#chat"
        assert "link me" in by_id("transcript").text, "the conversation is still shown"
        driver.forward()
        wait(lambda d: by_id("view-tasks").is_displayed() and task in by_id("task-detail").text,
             "Forward opens the task again")
        driver.refresh()
        wait(lambda d: by_id("view-tasks").is_displayed() and task in by_id("task-detail").text,
             "a reload at the task's address opens it")
        # From the task to its webhooks, and from a delivery back to the task.
        by_id("task-hooks").click()
        wait(lambda d: by_id("view-hooks").is_displayed(), "the Webhooks view opens")
        assert by_id("hook-task").get_attribute("value") == task
        assert driver.execute_script("return location.hash") == f"#hooks/echo/{task}"
        wait(lambda d: task in by_id("delivery-scope").text, "its deliveries only")
        driver.back()
        wait(lambda d: by_id("view-tasks").is_displayed() and task in by_id("task-detail").text,
             "Back returns to the task")
        # A delivery (the slow task's, from the webhook check) links its task.
        nav("hooks")
        Select(by_id("hook-agent")).select_by_value("slow")
        by_id("hook-task").clear()
        by_id("hook-task").send_keys(slow["id"])
        wait(lambda d: slow["id"] in by_id("delivery-scope").text, "the slow task's deliveries")
        wait(lambda d: d.find_elements(By.CSS_SELECTOR, "#delivery-rows a.tasklink"), "deliveries link their tasks")
        # Read and clicked in one script: the table is drawn again when a delivery comes.
        target = driver.execute_script("""
            const a = document.querySelector('#delivery-rows a.tasklink');
            a.click();
            return a.dataset.taskLink;""")
        assert target == slow["id"], (target, slow)
        wait(lambda d: by_id("view-tasks").is_displayed() and target in by_id("task-detail").text,
             "a delivery's task opens")
        assert driver.execute_script("return location.hash") == f"#tasks/slow/{target}"

    @check("a failed task says why, in Tasks and in the chat")
    def _():
        failed = http("POST", "/api/v1/a2a/broken/rest/message:send", ALICE, {
            "message": {"messageId": "ui-fail-1", "role": "ROLE_USER", "parts": [{"text": "fail"}]}})["task"]
        assert failed["status"]["state"] == "TASK_STATE_FAILED", failed
        driver.get(f"{BASE}/ui/#tasks/broken/{failed['id']}")
        wait(lambda d: (d.execute_script("return document.getElementById('task-reason')?.textContent") or "")
             not in ("", "none given"), "the reason shown")
        reason = driver.execute_script("return document.getElementById('task-reason').textContent")
        nav("chat")
        Select(by_id("chat-agent")).select_by_value("broken")
        reply = send_chat("fail here", state="failed")
        assert reason.split(" ")[0] in reply.text or "fail" in reply.text.lower(), (reason, reply.text)

    @check("a running task's history and 'updated' keep up with its timeline")
    def _():
        started = http("POST", "/api/v1/a2a/slow/rest/message:send", ALICE, {
            "message": {"messageId": "keep-up-1", "role": "ROLE_USER", "parts": [{"text": "keep up"}]},
            "configuration": {"returnImmediately": True}})["task"]["id"]
        driver.get(f"{BASE}/ui/#tasks/slow/{started}")
        wait(lambda d: by_id("view-tasks").is_displayed() and started in by_id("task-detail").text,
             "the task opened from its address")

        def progress_in_history():
            return len([li for li in driver.find_elements(By.CSS_SELECTOR, "#task-detail ol.history li")
                        if li.text.startswith("agent:")])

        def events():
            return len(driver.find_elements(By.CSS_SELECTOR, "#task-detail .timeline li"))

        def updated():
            # Read in one script: the detail is drawn again as the task moves.
            return driver.execute_script(
                "const dd = document.querySelector('#task-detail .kv dd:nth-of-type(3)'); return dd ? dd.title : null")

        wait(lambda d: events() >= 4, "progress events in the timeline")
        wait(lambda d: updated(), "'updated' shown")
        first_updated = updated()
        wait(lambda d: progress_in_history() >= 2 and "working" in (d.execute_script(
            "return document.querySelector('#task-detail .kv')?.textContent") or ""),
             "the progress in the history too, while it runs")
        wait(lambda d: updated() not in (None, first_updated), "'updated' moves with it")
        http("POST", f"/api/v1/a2a/slow/rest/tasks/{started}:cancel", ALICE, {})

    @check("On the wire: one folding entry per exchange, a header a line, a copy button; Chat's calls only")
    def _():
        nav("chat")
        Select(by_id("chat-agent")).select_by_value("echo")
        Select(by_id("chat-wire")).select_by_value("v1")
        send_chat("on the wire")
        entry = driver.find_elements(By.CSS_SELECTOR, "#raw li.exchange")[-1]
        summary = entry.find_element(By.TAG_NAME, "summary").text
        assert "POST" in summary and "/jsonrpc/v1" in summary and "200" in summary, summary
        assert int(entry.get_attribute("data-frames") or 0) >= 2, "its stream's frames are in it"
        head = entry.find_element(By.CSS_SELECTOR, "li.out pre.head").text
        lines = head.split("\n")
        assert any(l.startswith("authorization: Bearer ••••••") for l in lines), lines
        assert any(l.startswith("a2a-version: 1.0") for l in lines), lines
        # Folds: its frames hidden, then shown again.
        entry.find_element(By.TAG_NAME, "summary").click()
        wait(lambda d: not entry.find_element(By.CSS_SELECTOR, "li.frame").is_displayed(), "folded")
        entry.find_element(By.TAG_NAME, "summary").click()
        wait(lambda d: entry.find_element(By.CSS_SELECTOR, "li.frame").is_displayed(), "unfolded")
        # Copy: what is shown, the credential masked.
        driver.execute_script("""
            window.__copied = null;
            Object.defineProperty(navigator, 'clipboard', { configurable: true,
              value: { writeText: async (t) => { window.__copied = t; } } });""")
        entry.find_element(By.CSS_SELECTOR, "button.copy").click()
        wait(lambda d: d.execute_script("return window.__copied"), "copied")
        copied = driver.execute_script("return window.__copied")
        assert "SendStreamingMessage" in copied and "Bearer ••••••" in copied and ALICE not in copied, copied[:300]
        # Every answer and frame carries a compliance mark; a2ad's own, on every wire
        # (seed, 1.0 JSON-RPC, HTTP+JSON; streamed and not), keep the rules.
        for wire in ["seed", "rest", "v1"]:
            Select(by_id("chat-wire")).select_by_value(wire)
            for _ in range(2):
                send_chat(f"marked on {wire}")
                by_id("chat-stream").click()
        marks = driver.find_elements(By.CSS_SELECTOR, "#raw li[data-compliant]")
        assert len(marks) >= 12, len(marks)
        broken = [m.text[:300] for m in marks if m.get_attribute("data-compliant") != "true"]
        assert not broken, broken
        assert entry.find_elements(By.CSS_SELECTOR, 'li.frame[data-compliant="true"] .mark.ok')
        # A malformed answer (stubbed: the agent's role renamed) gets ✗ and the rule it breaks.
        wait(lambda d: not d.find_elements(By.CSS_SELECTOR, "#transcript .bubble.agent[data-state=working]"), "idle")
        driver.execute_script("""
            window.__fetch = window.fetch;
            window.fetch = async (url, init) => {
              const res = await window.__fetch(url, init);
              if (!/"(SendMessage|GetTask)"/.test(String(init && init.body))) return res;
              const text = (await res.text()).replaceAll('"ROLE_AGENT"', '"ROLE_ROBOT"');
              return new Response(text, { status: res.status, headers: res.headers });
            };""")
        by_id("chat-stream").click()  # off: a blocking SendMessage
        send_chat("malformed", state=None)
        # (A blocking send on 1.0 returns at once and reads the task until it ends: the
        # answer that holds the agent's message is marked.)
        wait(lambda d: d.find_elements(By.CSS_SELECTOR, '#raw li.in[data-compliant="false"]'),
             "the malformed answer marked")
        bad = driver.find_elements(By.CSS_SELECTOR, '#raw li.in[data-compliant="false"]')[-1]
        rule = bad.find_element(By.CSS_SELECTOR, ".mark.bad").get_attribute("title")
        assert "role" in rule and "ROLE_AGENT" in rule, rule
        assert rule in bad.text, bad.text
        driver.execute_script("window.fetch = window.__fetch;")
        by_id("chat-stream").click()
        shot("wire-compliance")
        # The Tasks view's calls are not logged in Chat's panel.
        nav("tasks")
        wait(lambda d: d.find_elements(By.CSS_SELECTOR, "#task-rows tr[data-task]"), "tasks listed")
        nav("chat")
        assert "/rest/tasks?" not in by_id("raw").text, "only the chat's exchanges"

    @check("bob signed in sees none of alice's tasks and only his agent")
    def _():
        by_id("signout").click()
        wait(lambda d: by_id("credential").is_displayed(), "signed out")
        by_id("credential").send_keys(BOB)
        driver.find_element(By.CSS_SELECTOR, "#signin-form button").click()
        wait(lambda d: by_id("nav").is_displayed(), "signed in as bob")
        names = [b.get_attribute("data-agent") for b in driver.find_elements(By.CSS_SELECTOR, "#agent-list button")]
        assert names == ["echo"], names
        nav("tasks")
        wait(lambda d: d.find_elements(By.CSS_SELECTOR, f'#task-rows tr[data-task="{bob_task}"]'), "bob's own task")
        assert len(driver.find_elements(By.CSS_SELECTOR, "#task-rows tr[data-task]")) == 1
        nav("hooks")
        wait(lambda d: "No deliveries yet." in by_id("delivery-rows").text, "no deliveries of alice's")

    @check("keyboard: views open from the keyboard and focus survives the live refresh")
    def _():
        from selenium.webdriver.common.keys import Keys

        button = driver.find_element(By.CSS_SELECTOR, '#nav button[data-view="tasks"]')
        driver.execute_script("arguments[0].focus()", button)
        button.send_keys(Keys.ENTER)
        wait(lambda d: by_id("view-tasks").is_displayed(), "tasks opened with Enter")
        wait(lambda d: d.find_elements(By.CSS_SELECTOR, "#task-rows tr[data-task] button"), "a task to focus")
        driver.execute_script("""
            window.__focused = document.querySelector('#task-rows tr[data-task] button');
            window.__focused.focus();
            window.__polls = Number(document.getElementById('task-rows').dataset.polls);""")
        wait(lambda d: d.execute_script(
            "return Number(document.getElementById('task-rows').dataset.polls) >= window.__polls + 2"),
            "two refreshes")
        assert driver.execute_script("return document.activeElement === window.__focused"), \
            "the focused task kept its focus across refreshes"
        driver.switch_to.active_element.send_keys(Keys.ENTER)
        wait(lambda d: d.find_elements(By.CSS_SELECTOR, "#task-detail .timeline li"), "the task opened with Enter")

    @check("dark mode follows the system's preference")
    def _():
        def background():
            return driver.execute_script(
                "return getComputedStyle(document.documentElement).backgroundColor")

        def luminance(rgb):
            r, g, b = [int(x) for x in rgb[rgb.index("(") + 1:rgb.index(")")].split(",")[:3]]
            return 0.2126 * r + 0.7152 * g + 0.0722 * b

        light = background()
        driver.execute_cdp_cmd("Emulation.setEmulatedMedia",
                               {"features": [{"name": "prefers-color-scheme", "value": "dark"}]})
        wait(lambda d: luminance(background()) < 60, "a dark background")
        assert luminance(light) > 200, light
        shot("tasks-dark")
        driver.execute_cdp_cmd("Emulation.setEmulatedMedia",
                               {"features": [{"name": "prefers-color-scheme", "value": "light"}]})
        wait(lambda d: luminance(background()) > 200, "light again")

    @check("phone width: every view fits, labels present")
    def _():
        driver.set_window_size(390, 844)
        nav("chat")
        shot("chat-phone")
        for inp in driver.find_elements(By.CSS_SELECTOR, "input:not([type=file]), select, textarea"):
            labelled = driver.execute_script(
                "const e = arguments[0]; return Boolean(e.labels && e.labels.length) || e.hasAttribute('aria-label');", inp)
            assert labelled, inp.get_attribute("id")
        body = driver.find_element(By.TAG_NAME, "body")
        for view in ["chat", "agents", "tasks", "hooks", "pulse"]:
            nav(view)
            width = driver.execute_script("return document.documentElement.scrollWidth")
            assert width <= 400, f"{view}: no sideways scrolling at phone width ({width})"
            shot(f"{view}-phone")
        # Every delivery column is there (in the table's own scroll box).
        headers = [h.text for h in driver.find_elements(By.CSS_SELECTOR, "#view-hooks .grid th")]
        assert driver.execute_script(
            "return [...document.querySelectorAll('#view-hooks .grid th')].every((h) => getComputedStyle(h).display !== 'none')"), headers
        # A tapped task comes into view.
        nav("tasks")
        wait(lambda d: d.find_elements(By.CSS_SELECTOR, "#task-rows tr[data-task] button"), "a task to tap")
        driver.execute_script("[...document.querySelectorAll('#task-rows tr[data-task] button')].pop().click()")
        wait(lambda d: d.execute_script(
            "const r = document.getElementById('task-detail').getBoundingClientRect(); return r.top >= -5 && r.top < innerHeight / 2"),
            "the task's detail in view")
        driver.set_window_size(1366, 900)
        body.click()

    @check("no script or policy errors in the console")
    def _():
        # Expected: the wrong key's 401, and the 404 the Agents view asks for on purpose
        # (a private agent's public card, to say what its URL answers).
        errors = [
            e for e in severe_logs()
            if "401" not in e.get("message", "")
            and not ("/private/.well-known/agent-card.json" in e.get("message", "") and "404" in e.get("message", ""))
        ]
        assert not errors, errors
finally:
    driver.quit()
    receiver.shutdown()
    upstream.shutdown()

print(f"inspector: {passed} passed, {failed} failed")
sys.exit(1 if failed else 0)
