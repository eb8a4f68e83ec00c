//! Pluggable agent backends.
//!
//! A backend implements [`Agent`]: it receives the user's message, the context's earlier
//! turns, a way to emit intermediate updates and artifacts, and a cancellation signal, and
//! ends with a reply (or, through [`Agent::run_task`], another [`Outcome`]) or an error. It runs on its own tokio task (never inside an actor's `handle`);
//! when the task is canceled or times out, its future is dropped, so any I/O it was
//! awaiting is aborted at once.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use tokio_util::sync::CancellationToken;

use crate::config::AgentConfig;
use crate::model::{Artifact, ArtifactUpdate, ContextId, Extensions, Message, Principal, TaskId};

mod echo;
mod openai;
mod tck;

pub use echo::EchoAgent;
pub use openai::OpenAiAgent;
pub use tck::TckAgent;

/// The future an agent returns.
pub type AgentFuture = Pin<Box<dyn Future<Output = Result<Message, AgentError>> + Send>>;

/// The future of [`Agent::run_task`].
pub type OutcomeFuture = Pin<Box<dyn Future<Output = Result<Outcome, AgentError>> + Send>>;

/// How a run of the agent ends the task (or pauses it), with the agent's message if any.
#[derive(Clone, Debug, PartialEq)]
pub enum Outcome {
    /// The task completes (with this reply).
    Completed(Option<Message>),
    /// The agent needs more input: the task waits in `input-required` (interrupted) until a
    /// message that names it continues it.
    InputRequired(Option<Message>),
    /// The agent needs authentication: like [`Outcome::InputRequired`], in `auth-required`.
    AuthRequired(Option<Message>),
    /// The agent refuses the task (terminal `rejected`).
    Rejected(Option<Message>),
    /// The work was canceled where it ran (an upstream agent canceled its task): the task
    /// ends `canceled`, with this reason.
    Canceled(String),
}

/// An agent backend: plug it in with [`crate::ServerBuilder::agent`] or
/// [`crate::runtime::RuntimeBuilder::agent`] under the id of one of the configuration's
/// agents.
///
/// ```
/// use a2ad::{Agent, AgentError, AgentFuture, AgentRequest, Message, Updates};
///
/// /// Counts the words of the user's message, reporting progress on the way.
/// struct WordCount;
///
/// impl Agent for WordCount {
///     fn kind(&self) -> &str {
///         "counter"
///     }
///
///     fn run(&self, request: AgentRequest, updates: Updates) -> AgentFuture {
///         Box::pin(async move {
///             updates.ready().await; // waits while the store is behind
///             updates.progress(Message::agent_text(["counting"]));
///             let text = request.message.joined_text();
///             if text.is_empty() {
///                 return Err(AgentError::new("nothing to count")); // fails the task
///             }
///             let words = text.split_whitespace().count();
///             Ok(Message::agent_text([format!("{words} words")]))
///         })
///     }
/// }
/// ```
pub trait Agent: Send + Sync + 'static {
    /// The kind reported as `agent.type` in the card (e.g. `echo`, `llm`).
    fn kind(&self) -> &str;

    /// Runs one task: returns the agent's reply message, or an error that fails the task.
    fn run(&self, request: AgentRequest, updates: Updates) -> AgentFuture;

    /// Runs one task (or one continuation of an interrupted task) to its [`Outcome`]. The
    /// default completes the task with [`Agent::run`]'s reply; backends that pause or refuse
    /// tasks override it.
    fn run_task(&self, request: AgentRequest, updates: Updates) -> OutcomeFuture {
        let run = self.run(request, updates);
        Box::pin(async move { run.await.map(|m| Outcome::Completed(Some(m))) })
    }

    /// A reply given at once, instead of a task, for this message — or `None` (the
    /// default): a task is created and [`Agent::run_task`] runs it. Only dialects that
    /// allow a bare message as a result ask (docs/PROTOCOL.md §10.5).
    fn direct_reply(&self, _message: &Message) -> Option<Message> {
        None
    }

    /// Whether a task this backend was working on when its node died may be run again,
    /// from its first message, on the node that takes it over (`[cluster] on_node_loss =
    /// "resume"`). Default: no — the task fails with "node lost".
    fn resumable(&self) -> bool {
        false
    }

    /// Whether a task this backend was working on, and on which it left a note
    /// ([`Updates::note`]), is taken up again after a restart or a node loss instead of
    /// failing: [`Agent::run_task`] is called again with [`AgentRequest::taken_up`] set
    /// and the note, and picks up the work where it runs (the `a2a` backend: the upstream
    /// task). Default: no.
    fn takes_up(&self) -> bool {
        false
    }

    /// The task is being canceled (by a client, its time-out, or a shutdown on a store
    /// that keeps nothing) — told before its run is stopped, with the note it left if any:
    /// stop its work elsewhere. Not told when the task only moves (a restart that keeps it,
    /// another node taking it). Called from the task's actor, so it must not wait: a
    /// backend that has to call out spawns the call.
    fn canceled(&self, _task: &TaskId, _note: Option<&str>) {}

    /// A backend that fronts an agent elsewhere: that agent's health, counters and card
    /// (for `/metrics`, the inspector and this agent's cards). Default: none.
    fn upstream(&self) -> Option<UpstreamView> {
        None
    }
}

/// An upstream agent as its fronting backend sees it ([`Agent::upstream`]).
#[derive(Clone, Debug)]
pub struct UpstreamView {
    /// Its card's last fetch and the last error.
    pub health: UpstreamHealth,
    /// Its calls, failures and latencies.
    pub metrics: Arc<crate::metrics::UpstreamMetrics>,
    /// What its card says of it, once read.
    pub card: Option<UpstreamFacts>,
}

/// What the inspector and the cards show of an upstream.
#[derive(Clone, Debug, Default)]
pub struct UpstreamHealth {
    /// The upstream's card URL.
    pub card_url: String,
    /// When its card was last fetched and read.
    pub card_fetched_at: Option<chrono::DateTime<chrono::Utc>>,
    /// The last error (card fetch or call), and when.
    pub last_error: Option<(chrono::DateTime<chrono::Utc>, String)>,
    /// The interface called: binding and protocol version.
    pub interface: Option<(String, String)>,
}

/// What an upstream's card says that this agent's cards take over, unless its
/// `[[agents]]` entry sets it.
#[derive(Clone, Debug, Default)]
pub struct UpstreamFacts {
    /// `name`.
    pub name: Option<String>,
    /// `description`.
    pub description: Option<String>,
    /// `skills` (a JSON array as the card has it).
    pub skills: Option<serde_json::Value>,
    /// `defaultInputModes`.
    pub input_modes: Option<serde_json::Value>,
    /// `defaultOutputModes`.
    pub output_modes: Option<serde_json::Value>,
    /// `capabilities.streaming`.
    pub streaming: bool,
}

/// A shared backend is a backend: one `Arc<dyn Agent>` may serve several agents or
/// runtimes.
impl<A: Agent + ?Sized> Agent for Arc<A> {
    fn kind(&self) -> &str {
        (**self).kind()
    }

    fn run(&self, request: AgentRequest, updates: Updates) -> AgentFuture {
        (**self).run(request, updates)
    }

    fn run_task(&self, request: AgentRequest, updates: Updates) -> OutcomeFuture {
        (**self).run_task(request, updates)
    }

    fn direct_reply(&self, message: &Message) -> Option<Message> {
        (**self).direct_reply(message)
    }

    fn resumable(&self) -> bool {
        (**self).resumable()
    }

    fn takes_up(&self) -> bool {
        (**self).takes_up()
    }

    fn canceled(&self, task: &TaskId, note: Option<&str>) {
        (**self).canceled(task, note);
    }

    fn upstream(&self) -> Option<UpstreamView> {
        (**self).upstream()
    }
}

/// What an agent gets for one task: the message with every part kind A2A has (text,
/// inline files, files by URL, data), the extensions the request activated, the
/// conversation so far. An agent answers with any part kinds too, in its reply and in
/// artifacts (docs/PROTOCOL.md §12).
///
/// ```
/// use a2ad::{
///     Agent, AgentError, AgentFuture, AgentRequest, Artifact, DataPart, Extensions, Message,
///     Part, RawJson, Updates,
/// };
///
/// /// Reads a form (a data part) and the files it points at; answers with a summary as
/// /// data, in its reply and as an artifact.
/// struct Forms;
///
/// const TRACE: &str = "https://example.com/ext/trace/v1";
///
/// impl Agent for Forms {
///     fn kind(&self) -> &str {
///         "forms"
///     }
///
///     fn run(&self, request: AgentRequest, updates: Updates) -> AgentFuture {
///         Box::pin(async move {
///             let (mut fields, mut files) = (0, Vec::new());
///             for part in &request.message.parts {
///                 match part {
///                     Part::Data(d) => {
///                         let form: serde_json::Value = serde_json::from_str(d.data.get())
///                             .map_err(|e| AgentError::new(e.to_string()))?;
///                         fields += form.as_object().map_or(0, |o| o.len());
///                     }
///                     // Never fetched by a2ad: the agent decides what to do with it.
///                     Part::Url(u) => files.push(u.url.clone()),
///                     Part::Text(_) | Part::File(_) => {}
///                 }
///             }
///             let summary = serde_json::json!({
///                 "fields": fields,
///                 "files": files,
///                 "traced": request.extensions.contains(TRACE),
///             });
///             let data = || Part::Data(Box::new(DataPart::new(RawJson::of(&summary))));
///             updates.artifact(Artifact::new(Some("summary"), vec![data()]), false, true);
///             let mut reply = Message::agent_text([format!("{fields} fields")]);
///             reply.parts.push(data());
///             Ok(reply)
///         })
///     }
/// }
///
/// // Run once outside a server, as a unit test of the agent would.
/// let form = RawJson::of(&serde_json::json!({"name": "Ada", "role": "engineer"}));
/// let mut message = Message::user_text(["please file this"]);
/// message.parts.push(Part::Data(Box::new(DataPart::new(form))));
/// message.parts.push(Part::Url(Box::new(a2ad::FileUrl {
///     url: "https://files.example/cv.pdf".into(),
///     name: Some("cv.pdf".into()),
///     mime_type: Some("application/pdf".into()),
///     metadata: None,
/// })));
/// let request = AgentRequest {
///     task_id: a2ad::TaskId::new("t"),
///     context_id: a2ad::ContextId::new("c"),
///     principal: a2ad::Principal::new("alice"),
///     message: std::sync::Arc::new(message),
///     history: Vec::new(),
///     task_history: Vec::new(),
///     turn: 1,
///     extensions: Extensions::new(vec![TRACE.to_string()]),
///     cancel: Default::default(),
///     note: None,
///     taken_up: false,
///     artifacts: Vec::new(),
/// };
/// let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
/// let reply = runtime.block_on(Forms.run(request, Updates::detached())).unwrap();
/// assert_eq!(reply.joined_text(), "2 fields");
/// let Part::Data(d) = &reply.parts[1] else { panic!("a data part") };
/// assert_eq!(d.data.get(), r#"{"fields":2,"files":["https://files.example/cv.pdf"],"traced":true}"#);
/// ```
#[derive(Clone, Debug)]
pub struct AgentRequest {
    /// The task.
    pub task_id: TaskId,
    /// Its conversation.
    pub context_id: ContextId,
    /// Who owns the task (and the conversation): the caller's principal.
    pub principal: Principal,
    /// This turn's user message.
    pub message: Arc<Message>,
    /// Earlier turns of the context, oldest first: user and agent messages alternating.
    pub history: Vec<Arc<Message>>,
    /// This task's own messages before `message`, oldest first: empty on its first run;
    /// when an interrupted task is continued, its first message, the agent's question, ...
    pub task_history: Vec<Arc<Message>>,
    /// This turn's number in the context, from 1.
    pub turn: u32,
    /// The extensions the request activated (those this agent declares that the client
    /// asked for, in the agent's declared order). The message's own list is
    /// `message.extensions`.
    pub extensions: Extensions,
    /// Fires when the task is canceled or times out. The future is dropped then anyway;
    /// this lets a backend stop work it spawned elsewhere.
    pub cancel: CancellationToken,
    /// The note this backend left on the task ([`Updates::note`]), on a run that
    /// continues it or takes it up again; `None` on a task's first run.
    pub note: Option<Arc<str>>,
    /// This run takes up a task that was working when the server (or its node) stopped
    /// ([`Agent::takes_up`]): `message` is the task's first message, already handled;
    /// the work goes on where the note says.
    pub taken_up: bool,
    /// The task's artifacts so far (empty on its first run).
    pub artifacts: Vec<Arc<Artifact>>,
}

/// Why an agent failed. The message is shown to the client in `status.error`: it must not
/// carry secrets.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AgentError {
    /// What happened.
    pub message: String,
}

impl AgentError {
    /// An error with this message.
    pub fn new(message: impl Into<String>) -> Self {
        Self {
            message: message.into(),
        }
    }
}

/// A task's updates that are not durable yet: [`Updates::ready`] waits while more than
/// this many wait for the store: twice what a store transaction takes by default
/// (`store.max_batch`), so that one batch can form while the previous one commits and
/// pacing a backend never starves the committer, even on a store with a long commit.
pub const UPDATES_IN_FLIGHT: usize = 2048;

/// A backend held up by [`Updates::ready`] goes on once this many wait (or fewer).
const RESUME_AT: usize = UPDATES_IN_FLIGHT / 2;

/// A task's updates that may wait for the store at most: the next one is refused
/// (`false`) and the task fails ("the agent's updates outpace the store").
pub const MAX_UPDATES_IN_FLIGHT: usize = 8192;

/// The flow of one task's updates: how many were sent and are not durable yet (the task
/// actor releases them as the store makes their events durable, or at once when it drops
/// them), and a wake-up for [`Updates::ready`].
#[derive(Default)]
pub(crate) struct Flow {
    waiting: AtomicUsize,
    room: tokio::sync::Notify,
    /// The task actor stopped: nothing waits for room any more.
    closed: AtomicBool,
    /// An update was refused: the task is told once.
    overrun: AtomicBool,
}

impl Flow {
    /// Counts one more update, unless `MAX_UPDATES_IN_FLIGHT` wait already. `Err(first)`:
    /// refused, `first` for the first refusal.
    fn admit(&self) -> std::result::Result<(), bool> {
        let before = self.waiting.fetch_add(1, Ordering::AcqRel);
        if before >= MAX_UPDATES_IN_FLIGHT {
            self.waiting.fetch_sub(1, Ordering::AcqRel);
            return Err(!self.overrun.swap(true, Ordering::AcqRel));
        }
        Ok(())
    }

    /// `n` updates are durable (or dropped).
    pub(crate) fn release(&self, n: usize) {
        if n == 0 {
            return;
        }
        let before = self.waiting.fetch_sub(n, Ordering::AcqRel);
        if before > RESUME_AT && before.saturating_sub(n) <= RESUME_AT {
            self.room.notify_waiters();
        }
    }

    /// The task actor stopped.
    pub(crate) fn close(&self) {
        self.closed.store(true, Ordering::Release);
        self.room.notify_waiters();
    }
}

/// One of an agent's updates, as its task receives it.
pub(crate) enum Update {
    /// The agent started (`submitted` → `working`).
    Started,
    /// A message: kept in the history (`keep`) or only streamed.
    Progress {
        /// The update.
        message: Message,
        /// Kept in `history` (a progress message) or transient (a streamed chunk).
        keep: bool,
    },
    /// An artifact, or a chunk of one.
    Artifact(ArtifactUpdate),
    /// The backend's durable note on the task.
    Note(Arc<str>),
    /// More updates than may wait for the store were sent ([`MAX_UPDATES_IN_FLIGHT`]).
    Overrun,
}

/// Where a task's updates go (the task's actor), with their [`Flow`]. Kept behind this
/// trait so that backends, and this module, never meet the actor system.
pub(crate) trait UpdateSink: Send + Sync {
    /// Hands `update` to the task; `false` when it is gone.
    fn send(&self, update: Update) -> bool;
    /// The task's updates not durable yet.
    fn flow(&self) -> &Flow;
}

/// Sends intermediate updates (`working` with a message, `final: false`) to the task.
///
/// Each update becomes one of the task's events, and is held in memory until the store
/// makes it durable. A backend that streams should await [`Updates::ready`] between
/// updates (the built-in ones do): it waits while more than [`UPDATES_IN_FLIGHT`] of the
/// task's updates wait for the store, so a stalled disk or database holds the backend up
/// instead of growing memory. An update past [`MAX_UPDATES_IN_FLIGHT`] waiting is refused
/// (`false`) and fails the task.
#[derive(Clone)]
pub struct Updates {
    task: Option<Arc<dyn UpdateSink>>,
    /// Whether the task was told that its agent started (`working`): by the first update,
    /// or by the driver once the agent did not answer at its first poll. A lock, not an
    /// atomic flag: `Started` is sent while it is held, so an update from another thread
    /// can never let the driver's `Finished` overtake its `Started`.
    started: Arc<Mutex<bool>>,
}

impl Updates {
    pub(crate) fn new(task: Arc<dyn UpdateSink>) -> Self {
        Self {
            task: Some(task),
            started: Arc::default(),
        }
    }

    /// Updates that go nowhere (for running an agent outside a task, e.g. in a bench).
    pub fn detached() -> Self {
        Self {
            task: None,
            started: Arc::default(),
        }
    }

    /// Waits until the task has room for more updates: returns at once while at most
    /// [`UPDATES_IN_FLIGHT`] of them wait for the store (or the task ended); past that,
    /// once half of them have become durable.
    pub async fn ready(&self) {
        let Some(flow) = self.task.as_deref().map(UpdateSink::flow) else {
            return;
        };
        if flow.waiting.load(Ordering::Acquire) <= UPDATES_IN_FLIGHT {
            return;
        }
        // Held up: resumed once half have become durable, so the backend then sends a
        // batch's worth at a time instead of one update per wake-up.
        loop {
            let room = flow.room.notified();
            let mut room = std::pin::pin!(room);
            room.as_mut().enable();
            if flow.waiting.load(Ordering::Acquire) <= RESUME_AT
                || flow.closed.load(Ordering::Acquire)
            {
                return;
            }
            room.await;
        }
    }

    /// Tells the task its agent started, unless that was done.
    pub(crate) fn start(&self) {
        let mut started = self.started.lock().unwrap_or_else(|e| e.into_inner());
        if !*started && let Some(t) = &self.task {
            t.send(Update::Started);
        }
        *started = true;
    }

    /// Marks the start as told without telling it (the driver folds it into the reply);
    /// returns whether it was not told yet.
    pub(crate) fn take_start(&self) -> bool {
        let mut started = self.started.lock().unwrap_or_else(|e| e.into_inner());
        !std::mem::replace(&mut *started, true)
    }

    /// Emits a progress message: a `working` update that is also kept in the task's
    /// history. Returns false when the task is gone.
    pub fn progress(&self, message: Message) -> bool {
        self.send(message, true)
    }

    /// Emits a partial result (e.g. a chunk of streamed tokens): a `working` update that
    /// streams see but the task's history does not keep. Returns false when the task is gone.
    pub fn partial(&self, message: Message) -> bool {
        self.send(message, false)
    }

    /// Emits an artifact, or a chunk of one: `append` adds `artifact`'s parts to the
    /// artifact with the same id sent before, `last_chunk` says it is complete. Returns
    /// false when the task is gone.
    pub fn artifact(&self, artifact: Artifact, append: bool, last_chunk: bool) -> bool {
        let update = ArtifactUpdate {
            artifact: Arc::new(artifact),
            append,
            last_chunk,
        };
        self.cast(Update::Artifact(update))
    }

    /// Leaves a durable note on the task (at most [`MAX_NOTE_BYTES`]): kept with its
    /// record, never shown to clients, and handed back in [`AgentRequest::note`] when the
    /// task is continued or taken up again. It is stored with a `working` event of its
    /// own, made durable before the next update is. Returns false when the task is gone
    /// or the note is too long.
    pub fn note(&self, note: &str) -> bool {
        if note.len() > MAX_NOTE_BYTES {
            return false;
        }
        self.cast(Update::Note(Arc::from(note)))
    }

    fn send(&self, message: Message, keep: bool) -> bool {
        self.cast(Update::Progress { message, keep })
    }

    fn cast(&self, update: Update) -> bool {
        self.start();
        let Some(task) = &self.task else {
            return false;
        };
        let flow = task.flow();
        if let Err(first) = flow.admit() {
            if first {
                task.send(Update::Overrun);
            }
            return false;
        }
        if !task.send(update) {
            flow.release(1);
            return false;
        }
        true
    }
}

/// Stands in for a backend this build of the runtime cannot make.
struct Unavailable;

impl Agent for Unavailable {
    fn kind(&self) -> &str {
        "unavailable"
    }

    fn run(&self, _request: AgentRequest, _updates: Updates) -> AgentFuture {
        Box::pin(async {
            Err(AgentError::new(
                "this agent's backend is not available (start the runtime with Runtime::builder)",
            ))
        })
    }
}

/// The longest note a backend may leave on a task ([`Updates::note`]).
pub const MAX_NOTE_BYTES: usize = 4096;

/// Builds the backend named by an agent's configuration.
pub fn from_config(config: &AgentConfig) -> Arc<dyn Agent> {
    // `Config::validated` only lets known backends through, each with its own table.
    match (&config.backend[..], &config.openai) {
        ("openai", Some(openai)) => Arc::new(OpenAiAgent::with_reply_limit(
            openai.clone(),
            config.limits.max_message_length,
        )),
        ("tck", _) => Arc::new(TckAgent::new(config.tck.clone())),
        // Built beside the dialects it speaks ([`crate::Runtime::builder`]); a runtime
        // started without it has no client to call the upstream with.
        ("a2a", _) => Arc::new(Unavailable),
        _ => Arc::new(EchoAgent::new(config.echo.clone())),
    }
}
