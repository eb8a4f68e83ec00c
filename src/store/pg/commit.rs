//! The committer: one task with its own connection, one transaction per batch, its task
//! events in one gathered statement ([`Gather`]), each task checked against its fence.

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

use futures_util::future::try_join_all;
use tokio::sync::mpsc;
use uuid::Uuid;

use super::statements::{Gather, Other, Prepared, prepare};
use super::{
    COMMIT_TIMEOUT, CONNECT_TIMEOUT, Inner, Msg, NOTIFY_MAX, Owned, RECENT, connect, owner_id,
    row_id,
};
use crate::model::TaskKey;
use crate::push::{Namespace, StoredPushConfig};
use crate::store::cluster::Signal;
use crate::store::codec;
use crate::store::{Committed, Delivery, StatsOnce, Then, Write, deliveries_for, delivery_id};

/// What one job's writes came to.
pub(super) enum Outcome {
    Done(Committed),
    /// A task of the job is no longer this node's (its fence moved on).
    Fenced(Vec<TaskKey>),
}

pub(super) async fn committer(
    inner: Arc<Inner>,
    mut rx: mpsc::UnboundedReceiver<Msg>,
    max_batch: usize,
) {
    let mut client: Option<(tokio_postgres::Client, Prepared)> = None;
    let mut closing: Option<std::sync::mpsc::Sender<()>> = None;
    while closing.is_none() {
        let Some(first) = rx.recv().await else {
            break;
        };
        // The writes, and apart from them (they are not `Sync`) the continuations.
        let mut batch: Vec<Vec<Write>> = Vec::new();
        let mut thens: Vec<Option<Then>> = Vec::new();
        let mut writes = 0;
        match first {
            Msg::Job(j) => {
                writes += j.writes.len();
                batch.push(j.writes);
                thens.push(j.then);
            }
            Msg::Close(tx) => closing = Some(tx),
        }
        while writes < max_batch && closing.is_none() {
            match rx.try_recv() {
                Ok(Msg::Job(j)) => {
                    writes += j.writes.len();
                    batch.push(j.writes);
                    thens.push(j.then);
                }
                Ok(Msg::Close(tx)) => closing = Some(tx),
                Err(_) => break,
            }
        }
        if batch.is_empty() {
            continue;
        }
        let mut delay = Duration::from_millis(50);
        let outcomes = loop {
            if client.as_ref().is_none_or(|(c, _)| c.is_closed()) {
                client = match connect(&inner.pg, inner.tls.as_ref(), None).await {
                    Ok(c) => {
                        match tokio::time::timeout(CONNECT_TIMEOUT, prepare(&c, &inner.schema))
                            .await
                        {
                            Ok(Ok(p)) => Some((c, p)),
                            _ => None,
                        }
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "the postgres committer cannot connect");
                        None
                    }
                };
            }
            if let Some((c, p)) = client.as_mut() {
                let started = Instant::now();
                match tokio::time::timeout(COMMIT_TIMEOUT, commit(&inner, c, p, &batch)).await {
                    Ok(Ok(outcomes)) => {
                        let us = u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX);
                        inner.append_sum.fetch_add(us, Relaxed);
                        inner.append_max.fetch_max(us, Relaxed);
                        let mut recent = inner
                            .append_recent
                            .lock()
                            .unwrap_or_else(|e| e.into_inner());
                        if recent.len() == RECENT {
                            recent.pop_front();
                        }
                        recent.push_back(u32::try_from(us).unwrap_or(u32::MAX));
                        break outcomes;
                    }
                    Ok(Err(e)) => {
                        tracing::error!(error = %e, "postgres commit failed; retrying")
                    }
                    Err(_) => tracing::error!("postgres commit timed out; retrying"),
                }
                client = None;
            }
            inner.failing.store(true, Relaxed);
            if inner.stop.is_cancelled() && closing.is_some() {
                // Shutting down with the engine gone: what was not durable is not told.
                break Vec::new();
            }
            tokio::time::sleep(delay).await;
            delay = (delay * 2).min(Duration::from_secs(2));
        };
        inner.failing.store(false, Relaxed);
        inner.commits.fetch_add(1, Relaxed);
        inner.committed_writes.fetch_add(writes as u64, Relaxed);
        inner.backlog.fetch_sub(writes as u64, Relaxed);
        for (then, outcome) in thens.into_iter().zip(outcomes) {
            match outcome {
                Outcome::Done(committed) => {
                    if let Some(then) = then {
                        then(committed);
                    }
                }
                Outcome::Fenced(keys) => {
                    for key in keys {
                        inner.owned.remove(&row_id(&key));
                        inner.fenced.fetch_add(1, Relaxed);
                        if inner.signals.try_send(Signal::Fenced(key)).is_err() {
                            tracing::warn!(
                                "cluster signal queue full: a fenced task is stopped at its next append"
                            );
                        }
                    }
                }
            }
        }
    }
    if let Some(tx) = closing {
        let _ = tx.send(());
    }
}

/// Commits one batch in one transaction; one outcome per job.
pub(super) async fn commit(
    inner: &Inner,
    client: &mut tokio_postgres::Client,
    prepared: &Prepared,
    batch: &[Vec<Write>],
) -> std::result::Result<Vec<Outcome>, tokio_postgres::Error> {
    let s = &inner.schema;
    let me = inner.incarnation();

    // The push configurations of the batch's owners, then the batch's own changes to them
    // in order: what each event's deliveries are planned from.
    let owners: Vec<Uuid> = batch
        .iter()
        .flatten()
        .filter_map(|w| match w {
            Write::Task { key, .. } => Some(owner_id(&key.principal, &key.agent)),
            _ => None,
        })
        .collect::<HashSet<_>>()
        .into_iter()
        .collect();
    // The transaction is pipelined by hand: BEGIN and the configurations' read in one
    // flight, then every statement, the NOTIFYs and COMMIT in a second. A statement that
    // fails aborts the transaction (its COMMIT then rolls back) and fails the batch,
    // which is retried on a new connection.
    let tx: &tokio_postgres::Client = client;
    let (_, rows) = futures_util::try_join!(tx.batch_execute("BEGIN"), async {
        if owners.is_empty() {
            Ok(Vec::new())
        } else {
            tx.query(&prepared.configs, &[&owners]).await
        }
    })?;
    let mut configs: Vec<Arc<StoredPushConfig>> = rows
        .iter()
        .filter_map(|r| codec::decode_push(r.get::<_, &[u8]>(0), &inner.sealer))
        .map(|c| inner.config(c))
        .collect();

    // Plan every write first (in order), then send them all at once (pipelined): the
    // task events, their deliveries, the turns and the deliveries done in one statement,
    // the other writes (`None` once superseded or gathered) one statement each.
    let mut planned: Vec<Option<&Write>> = Vec::new();
    let mut gathered = Gather::default();
    let mut plans: Vec<Vec<(Uuid, Vec<Delivery>, TaskKey)>> = Vec::with_capacity(batch.len());
    let mut touched: Vec<Uuid> = Vec::new();
    for job in batch {
        let mut mine = Vec::new();
        for w in job {
            match w {
                Write::Task {
                    key,
                    task,
                    event,
                    changed,
                    ..
                } => {
                    let deliveries = deliveries_for(key, task, event, *changed, configs.iter());
                    let id = row_id(key);
                    touched.push(id);
                    let fence = match inner.owned.get(&id) {
                        Some(o) => Some(o.fence),
                        None if event.seq == 1 => {
                            inner.owned.insert(
                                id,
                                Owned {
                                    key: key.clone(),
                                    fence: 1,
                                },
                            );
                            Some(1)
                        }
                        None => None,
                    };
                    gathered.event(id, fence, w, &deliveries);
                    mine.push((id, deliveries, key.clone()));
                }
                Write::PushSet(c) => {
                    match c.namespace {
                        Namespace::Scoped => configs
                            .retain(|o| !(o.namespace == Namespace::Scoped && o.scope == c.scope)),
                        Namespace::Named => configs.retain(|o| {
                            !(o.namespace == Namespace::Named && o.scope == c.scope && o.id == c.id)
                        }),
                    }
                    configs.push(c.clone());
                    inner.configs.insert(c.id.clone(), c.clone());
                    planned.push(Some(w));
                }
                Write::PushRemove(scope) => {
                    configs.retain(|o| !(o.namespace == Namespace::Scoped && o.scope == *scope));
                    planned.push(Some(w));
                }
                Write::PushRemoveNamed { task, id } => {
                    configs.retain(|o| {
                        !(o.namespace == Namespace::Named
                            && o.id == *id
                            && o.scope.principal == task.principal
                            && o.scope.agent == task.agent
                            && o.scope.task.as_ref() == Some(&task.task))
                    });
                    planned.push(Some(w));
                }
                _ => planned.push(Some(w)),
            }
        }
        plans.push(mine);
    }

    // Only a configuration's last bookkeeping is written.
    let mut stats = StatsOnce::default();
    for p in planned.iter_mut().rev() {
        if p.is_some_and(|w| stats.superseded(w)) {
            *p = None;
        }
    }
    gathered.take_others(&mut planned);
    let gather = async {
        if gathered.is_empty() {
            return Ok((HashSet::new(), Vec::new()));
        }
        let row = gathered.execute(tx, prepared, me, &inner.node).await?;
        let written: HashSet<Uuid> = row.get::<_, Vec<Uuid>>(0).into_iter().collect();
        Ok((written, row.get::<_, Vec<Uuid>>(1)))
    };
    let statements = try_join_all(
        planned
            .iter()
            .flatten()
            .map(|w| execute(tx, prepared, w, &inner.sealer)),
    );

    touched.sort_unstable();
    touched.dedup();
    let mut payload = String::new();
    let mut notifies = Vec::new();
    for id in &touched {
        if payload.len() + 33 > NOTIFY_MAX {
            notifies.push(std::mem::take(&mut payload));
        }
        if !payload.is_empty() {
            payload.push(',');
        }
        payload.push_str(&id.simple().to_string());
    }
    if !payload.is_empty() {
        notifies.push(payload);
    }
    let channel = format!("{s}_ev");
    let notify_params: [&(dyn tokio_postgres::types::ToSql + Sync); 2] = [&channel, &notifies];
    let notified = tx.execute(&prepared.notify, &notify_params);
    let ((written, waiting), _, _, ()) =
        futures_util::try_join!(gather, statements, notified, tx.batch_execute("COMMIT"))?;

    Ok(plans
        .into_iter()
        .map(|mine| {
            let mut committed = Committed::default();
            let mut fenced = Vec::new();
            for (id, deliveries, key) in mine {
                if written.contains(&id) {
                    committed
                        .deliveries
                        .extend(deliveries.into_iter().filter(|d| !waiting.contains(&d.id)));
                } else if !fenced.contains(&key) {
                    fenced.push(key);
                }
            }
            if fenced.is_empty() {
                Outcome::Done(committed)
            } else {
                Outcome::Fenced(fenced)
            }
        })
        .collect())
}

/// Runs the statement of one write the gathered statement does not make.
pub(super) async fn execute(
    tx: &tokio_postgres::Client,
    prepared: &Prepared,
    w: &Write,
    sealer: &super::super::seal::Sealer,
) -> std::result::Result<(), tokio_postgres::Error> {
    match w {
        Write::Turn {
            principal,
            context,
            turn,
            user,
            reply,
        } => {
            let body = codec::encode_turn(user, reply.as_deref());
            let number = i32::try_from(turn.number).unwrap_or(i32::MAX);
            tx.execute(
                prepared.other(Other::TurnPut),
                &[
                    &principal.as_str(),
                    &context.as_str(),
                    &turn.since,
                    &number,
                    &body,
                ],
            )
            .await?;
        }
        Write::ForgetContext {
            principal,
            context,
            since,
        } => {
            tx.execute(
                prepared.other(Other::TurnsForget),
                &[&principal.as_str(), &context.as_str(), since],
            )
            .await?;
        }
        Write::PushSet(c) | Write::PushStats(c) => {
            let owner = owner_id(&c.scope.principal, &c.scope.agent);
            let task = c.scope.task.as_ref().map(|t| t.as_str().to_string());
            let named = c.namespace == Namespace::Named;
            let body = codec::encode_push(c, sealer);
            if matches!(w, Write::PushStats(_)) {
                tx.execute(
                    prepared.other(Other::PushStats),
                    &[&owner, &task, &named, &c.id, &body],
                )
                .await?;
            } else {
                let which = if named {
                    Other::PushNamed
                } else {
                    Other::PushScoped
                };
                tx.execute(
                    prepared.other(which),
                    &[
                        &owner,
                        &task,
                        &c.id,
                        &c.created_at.timestamp_micros(),
                        &body,
                    ],
                )
                .await?;
            }
        }
        Write::PushRemove(scope) => {
            let owner = owner_id(&scope.principal, &scope.agent);
            let task = scope.task.as_ref().map(|t| t.as_str().to_string());
            tx.execute(prepared.other(Other::PushRemove), &[&owner, &task])
                .await?;
        }
        Write::PushRemoveNamed { task, id } => {
            let owner = owner_id(&task.principal, &task.agent);
            tx.execute(
                prepared.other(Other::PushRemoveNamed),
                &[&owner, &task.task.as_str(), id],
            )
            .await?;
        }
        Write::OutboxRetry { key, attempt, due } => {
            let attempt = i32::try_from(*attempt).unwrap_or(i32::MAX);
            tx.execute(
                prepared.other(Other::OutboxRetry),
                &[&delivery_id(key), &attempt, &due.timestamp_micros()],
            )
            .await?;
        }
        // Written by the gathered statement.
        Write::Task { .. } | Write::OutboxDone(_) => {}
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{ClusterConfig, Config};
    use crate::model::TaskState;
    use crate::store::Store as _;
    use crate::store::contract::{block, event, key, pg_test_setup};
    use crate::store::pg::PgStore;

    fn turn_of(w: &Write) -> Write {
        let Write::Task {
            key, task, turn, ..
        } = w
        else {
            panic!("a task's write");
        };
        Write::Turn {
            principal: key.principal.clone(),
            context: task.context_id.clone(),
            turn: *turn,
            user: task.history[0].clone(),
            reply: task.status.message.clone(),
        }
    }

    /// One batch: a task submitted, worked on and finished (one row inserted finished),
    /// another only created, a task this node does not hold and a gap in a task's
    /// numbers (both fenced); the same batch again, as after a commit whose answer was
    /// lost, is kept and not fenced; and the tasks move on in a later batch.
    #[test]
    fn a_batch_is_gathered_into_one_statement_and_its_retry_is_kept() {
        let Some((rt, url, schema)) = pg_test_setup("a2ad_gather") else {
            return;
        };
        let mut cluster = ClusterConfig::postgres(url);
        cluster.schema = schema;
        cluster.node_id = Some("g1".into());
        let config = Config {
            cluster: Some(cluster.clone()),
            ..Config::default()
        };
        let store = rt
            .block_on(PgStore::open(&config, &cluster, Default::default()))
            .expect("the store opens");
        let inner = store.inner.clone();
        let (a, b, c) = (
            key("alice", "g-a"),
            key("alice", "g-b"),
            key("alice", "g-c"),
        );
        let done = event(&a, "ga", 3, TaskState::Completed);
        let first = vec![
            vec![
                event(&a, "ga", 1, TaskState::Submitted),
                event(&a, "ga", 2, TaskState::Working),
                turn_of(&done),
                done,
            ],
            vec![event(&b, "gb", 1, TaskState::Submitted)],
            vec![event(&c, "gc", 2, TaskState::Working)],
        ];
        let fenced = |outcomes: &[Outcome]| -> Vec<Option<Vec<String>>> {
            outcomes
                .iter()
                .map(|o| match o {
                    Outcome::Done(_) => None,
                    Outcome::Fenced(keys) => {
                        Some(keys.iter().map(|k| k.task.as_str().to_string()).collect())
                    }
                })
                .collect()
        };
        let (pg, schema) = (inner.pg.clone(), inner.schema.clone());
        rt.block_on(async {
            let mut client = connect(&pg, None, None).await.expect("connects");
            let prepared = prepare(&client, &schema).await.expect("prepares");
            for round in ["first", "retried"] {
                let outcomes = commit(&inner, &mut client, &prepared, &first)
                    .await
                    .expect("commits");
                assert_eq!(
                    fenced(&outcomes),
                    vec![None, None, Some(vec!["g-c".to_string()])],
                    "{round}"
                );
            }
            let later = vec![
                vec![
                    event(&b, "gb", 2, TaskState::Working),
                    event(&b, "gb", 3, TaskState::Completed),
                ],
                vec![event(&a, "ga", 5, TaskState::Failed)],
            ];
            let outcomes = commit(&inner, &mut client, &prepared, &later)
                .await
                .expect("commits");
            assert_eq!(fenced(&outcomes), vec![None, Some(vec!["g-a".to_string()])]);
            let turns: i64 = client
                .query_one(&format!("SELECT count(*) FROM {schema}.turns"), &[])
                .await
                .expect("reads")
                .get(0);
            assert_eq!(turns, 1, "the finished task's turn, once");
        });
        for (k, state) in [(&a, TaskState::Completed), (&b, TaskState::Completed)] {
            let got = block(store.task(k)).expect("read").expect("the task");
            assert_eq!((got.seq, got.status.state), (3, state), "{}", k.task);
            let events = block(store.events(k, 0)).expect("events");
            assert_eq!(
                events.iter().map(|e| e.seq).collect::<Vec<_>>(),
                vec![1, 2, 3],
                "{}",
                k.task
            );
        }
        assert!(block(store.task(&c)).expect("read").is_none());
        rt.block_on(store.drop_schema()).expect("drop the schema");
    }
}
