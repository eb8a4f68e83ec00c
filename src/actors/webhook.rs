//! The webhook pool: `webhooks.workers` actors that deliver signed, retried webhooks.
//!
//! The store plans deliveries when it makes a task event durable (one outbox entry per
//! event and configuration that selects it), and the task actor hands them here when it
//! publishes the event — or the runtime does, at start-up, for what the outbox held. A
//! delivery belongs to a lane — one task and one configuration — and a lane has at most
//! one attempt in flight, so a task's deliveries to a configuration go out in event
//! order. All of a task's lanes live on one worker, chosen by the task's hash.
//! A worker never awaits the network: each attempt runs on its own tokio task (bounded by
//! the 5 s attempt time-out) and casts its outcome back; retries wait on timer tasks. So a
//! slow or dead receiver holds up only its own lanes, never a task, a stream, a worker's
//! mailbox or another receiver. Outcomes go back to the outbox (done, or the next
//! attempt's number and time) without waiting for the disk.

use std::collections::hash_map::DefaultHasher;
use std::collections::{HashMap, VecDeque};
use std::hash::{Hash, Hasher};
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};

use super::Agents;
use crate::config::WebhooksConfig;
use crate::metrics::WebhookMetrics;
use crate::model::TaskKey;
use crate::net::{GuardedResolver, address_allowed, refusal};
use crate::push::{StoredPushConfig, redact_url};
use crate::store::{Delivery, Store, Write};
use crate::webhook::{
    self, AttemptEnd, AttemptRecord, Outcome, PayloadInput, PayloadRenderer, RecentDeliveries,
    Verdict,
};

type LaneKey = (TaskKey, String);

/// Messages of a [`WebhookActor`].
pub(crate) enum WebhookMsg {
    /// Deliveries of this worker's tasks, in event order.
    Deliver(Vec<Delivery>),
    /// An attempt ended, after this long.
    AttemptDone(LaneKey, Delivery, Outcome, Duration),
    /// A retry's wait is over.
    Retry(LaneKey, Delivery),
    /// Shutdown: log and drop what is left (it stays in a durable outbox); replies with
    /// how many were dropped.
    DropAll(RpcReplyPort<usize>),
}

/// One worker of the pool.
pub(crate) struct WebhookActor;

/// The `[webhooks]` settings a reload changes in place.
#[derive(Default)]
pub(crate) struct LiveSettings {
    /// `allow_private_networks` (the HTTP client's resolver reads it too).
    allow_private: Arc<std::sync::atomic::AtomicBool>,
    /// `max_pending_deliveries`.
    max_pending: std::sync::atomic::AtomicI64,
}

impl LiveSettings {
    fn set(&self, config: &WebhooksConfig) {
        self.allow_private
            .store(config.allow_private_networks, Relaxed);
        self.max_pending.store(
            i64::try_from(config.max_pending_deliveries).unwrap_or(i64::MAX),
            Relaxed,
        );
    }
}

/// What a worker shares with its pool.
#[derive(Clone)]
pub(crate) struct WebhookArgs {
    client: reqwest::Client,
    metrics: Arc<WebhookMetrics>,
    /// `[webhooks]` settings a reload changes in place.
    live: Arc<LiveSettings>,
    store: Arc<dyn Store>,
    agents: Arc<Agents>,
    renderers: Arc<HashMap<String, Arc<dyn PayloadRenderer>>>,
    recent: Arc<RecentDeliveries>,
}

/// A worker's lanes.
pub(crate) struct WebhookState {
    args: WebhookArgs,
    lanes: HashMap<LaneKey, Lane>,
}

#[derive(Default)]
struct Lane {
    queue: VecDeque<Delivery>,
    /// The id of the delivery in flight (attempting or waiting to retry).
    busy: Option<uuid::Uuid>,
}

impl Actor for WebhookActor {
    type Msg = WebhookMsg;
    type State = WebhookState;
    type Arguments = WebhookArgs;

    async fn pre_start(
        &self,
        _myself: ActorRef<WebhookMsg>,
        args: WebhookArgs,
    ) -> Result<WebhookState, ActorProcessingErr> {
        Ok(WebhookState {
            args,
            lanes: HashMap::new(),
        })
    }

    async fn handle(
        &self,
        myself: ActorRef<WebhookMsg>,
        msg: WebhookMsg,
        state: &mut WebhookState,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            WebhookMsg::Deliver(deliveries) => {
                for d in deliveries {
                    state.queue(&myself, d);
                }
            }
            WebhookMsg::AttemptDone(lane, mut delivery, outcome, took) => {
                let m = &state.args.metrics;
                let attempts = webhook::max_attempts(&delivery.config.config.retry);
                match webhook::verdict(&outcome) {
                    Verdict::Delivered => {
                        state.note(&delivery, &outcome, took, AttemptEnd::Delivered, None);
                        delivery.config.consecutive_failures.store(0, Relaxed);
                        m.delivered.fetch_add(1, Relaxed);
                        m.pending.fetch_sub(1, Relaxed);
                        state.done(&delivery);
                        state.finish(&myself, lane);
                    }
                    Verdict::Retry(asked) if delivery.attempt < attempts => {
                        let wait = asked.unwrap_or_else(|| {
                            webhook::backoff(&delivery.config.config.retry, delivery.attempt)
                        });
                        tracing::debug!(delivery = %delivery.id, attempt = delivery.attempt, ?outcome, ?wait, "webhook attempt failed; retrying");
                        let due = chrono::Utc::now()
                            + chrono::Duration::from_std(wait).unwrap_or_default();
                        state.note(&delivery, &outcome, took, AttemptEnd::Retrying, Some(due));
                        delivery.attempt += 1;
                        m.retries.fetch_add(1, Relaxed);
                        let _ = state.args.store.append(
                            vec![Write::OutboxRetry {
                                key: delivery.key.clone(),
                                attempt: delivery.attempt,
                                due,
                            }],
                            None,
                        );
                        state.later(&myself, lane, delivery, wait);
                    }
                    Verdict::Retry(_) | Verdict::Fail => {
                        state.note(&delivery, &outcome, took, AttemptEnd::Failed, None);
                        let c = &delivery.config;
                        let failures = c.consecutive_failures.fetch_add(1, Relaxed) + 1;
                        if failures >= StoredPushConfig::DEACTIVATE_AFTER {
                            c.active.store(false, Relaxed);
                        }
                        m.failed.fetch_add(1, Relaxed);
                        m.pending.fetch_sub(1, Relaxed);
                        tracing::error!(
                            delivery = %delivery.id,
                            url = %redact_url(&c.config.url),
                            event = %delivery.event.name(),
                            attempts = delivery.attempt,
                            ?outcome,
                            deactivated = failures >= StoredPushConfig::DEACTIVATE_AFTER,
                            "webhook delivery failed"
                        );
                        state.done(&delivery);
                        state.finish(&myself, lane);
                    }
                }
            }
            WebhookMsg::Retry(lane, delivery) => state.attempt(&myself, lane, delivery),
            WebhookMsg::DropAll(reply) => {
                let mut dropped = 0;
                for (_, lane) in state.lanes.drain() {
                    for d in lane.queue {
                        tracing::warn!(delivery = %d.id, url = %redact_url(&d.config.config.url), event = %d.event.name(), "webhook delivery left for after the restart (shutdown)");
                        dropped += 1;
                    }
                    if let Some(id) = lane.busy {
                        tracing::warn!(delivery = %id, "webhook delivery in flight at shutdown; left for after the restart");
                        dropped += 1;
                    }
                }
                let m = &state.args.metrics;
                m.discarded.fetch_add(dropped as u64, Relaxed);
                m.pending.fetch_sub(dropped as i64, Relaxed);
                let _ = reply.send(dropped);
            }
        }
        Ok(())
    }
}

impl WebhookState {
    /// Keeps an attempt for its owner's recent-deliveries read (`next`: the retry's time).
    fn note(
        &self,
        delivery: &Delivery,
        outcome: &Outcome,
        took: Duration,
        end: AttemptEnd,
        next: Option<chrono::DateTime<chrono::Utc>>,
    ) {
        let (status, error) = AttemptRecord::outcome_fields(outcome);
        self.record(delivery, end, status, error, took, next);
    }

    fn record(
        &self,
        delivery: &Delivery,
        end: AttemptEnd,
        status: Option<u16>,
        error: Option<String>,
        latency: Duration,
        next_attempt: Option<chrono::DateTime<chrono::Utc>>,
    ) {
        let task = &delivery.key.task;
        self.args.recent.record(
            (task.principal.clone(), task.agent.clone()),
            AttemptRecord {
                at: chrono::Utc::now(),
                delivery: delivery.id,
                task: task.task.clone(),
                config: delivery.config.id.clone(),
                url: delivery.config.shown_url(),
                event: delivery.event.static_name(),
                attempt: delivery.attempt,
                max_attempts: webhook::max_attempts(&delivery.config.config.retry),
                end,
                status,
                error,
                latency,
                next_attempt,
            },
        );
    }

    /// Queues one delivery in its lane (the pool full: discarded, logged and counted).
    fn queue(&mut self, myself: &ActorRef<WebhookMsg>, delivery: Delivery) {
        let m = self.args.metrics.clone();
        if m.pending.load(Relaxed) >= self.args.live.max_pending.load(Relaxed) {
            m.discarded.fetch_add(1, Relaxed);
            tracing::error!(url = %redact_url(&delivery.config.config.url), event = %delivery.event.name(), task = %delivery.key.task.task, "webhook pool full; delivery discarded");
            let _ = self
                .args
                .store
                .append(vec![Write::OutboxDone(delivery.key.clone())], None);
            return;
        }
        m.pending.fetch_add(1, Relaxed);
        let lane = (delivery.key.task.clone(), delivery.key.config.clone());
        let entry = self.lanes.entry(lane.clone()).or_default();
        // In event order, whatever order they arrive in (a delivery claimed from a dead
        // node may arrive after one planned here for a later event).
        let at = entry
            .queue
            .iter()
            .rposition(|d| d.key.seq <= delivery.key.seq)
            .map_or(0, |i| i + 1);
        entry.queue.insert(at, delivery);
        if entry.busy.is_none() {
            self.start_next(myself, lane);
        }
    }

    /// The delivery is over (delivered, or finally failed): out of the outbox, and the
    /// configuration's bookkeeping kept.
    fn done(&self, delivery: &Delivery) {
        let _ = self.args.store.append(
            vec![
                Write::OutboxDone(delivery.key.clone()),
                Write::PushStats(delivery.config.clone()),
            ],
            None,
        );
    }

    /// Starts the lane's next delivery, or forgets the lane when it is empty.
    fn start_next(&mut self, myself: &ActorRef<WebhookMsg>, key: LaneKey) {
        let Some(lane) = self.lanes.get_mut(&key) else {
            return;
        };
        match lane.queue.pop_front() {
            Some(delivery) => {
                lane.busy = Some(delivery.id);
                let wait = delivery
                    .due
                    .and_then(|due| (due - chrono::Utc::now()).to_std().ok())
                    .unwrap_or_default();
                if wait.is_zero() {
                    self.attempt(myself, key, delivery);
                } else {
                    // A retry that was due after a restart: wait for its time.
                    self.later(myself, key, delivery, wait);
                }
            }
            None => {
                self.lanes.remove(&key);
            }
        }
    }

    /// Runs the delivery's next attempt after `wait`.
    fn later(
        &self,
        myself: &ActorRef<WebhookMsg>,
        lane: LaneKey,
        mut delivery: Delivery,
        wait: Duration,
    ) {
        delivery.due = None;
        myself.send_after(wait, move || WebhookMsg::Retry(lane, delivery));
    }

    fn finish(&mut self, myself: &ActorRef<WebhookMsg>, key: LaneKey) {
        if let Some(lane) = self.lanes.get_mut(&key) {
            lane.busy = None;
        }
        self.start_next(myself, key);
    }

    /// Spawns one attempt; its outcome comes back as [`WebhookMsg::AttemptDone`].
    fn attempt(&mut self, myself: &ActorRef<WebhookMsg>, key: LaneKey, delivery: Delivery) {
        if !delivery.config.is_active() {
            tracing::warn!(delivery = %delivery.id, "webhook configuration deactivated; delivery skipped");
            self.record(
                &delivery,
                AttemptEnd::Skipped,
                None,
                Some("configuration deactivated".into()),
                Duration::ZERO,
                None,
            );
            let m = &self.args.metrics;
            m.skipped.fetch_add(1, Relaxed);
            m.pending.fetch_sub(1, Relaxed);
            let _ = self
                .args
                .store
                .append(vec![Write::OutboxDone(delivery.key.clone())], None);
            self.finish(myself, key);
            return;
        }
        let args = self.args.clone();
        let me = myself.clone();
        tokio::spawn(async move {
            let started = std::time::Instant::now();
            let outcome = send(&args, &delivery).await;
            let took = started.elapsed();
            let _ = me.cast(WebhookMsg::AttemptDone(key, delivery, outcome, took));
        });
    }
}

/// One HTTP attempt, bounded by [`webhook::ATTEMPT_TIMEOUT`].
async fn send(args: &WebhookArgs, d: &Delivery) -> Outcome {
    let config = &d.config.config;
    *d.config.last_used.lock().unwrap_or_else(|e| e.into_inner()) = Some(chrono::Utc::now());
    // A literal address never reaches the resolver, so it is checked here, every time.
    if let Ok(url) = url::Url::parse(&config.url)
        && let Some(ip) = crate::net::literal_ip(&url)
        && let Err(reason) = address_allowed(ip, args.live.allow_private.load(Relaxed))
    {
        return Outcome::Refused(reason.to_string());
    }
    let Some(renderer) = args.renderers.get(&*d.config.format) else {
        return Outcome::Refused(format!("no payload format {:?}", d.config.format));
    };
    let estimated_ms = args
        .agents
        .now()
        .get(&d.key.task.agent)
        .map(|a| a.metrics.snapshot().average_response_time.round() as u64)
        .unwrap_or(0);
    let payload = renderer.render(&PayloadInput {
        agent_id: &d.key.task.agent,
        event: &d.event,
        task: &d.task,
        estimated_ms,
        attempt: d.attempt,
        max_attempts: webhook::max_attempts(&config.retry),
    });
    let mut req = args
        .client
        .post(&config.url)
        .timeout(webhook::ATTEMPT_TIMEOUT)
        .header("content-type", payload.content_type)
        .header("x-webhook-event", &payload.event)
        .header("x-webhook-delivery", d.id.to_string())
        .header("user-agent", webhook::USER_AGENT);
    for (name, value) in &config.headers {
        if !webhook::RESERVED_HEADERS.contains(&name.to_ascii_lowercase().as_str()) {
            req = req.header(name, value);
        }
    }
    if let Some(token) = &config.token {
        req = req.header("x-a2a-notification-token", token);
    }
    if let Some(auth) = &config.authorization {
        let value = match &auth.credentials {
            Some(c) => format!("{} {c}", auth.scheme),
            None => auth.scheme.clone(),
        };
        req = req.header("authorization", value);
    }
    // Traced: the attempt is a span of its task's trace, and its request carries it.
    let traced = crate::telemetry::on().then(|| {
        let span = tracing::trace_span!(
            target: crate::telemetry::TARGET,
            "a2a.webhook.delivery",
            otel.kind = "client",
            a2a.task.id = d.key.task.task.as_str(),
            a2a.webhook.delivery.id = %d.id,
            a2a.webhook.event = payload.event.as_str(),
            a2a.webhook.attempt = d.attempt,
            http.response.status_code = tracing::field::Empty,
        );
        crate::telemetry::child_of(crate::telemetry::task_trace(&d.key.task), span)
    });
    if let Some(span) = &traced {
        let mut headers = hyper::HeaderMap::new();
        crate::telemetry::inject(span, &mut headers);
        req = req.headers(headers);
    }
    let body = payload.body;
    if let Some(secret) = &config.secret {
        req = req.header(
            "x-webhook-signature",
            webhook::signature(secret.as_bytes(), &body),
        );
    }
    match req.body(body).send().await {
        Ok(resp) => {
            if let Some(span) = &traced {
                span.record("http.response.status_code", resp.status().as_u16());
            }
            let retry_after = resp
                .headers()
                .get("retry-after")
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.trim().parse::<u64>().ok());
            Outcome::Status(resp.status().as_u16(), retry_after)
        }
        Err(e) if e.is_timeout() => Outcome::Timeout,
        Err(e) => match refusal(&e) {
            Some(refused) => Outcome::Refused(refused.to_string()),
            None => Outcome::Connect(error_chain(&e)),
        },
    }
}

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}

/// The pool: its workers, fed with the deliveries of published events.
pub(crate) struct WebhookPool {
    workers: Vec<ActorRef<WebhookMsg>>,
    live: Arc<LiveSettings>,
    metrics: Arc<WebhookMetrics>,
    recent: Arc<RecentDeliveries>,
}

impl WebhookPool {
    /// Spawns `workers` webhook actors sharing one HTTP client.
    pub(crate) async fn start(
        config: &WebhooksConfig,
        store: Arc<dyn Store>,
        agents: Arc<Agents>,
        renderers: HashMap<String, Arc<dyn PayloadRenderer>>,
    ) -> Result<Self, crate::Error> {
        let live = Arc::new(LiveSettings::default());
        live.set(config);
        let client = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .no_proxy()
            .connect_timeout(webhook::ATTEMPT_TIMEOUT)
            .timeout(webhook::ATTEMPT_TIMEOUT)
            .pool_idle_timeout(Duration::from_secs(30))
            .dns_resolver(GuardedResolver {
                allow_private: live.allow_private.clone(),
                timeout: webhook::ATTEMPT_TIMEOUT,
                what: "webhook target",
            })
            .build()
            .map_err(|e| {
                tracing::error!(error = %e, "webhook HTTP client");
                crate::Error::Internal
            })?;
        let metrics = Arc::new(WebhookMetrics::default());
        let recent = Arc::new(RecentDeliveries::default());
        let args = WebhookArgs {
            recent: recent.clone(),
            client,
            metrics: metrics.clone(),
            live: live.clone(),
            store,
            agents,
            renderers: Arc::new(renderers),
        };
        let mut refs = Vec::with_capacity(config.workers);
        for _ in 0..config.workers.max(1) {
            let (r, _) = Actor::spawn(None, WebhookActor, args.clone())
                .await
                .map_err(|e| {
                    tracing::error!(error = %e, "webhook actor spawn");
                    crate::Error::Internal
                })?;
            refs.push(r);
        }
        Ok(Self {
            workers: refs,
            live,
            metrics,
            recent,
        })
    }

    /// Puts `config`'s `allow_private_networks` and `max_pending_deliveries` in force for
    /// the deliveries from now on (`workers` needs a restart).
    pub(crate) fn reconfigure(&self, config: &WebhooksConfig) {
        self.live.set(config);
    }

    /// The latest attempts, by owner.
    pub(crate) fn recent(&self) -> &RecentDeliveries {
        &self.recent
    }

    /// The counters.
    pub(crate) fn metrics(&self) -> &Arc<WebhookMetrics> {
        &self.metrics
    }

    /// Waits up to `grace` for pending deliveries, then drops (and logs) the rest and
    /// stops the workers.
    pub(crate) async fn drain(&self, grace: Duration) {
        let deadline = tokio::time::Instant::now() + grace;
        while self.metrics.pending.load(Relaxed) > 0 && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        for w in &self.workers {
            let _ = w
                .call(WebhookMsg::DropAll, Some(Duration::from_secs(1)))
                .await;
            w.stop(None);
        }
    }

    /// The worker of a task: all its lanes live there, so its deliveries keep their order.
    fn worker(&self, key: &TaskKey) -> usize {
        let mut h = DefaultHasher::new();
        key.hash(&mut h);
        (h.finish() % self.workers.len() as u64) as usize
    }

    /// Hands deliveries (in event order per task) to their tasks' workers.
    pub(crate) fn deliver(&self, deliveries: Vec<Delivery>) {
        if self.workers.len() == 1 {
            let _ = self.workers[0].cast(WebhookMsg::Deliver(deliveries));
            return;
        }
        let mut by_worker: HashMap<usize, Vec<Delivery>> = HashMap::new();
        for d in deliveries {
            by_worker
                .entry(self.worker(&d.key.task))
                .or_default()
                .push(d);
        }
        for (i, batch) in by_worker {
            let _ = self.workers[i].cast(WebhookMsg::Deliver(batch));
        }
    }
}
