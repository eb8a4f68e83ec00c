//! The committer's prepared statements, and the SQL of an event with its planned
//! deliveries.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use futures_util::future::try_join_all;
use uuid::Uuid;

use crate::model::{ContextId, Principal, TaskEvent, TaskKey, TaskSnapshot};
use crate::store::codec;
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
    /// The batch's tasks without deliveries, and its conversation turns, in one
    /// statement: see [`GATHER_SQL`].
    pub(super) gather: tokio_postgres::Statement,
    /// The push configurations of a batch's owners (prepared: read once a batch).
    pub(super) configs: tokio_postgres::Statement,
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

/// The writes of a batch gathered into one statement (`{s}`: the schema): a row per task
/// that plans no delivery in the batch, however many of its events the batch holds — the
/// record as its last event left it, its number that event's — and a row per event and
/// per conversation turn. PostgreSQL's cost is mostly per statement (bind, plan, executor
/// start, a `RETURNING` each), so a batch's tasks cost one statement, not one per event,
/// and a task that starts and ends in one batch is inserted finished, never updated.
///
/// - `c` creates the tasks whose first event in the batch is their first (`$1`–`$10`,
///   run by this incarnation and node `$11`, `$12`, fence 1). A row already there is
///   taken only if it is this incarnation's at fence 1 and either still at its first
///   event or holding the same record (the batch retried after a commit whose answer was
///   lost); else the task is not created here (fenced).
/// - `u` moves on the others (`$13`–`$21`): only at the fence this node holds, and only
///   from the number just before the batch's first event (or a retry's, up to its last).
/// - `e` inserts the events (`$22`–`$24`) of the tasks `c` and `u` wrote, `t` the turns
///   (`$25`–`$29`, one row per turn).
///
/// Answers the ids of the tasks written; those of the batch it does not list were fenced.
pub(super) const GATHER_SQL: &str = "
WITH c AS (
  INSERT INTO {s}.tasks (id, principal, agent, task, context, state, terminal, seq, fence,
                         runner, runner_node, status_us, finished_at, record)
  SELECT x.id, x.principal, x.agent, x.task, x.context, x.state, x.terminal, x.seq, 1,
         $11::uuid, $12::text, x.status_us, CASE WHEN x.terminal THEN now() END, x.record
  FROM unnest($1::uuid[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[],
              $7::boolean[], $8::bigint[], $9::bigint[], $10::bytea[])
       AS x(id, principal, agent, task, context, state, terminal, seq, status_us, record)
  ON CONFLICT (id) DO UPDATE SET context = EXCLUDED.context, state = EXCLUDED.state,
    terminal = EXCLUDED.terminal, seq = EXCLUDED.seq, status_us = EXCLUDED.status_us,
    finished_at = EXCLUDED.finished_at, record = EXCLUDED.record
  WHERE {s}.tasks.runner = $11::uuid AND {s}.tasks.fence = 1
    AND ({s}.tasks.seq = 1 OR {s}.tasks.record = EXCLUDED.record)
  RETURNING id),
u AS (
  UPDATE {s}.tasks SET context = x.context, state = x.state, terminal = x.terminal,
    seq = x.seq, status_us = x.status_us,
    finished_at = CASE WHEN x.terminal THEN now() END, record = x.record
  FROM unnest($13::uuid[], $14::bigint[], $15::bigint[], $16::text[], $17::text[],
              $18::boolean[], $19::bigint[], $20::bigint[], $21::bytea[])
       AS x(id, fence, first, context, state, terminal, seq, status_us, record)
  WHERE {s}.tasks.id = x.id AND {s}.tasks.fence = x.fence
    AND {s}.tasks.seq BETWEEN x.first - 1 AND x.seq
  RETURNING {s}.tasks.id),
w AS (SELECT id FROM c UNION ALL SELECT id FROM u),
e AS (
  INSERT INTO {s}.events (task, seq, body)
  SELECT x.task, x.seq, x.body
  FROM unnest($22::uuid[], $23::bigint[], $24::bytea[]) AS x(task, seq, body)
  WHERE x.task IN (SELECT id FROM w)
  ON CONFLICT DO NOTHING),
t AS (
  INSERT INTO {s}.turns (principal, context, since, number, body)
  SELECT * FROM unnest($25::text[], $26::text[], $27::bigint[], $28::int[], $29::bytea[])
  ON CONFLICT (principal, context, since, number)
  DO UPDATE SET body = EXCLUDED.body, at = now())
SELECT ARRAY(SELECT id FROM w)";

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
        gather: client.prepare(&GATHER_SQL.replace("{s}", s)).await?,
        configs: client
            .prepare(&format!(
                "SELECT body FROM {s}.push WHERE owner = ANY($1) ORDER BY created_us"
            ))
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
    /// A task event written by the batch's [`GATHER_SQL`] statement.
    Gathered(Uuid),
    /// A write the batch's later one supersedes (a configuration's bookkeeping), or one
    /// the [`GATHER_SQL`] statement makes (a conversation turn).
    Nothing,
}

/// What one statement did: `None` when a task append was fenced, else the deliveries it
/// planned that wait behind earlier ones of their lane held by another node (see
/// [`plan_deliveries`]): this node does not send them.
pub(super) type Executed = Option<Vec<Uuid>>;

/// A task of the batch written by the [`GATHER_SQL`] statement: its first and last event
/// numbers, and the record its last event left.
struct Group {
    id: Uuid,
    key: TaskKey,
    fence: i64,
    first: u64,
    last: u64,
    task: Arc<TaskSnapshot>,
    turn: TurnId,
}

/// The parameters of one [`GATHER_SQL`] statement.
#[derive(Default)]
pub(super) struct Gather {
    groups: Vec<Group>,
    event_tasks: Vec<Uuid>,
    event_seqs: Vec<i64>,
    event_bodies: Vec<Vec<u8>>,
    turns: Vec<(Principal, ContextId, TurnId, Vec<u8>)>,
}

impl Gather {
    /// Takes out of `planned` what the statement writes, each task event left as
    /// [`Planned::Gathered`] and each turn as [`Planned::Nothing`]: every task event but
    /// those of a task that plans a delivery in the batch (a lane's check is per event:
    /// [`plan_deliveries`]), and the conversation turns unless the batch also forgets a
    /// conversation (its statement must then come after the turns in order).
    pub(super) fn from_batch(planned: &mut [Planned]) -> Gather {
        let delivering: HashSet<Uuid> = planned
            .iter()
            .filter_map(|p| match p {
                Planned::Task { id, deliveries, .. } if !deliveries.is_empty() => Some(*id),
                _ => None,
            })
            .collect();
        let forgets = planned
            .iter()
            .any(|p| matches!(p, Planned::Other(Write::ForgetContext { .. })));
        let mut gather = Gather::default();
        let mut groups: HashMap<Uuid, usize> = HashMap::new();
        let mut turns: HashMap<(Principal, ContextId, TurnId), usize> = HashMap::new();
        for p in planned.iter_mut() {
            match p {
                Planned::Task { id, .. } if !delivering.contains(id) => {
                    let id = *id;
                    let Planned::Task {
                        key,
                        task,
                        event,
                        turn,
                        fence,
                        ..
                    } = std::mem::replace(p, Planned::Gathered(id))
                    else {
                        continue;
                    };
                    // Not this node's: not sent, so not written (fenced).
                    let Some(fence) = fence else {
                        continue;
                    };
                    match groups.get(&id) {
                        Some(&i) => {
                            let group = &mut gather.groups[i];
                            group.last = event.seq;
                            group.task = task;
                            group.turn = turn;
                        }
                        None => {
                            groups.insert(id, gather.groups.len());
                            gather.groups.push(Group {
                                id,
                                key,
                                fence,
                                first: event.seq,
                                last: event.seq,
                                task,
                                turn,
                            });
                        }
                    }
                    gather.event_tasks.push(id);
                    gather.event_seqs.push(number(event.seq));
                    gather.event_bodies.push(codec::encode_event(&event));
                }
                Planned::Other(Write::Turn { .. }) if !forgets => {
                    let Planned::Other(Write::Turn {
                        principal,
                        context,
                        turn,
                        user,
                        reply,
                    }) = std::mem::replace(p, Planned::Nothing)
                    else {
                        continue;
                    };
                    let body = codec::encode_turn(&user, reply.as_deref());
                    // One row per turn: the statement may not write a row twice.
                    let at = (principal, context, turn);
                    match turns.get(&at) {
                        Some(&i) => gather.turns[i].3 = body,
                        None => {
                            turns.insert(at.clone(), gather.turns.len());
                            gather.turns.push((at.0, at.1, at.2, body));
                        }
                    }
                }
                _ => {}
            }
        }
        gather
    }

    pub(super) fn is_empty(&self) -> bool {
        self.groups.is_empty() && self.turns.is_empty()
    }

    /// Sends the statement (on its first poll: it goes out in the batch's flight).
    pub(super) async fn execute(
        &self,
        tx: &tokio_postgres::Client,
        prepared: &Prepared,
        me: Uuid,
        node: &str,
    ) -> std::result::Result<tokio_postgres::Row, tokio_postgres::Error> {
        let (created, moved): (Vec<&Group>, Vec<&Group>) =
            self.groups.iter().partition(|g| g.first == 1);
        let c = Columns::of(&created);
        let c_principals: Vec<&str> = created.iter().map(|g| g.key.principal.as_str()).collect();
        let c_agents: Vec<&str> = created.iter().map(|g| g.key.agent.as_str()).collect();
        let c_tasks: Vec<&str> = created.iter().map(|g| g.key.task.as_str()).collect();
        let u = Columns::of(&moved);
        let u_fences: Vec<i64> = moved.iter().map(|g| g.fence).collect();
        let u_firsts: Vec<i64> = moved.iter().map(|g| number(g.first)).collect();

        let t_principals: Vec<&str> = self.turns.iter().map(|t| t.0.as_str()).collect();
        let t_contexts: Vec<&str> = self.turns.iter().map(|t| t.1.as_str()).collect();
        let t_since: Vec<i64> = self.turns.iter().map(|t| t.2.since).collect();
        let t_numbers: Vec<i32> = self
            .turns
            .iter()
            .map(|t| i32::try_from(t.2.number).unwrap_or(i32::MAX))
            .collect();
        let t_bodies: Vec<&[u8]> = self.turns.iter().map(|t| t.3.as_slice()).collect();

        let params: [&(dyn tokio_postgres::types::ToSql + Sync); 29] = [
            &c.ids,
            &c_principals,
            &c_agents,
            &c_tasks,
            &c.contexts,
            &c.states,
            &c.terminals,
            &c.seqs,
            &c.status,
            &c.records,
            &me,
            &node,
            &u.ids,
            &u_fences,
            &u_firsts,
            &u.contexts,
            &u.states,
            &u.terminals,
            &u.seqs,
            &u.status,
            &u.records,
            &self.event_tasks,
            &self.event_seqs,
            &self.event_bodies,
            &t_principals,
            &t_contexts,
            &t_since,
            &t_numbers,
            &t_bodies,
        ];
        tx.query_one(&prepared.gather, &params).await
    }
}

/// An event number as PostgreSQL's `bigint`.
fn number(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// The columns [`GATHER_SQL`]'s created and moved-on tasks share.
struct Columns<'a> {
    ids: Vec<Uuid>,
    contexts: Vec<&'a str>,
    states: Vec<&'static str>,
    terminals: Vec<bool>,
    /// The number of the task's last event in the batch.
    seqs: Vec<i64>,
    status: Vec<i64>,
    records: Vec<Vec<u8>>,
}

impl<'a> Columns<'a> {
    fn of(groups: &[&'a Group]) -> Columns<'a> {
        Columns {
            ids: groups.iter().map(|g| g.id).collect(),
            contexts: groups.iter().map(|g| g.task.context_id.as_str()).collect(),
            states: groups
                .iter()
                .map(|g| g.task.status.state.as_str())
                .collect(),
            terminals: groups
                .iter()
                .map(|g| g.task.status.state.is_terminal())
                .collect(),
            seqs: groups.iter().map(|g| number(g.last)).collect(),
            status: groups
                .iter()
                .map(|g| g.task.status.timestamp.timestamp_micros())
                .collect(),
            records: groups
                .iter()
                .map(|g| codec::encode_task(&g.task, g.turn))
                .collect(),
        }
    }
}
