//! The committer's prepared statements, and the SQL of an event with its planned
//! deliveries.

use std::sync::Arc;

use futures_util::future::try_join_all;
use uuid::Uuid;

use crate::model::{TaskEvent, TaskKey, TaskSnapshot};
use crate::store::{TurnId, Write};

/// One prepared statement per kind of write, for a connection.
pub(super) struct Prepared {
    pub(super) create: tokio_postgres::Statement,
    /// An event: without deliveries (`[0]`, most events: a statement PostgreSQL plans
    /// quickly) and with them (`[1]`, see [`plan_deliveries`]).
    pub(super) next: [tokio_postgres::Statement; 2],
    /// An event followed by a later one of the same task in the same batch: its record
    /// is superseded before the commit, so only the numbering moves. Indexed as `next`.
    pub(super) light: [tokio_postgres::Statement; 2],
    /// The other writes' statements, prepared up front so that a batch goes out in one
    /// flight (a statement prepared on the way would reach the server after COMMIT).
    pub(super) other: Vec<tokio_postgres::Statement>,
    /// One `NOTIFY` per payload.
    pub(super) notify: tokio_postgres::Statement,
}

/// Which of [`OTHER_SQL`] (and of `Prepared::other`) a write uses.
#[derive(Clone, Copy)]
pub(super) enum Other {
    TurnPut,
    TurnsForget,
    PushStats,
    PushNamed,
    PushScoped,
    PushRemove,
    PushRemoveNamed,
    OutboxDone,
    OutboxRetry,
}

const _: () = assert!(OTHER_SQL.len() == Other::OutboxRetry as usize + 1);

impl Prepared {
    pub(super) fn other(&self, which: Other) -> &tokio_postgres::Statement {
        &self.other[which as usize]
    }
}

/// The other writes' statements (`{s}`: the schema), in the order of [`Other`].
pub(super) const OTHER_SQL: &[&str] = &[
    "INSERT INTO {s}.turns (principal, context, since, number, body)
                             VALUES ($1, $2, $3, $4, $5)
                             ON CONFLICT (principal, context, since, number)
                             DO UPDATE SET body = EXCLUDED.body, at = now()",
    "DELETE FROM {s}.turns WHERE principal = $1 AND context = $2 AND since = $3",
    "UPDATE {s}.push SET body = $5 WHERE owner = $1
                                 AND task IS NOT DISTINCT FROM $2 AND named = $3 AND id = $4",
    "INSERT INTO {s}.push (owner, task, named, id, created_us, body)
                                 VALUES ($1, $2, true, $3, $4, $5)
                                 ON CONFLICT (owner, task, id) WHERE named
                                 DO UPDATE SET body = EXCLUDED.body",
    "WITH d AS (DELETE FROM {s}.push WHERE owner = $1
                                   AND task IS NOT DISTINCT FROM $2 AND NOT named)
                                 INSERT INTO {s}.push (owner, task, named, id, created_us, body)
                                 VALUES ($1, $2, false, $3, $4, $5)",
    "DELETE FROM {s}.push WHERE owner = $1 AND task IS NOT DISTINCT FROM $2 AND NOT named",
    "DELETE FROM {s}.push WHERE owner = $1 AND task = $2 AND named AND id = $3",
    "DELETE FROM {s}.outbox WHERE delivery = $1",
    "UPDATE {s}.outbox SET attempt = $2, due_us = $3 WHERE delivery = $1",
];

/// Prepares the task statements on a committer connection.
pub(super) async fn prepare(
    client: &tokio_postgres::Client,
    s: &str,
) -> std::result::Result<Prepared, tokio_postgres::Error> {
    Ok(Prepared {
        create: client
            .prepare(&format!(
                "WITH t AS (INSERT INTO {s}.tasks (id, principal, agent, task, context, state, terminal,
                    seq, fence, runner, runner_node, status_us, finished_at, record)
                  VALUES ($1, $2, $3, $4, $5, $6, $7::boolean, 1, 1, $8, $9, $10::bigint,
                          CASE WHEN $7::boolean THEN now() END, $11)
                  ON CONFLICT (id) DO UPDATE SET fence = {s}.tasks.fence
                    WHERE {s}.tasks.runner = $8 AND {s}.tasks.seq = 1 AND {s}.tasks.fence = 1
                  RETURNING id),
                 e AS (INSERT INTO {s}.events (task, seq, body) SELECT id, 1, $12 FROM t
                       ON CONFLICT DO NOTHING),
                 o AS (INSERT INTO {s}.outbox (delivery, task, seq, config, attempt, due_us, claimed_by, claimed_node)
                       SELECT x.d, $1, 1, x.c, 1, NULL, $8, $9 FROM t, unnest($13::uuid[], $14::text[]) AS x(d, c)
                       ON CONFLICT DO NOTHING)
                 SELECT count(*) FROM t"
            ))
            .await?,
        next: append_pair(
            client,
            &format!(
                "WITH t AS (UPDATE {s}.tasks SET context = $2, state = $3, terminal = $4::boolean,
                    seq = $5::bigint, status_us = $6::bigint,
                    finished_at = CASE WHEN $4::boolean THEN now() END, record = $7
                  WHERE id = $1 AND fence = $8::bigint AND (seq = $5::bigint - 1 OR seq = $5::bigint)
                  RETURNING id),
                 e AS (INSERT INTO {s}.events (task, seq, body) SELECT id, $5::bigint, $9 FROM t
                       ON CONFLICT DO NOTHING)"
            ),
            s,
            "$5",
            (["$11", "$12"], ["$10", "$13"]),
        )
        .await?,
        notify: client
            .prepare("SELECT pg_notify($1::text, p) FROM unnest($2::text[]) AS p")
            .await?,
        other: {
            let texts: Vec<String> = OTHER_SQL.iter().map(|q| q.replace("{s}", s)).collect();
            try_join_all(texts.iter().map(|q| client.prepare(q))).await?
        },
        light: append_pair(
            client,
            &format!(
                "WITH t AS (UPDATE {s}.tasks SET seq = $2::bigint
                  WHERE id = $1 AND fence = $3::bigint AND (seq = $2::bigint - 1 OR seq = $2::bigint)
                  RETURNING id),
                 e AS (INSERT INTO {s}.events (task, seq, body) SELECT id, $2::bigint, $4 FROM t
                       ON CONFLICT DO NOTHING)"
            ),
            s,
            "$2",
            (["$6", "$7"], ["$5", "$8"]),
        )
        .await?,
    })
}

/// An append statement (`head`: its `t` and `e` parts) prepared twice: `[0]` for an event
/// without deliveries (most events: a statement PostgreSQL plans quickly), `[1]` for one
/// that plans them (see [`plan_deliveries`]; `params` name its parameters there).
pub(super) async fn append_pair(
    client: &tokio_postgres::Client,
    head: &str,
    s: &str,
    seq: &str,
    params: ([&str; 2], [&str; 2]),
) -> std::result::Result<[tokio_postgres::Statement; 2], tokio_postgres::Error> {
    let plain = format!("{head}{}", plan_deliveries(s, seq, None));
    let planned = format!("{head}{}", plan_deliveries(s, seq, Some(params)));
    let (plain, planned) =
        futures_util::try_join!(client.prepare(&plain), client.prepare(&planned))?;
    Ok([plain, planned])
}

/// The end of an append statement (after its `t` and `e` parts): with `deliveries`, it
/// plans the event's deliveries — outbox rows for the task `$1`, event `seq`, deliveries
/// and configurations `[ids, configs]`, claimed by this incarnation and node `[me, node]`
/// — unless the lane (task, configuration) still holds a delivery that is not this
/// incarnation's: one a node that took the lane over holds, one of a dead node nobody
/// claimed yet, or one already waiting so. Such a delivery is inserted unclaimed, and
/// whoever holds (or claims) the lane takes it at its next heartbeat, so a lane's
/// deliveries go out from one node, in order, across a takeover. Answers the append's
/// count and the deliveries left unclaimed.
pub(super) fn plan_deliveries(
    s: &str,
    seq: &str,
    deliveries: Option<([&str; 2], [&str; 2])>,
) -> String {
    let Some(([ids, configs], [me, node])) = deliveries else {
        return "\n SELECT (SELECT count(*) FROM t), ARRAY[]::uuid[]".into();
    };
    let held = format!(
        "EXISTS (SELECT 1 FROM {s}.outbox p WHERE p.task = $1 AND p.config = x.c
                   AND p.claimed_by IS DISTINCT FROM {me}::uuid)"
    );
    format!(
        ",
         o AS (INSERT INTO {s}.outbox (delivery, task, seq, config, attempt, due_us, claimed_by, claimed_node)
               SELECT x.d, $1, {seq}::bigint, x.c, 1, NULL,
                      CASE WHEN {held} THEN NULL ELSE {me}::uuid END,
                      CASE WHEN {held} THEN NULL ELSE {node}::text END
               FROM t, unnest({ids}::uuid[], {configs}::text[]) AS x(d, c)
               ON CONFLICT DO NOTHING
               RETURNING delivery, claimed_by)
         SELECT (SELECT count(*) FROM t), ARRAY(SELECT delivery FROM o WHERE claimed_by IS NULL)"
    )
}

/// The outcome of an append: `None` when it was fenced.
pub(super) fn executed(row: &tokio_postgres::Row) -> Executed {
    (row.get::<_, i64>(0) == 1).then(|| row.get::<_, Vec<Uuid>>(1))
}

/// One statement of a batch.
pub(super) enum Planned {
    Task {
        id: Uuid,
        key: TaskKey,
        task: Arc<TaskSnapshot>,
        event: Arc<TaskEvent>,
        turn: TurnId,
        /// `None`: this node does not hold the task (its append is fenced).
        fence: Option<i64>,
        deliveries: Vec<(Uuid, String)>,
        /// The task's last event in the batch: it writes the record.
        last: bool,
    },
    Other(Write),
    /// A write the batch's later one supersedes (a configuration's bookkeeping).
    Nothing,
}

/// What one statement did: `None` when a task append was fenced, else the deliveries it
/// planned that wait behind earlier ones of their lane held by another node (see
/// [`plan_deliveries`]): this node does not send them.
pub(super) type Executed = Option<Vec<Uuid>>;
