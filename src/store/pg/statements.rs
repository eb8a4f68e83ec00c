//! The committer's prepared statements, and the one statement that writes a batch's
//! tasks, their events, outbox rows and conversation turns ([`GATHER_SQL`]).

use std::collections::HashMap;
use std::sync::Arc;

use futures_util::future::try_join_all;
use uuid::Uuid;

use crate::model::{ContextId, Principal, TaskKey, TaskSnapshot};
use crate::store::codec;
use crate::store::{Delivery, TurnId, Write, delivery_id};

/// The statements of a committer's connection, prepared once.
pub(super) struct Prepared {
    /// The batch's task events, outbox rows and turns: see [`GATHER_SQL`].
    pub(super) gather: tokio_postgres::Statement,
    /// The push configurations of a batch's owners (read once a batch).
    pub(super) configs: tokio_postgres::Statement,
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
    "UPDATE {s}.outbox SET attempt = $2, due_us = $3 WHERE delivery = $1",
];

/// A batch's writes in one statement (`{s}`: the schema): a row per task, however many
/// of its events the batch holds — the record as its last event left it, its number that
/// event's — and a row per event, per planned delivery, per conversation turn and per
/// delivery done. PostgreSQL's cost is mostly per statement (bind, plan, executor start),
/// so a batch costs one statement, not one per event, and a task that starts and ends in
/// one batch is inserted finished, never updated.
///
/// - `c` creates the tasks whose first event in the batch is their first (`$1`–`$10`,
///   run by this incarnation and node `$11`, `$12`, fence 1). A row already there is
///   taken only if it is this incarnation's at fence 1 and either still at its first
///   event or holding the same record (the batch retried after a commit whose answer was
///   lost); else the task is not created here (fenced).
/// - `u` moves on the others (`$13`–`$21`): only at the fence this node holds, and only
///   from the number just before the batch's first event (or a retry's, up to its last).
/// - `e` inserts the events (`$22`–`$24`) and `o` the planned deliveries (`$30`–`$33`:
///   delivery, task, event, configuration) of the tasks `c` and `u` wrote. A delivery is
///   claimed by this incarnation unless its lane (task, configuration) already holds a
///   delivery that is not this incarnation's — one a node that took the lane over holds,
///   one of a dead node nobody claimed yet, or one already waiting so: then it is
///   inserted unclaimed, and whoever holds (or claims) the lane takes it at its next
///   heartbeat, so a lane's deliveries go out from one node, in order, across a
///   takeover. (The rows `o` inserts are not visible to its own check; they are this
///   incarnation's, or unclaimed because of a row that was, so the answer is the same.)
/// - `t` writes the turns (`$25`–`$29`, one row per turn), `d` deletes the deliveries
///   done (`$34`).
///
/// Answers the ids of the tasks written (those of the batch it does not list were
/// fenced) and the deliveries it inserted unclaimed (this node does not send them).
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
  DO UPDATE SET body = EXCLUDED.body, at = now()),
o AS (
  INSERT INTO {s}.outbox (delivery, task, seq, config, attempt, due_us, claimed_by, claimed_node)
  SELECT x.d, x.task, x.seq, x.c, 1, NULL,
         CASE WHEN h.held THEN NULL ELSE $11::uuid END,
         CASE WHEN h.held THEN NULL ELSE $12::text END
  FROM unnest($30::uuid[], $31::uuid[], $32::bigint[], $33::text[]) AS x(d, task, seq, c)
  CROSS JOIN LATERAL (SELECT EXISTS (
    SELECT 1 FROM {s}.outbox p WHERE p.task = x.task AND p.config = x.c
      AND p.claimed_by IS DISTINCT FROM $11::uuid) AS held) h
  WHERE x.task IN (SELECT id FROM w)
  ON CONFLICT DO NOTHING
  RETURNING delivery, claimed_by),
d AS (DELETE FROM {s}.outbox WHERE delivery = ANY($34::uuid[]))
SELECT ARRAY(SELECT id FROM w), ARRAY(SELECT delivery FROM o WHERE claimed_by IS NULL)";

/// Prepares a committer connection's statements.
pub(super) async fn prepare(
    client: &tokio_postgres::Client,
    s: &str,
) -> std::result::Result<Prepared, tokio_postgres::Error> {
    // Each statement is planned once for the connection. PostgreSQL would otherwise plan
    // the gathered statement anew for many of its executions (its generic plan's estimate
    // loses to the custom ones' on arrays of unknown length), which cost more than the
    // writes of a small batch.
    client
        .batch_execute("SET plan_cache_mode = force_generic_plan")
        .await?;
    Ok(Prepared {
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
        notify: client
            .prepare("SELECT pg_notify($1::text, p) FROM unnest($2::text[]) AS p")
            .await?,
    })
}

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
    /// Where each task's group is in `groups`.
    by_task: HashMap<Uuid, usize>,
    event_tasks: Vec<Uuid>,
    event_seqs: Vec<i64>,
    event_bodies: Vec<Vec<u8>>,
    /// Planned deliveries: the delivery, its task, event and configuration.
    delivery_ids: Vec<Uuid>,
    delivery_tasks: Vec<Uuid>,
    delivery_seqs: Vec<i64>,
    delivery_configs: Vec<String>,
    turns: Vec<(Principal, ContextId, TurnId, Vec<u8>)>,
    done: Vec<Uuid>,
}

impl Gather {
    /// Adds a task's event (`write`, of the task with row id `id`) and the deliveries it
    /// plans. `fence` is the fence this node holds; `None` (not this node's task): nothing
    /// is sent, so it is not written and the answer calls it fenced.
    pub(super) fn event(
        &mut self,
        id: Uuid,
        fence: Option<i64>,
        write: &Write,
        deliveries: &[Delivery],
    ) {
        let (
            Some(fence),
            Write::Task {
                key,
                task,
                event,
                turn,
                ..
            },
        ) = (fence, write)
        else {
            return;
        };
        let turn = *turn;
        match self.by_task.get(&id) {
            Some(&i) => {
                let group = &mut self.groups[i];
                group.last = event.seq;
                group.task = task.clone();
                group.turn = turn;
            }
            None => {
                self.by_task.insert(id, self.groups.len());
                self.groups.push(Group {
                    id,
                    key: key.clone(),
                    fence,
                    first: event.seq,
                    last: event.seq,
                    task: task.clone(),
                    turn,
                });
            }
        }
        self.event_tasks.push(id);
        self.event_seqs.push(number(event.seq));
        self.event_bodies.push(codec::encode_event(event));
        for d in deliveries {
            self.delivery_ids.push(d.id);
            self.delivery_tasks.push(id);
            self.delivery_seqs.push(number(event.seq));
            self.delivery_configs.push(d.key.config.clone());
        }
    }

    /// Takes out of `planned` the other writes the statement makes (each left `None`):
    /// the deliveries done, and the conversation turns unless the batch also forgets a
    /// conversation (its statement must then come after the turns, in order).
    pub(super) fn take_others(&mut self, planned: &mut [Option<&Write>]) {
        let forgets = planned
            .iter()
            .any(|p| matches!(p, Some(Write::ForgetContext { .. })));
        let mut turns: HashMap<(&Principal, &ContextId, TurnId), usize> = HashMap::new();
        for p in planned.iter_mut() {
            match *p {
                Some(Write::OutboxDone(key)) => {
                    self.done.push(delivery_id(key));
                    *p = None;
                }
                Some(Write::Turn {
                    principal,
                    context,
                    turn,
                    user,
                    reply,
                }) if !forgets => {
                    let body = codec::encode_turn(user, reply.as_deref());
                    // One row per turn: the statement may not write a row twice.
                    match turns.get(&(principal, context, *turn)) {
                        Some(&i) => self.turns[i].3 = body,
                        None => {
                            turns.insert((principal, context, *turn), self.turns.len());
                            self.turns
                                .push((principal.clone(), context.clone(), *turn, body));
                        }
                    }
                    *p = None;
                }
                _ => {}
            }
        }
    }

    pub(super) fn is_empty(&self) -> bool {
        self.groups.is_empty() && self.turns.is_empty() && self.done.is_empty()
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

        let params: [&(dyn tokio_postgres::types::ToSql + Sync); 34] = [
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
            &self.delivery_ids,
            &self.delivery_tasks,
            &self.delivery_seqs,
            &self.delivery_configs,
            &self.done,
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
