//! Reads: task records, events, lists and push configurations, through the pool, each
//! bounded by `QUERY_TIMEOUT`.

use std::sync::Arc;

use tokio_postgres::Row;
use uuid::Uuid;

use super::{Inner, bounded, db, row_id};
use crate::error::Result;
use crate::model::{TaskEvent, TaskId, TaskKey, TaskSnapshot};
use crate::push::StoredPushConfig;
use crate::store::codec;
use crate::store::{ListPage, ListQuery, PageToken, TurnId};

impl Inner {
    /// The decoded record of a row `(principal, agent, task, record)`.
    pub(super) fn decode_row(row: &Row) -> Option<(TaskKey, TaskSnapshot, TurnId)> {
        let key = TaskKey {
            principal: row.get::<_, &str>(0).into(),
            agent: row.get::<_, &str>(1).into(),
            task: TaskId::new(row.get::<_, &str>(2)),
        };
        let (task, turn) = codec::decode_task(&key, row.get::<_, &[u8]>(3))?;
        Some((key, task, turn))
    }

    pub(super) async fn task(&self, key: TaskKey) -> Result<Option<Arc<TaskSnapshot>>> {
        let client = self.client().await?;
        let sql = format!(
            "SELECT principal, agent, task, record FROM {}.tasks WHERE id = $1",
            self.schema
        );
        let stmt = bounded(client.prepare_cached(&sql)).await?;
        let row = bounded(client.query_opt(&stmt, &[&row_id(&key)])).await?;
        Ok(row
            .as_ref()
            .and_then(Self::decode_row)
            .filter(|(k, ..)| *k == key)
            .map(|(_, t, _)| Arc::new(t)))
    }

    /// A task's record and its events after `after` (at most `limit` of them, `None`: all),
    /// read in one snapshot.
    pub(super) async fn record_and_events(
        &self,
        key: &TaskKey,
        after: u64,
        limit: Option<usize>,
    ) -> Result<Option<(TaskSnapshot, TurnId, Vec<TaskEvent>)>> {
        let client = self.client().await?;
        let s = &self.schema;
        let sql = format!(
            "SELECT t.principal, t.agent, t.task, t.record,
               ARRAY(SELECT seq FROM {s}.events e WHERE e.task = t.id AND e.seq > $2 ORDER BY seq LIMIT $3),
               ARRAY(SELECT body FROM {s}.events e WHERE e.task = t.id AND e.seq > $2 ORDER BY seq LIMIT $3)
             FROM {s}.tasks t WHERE t.id = $1"
        );
        let stmt = bounded(client.prepare_cached(&sql)).await?;
        let after = i64::try_from(after).unwrap_or(i64::MAX);
        let limit = limit.map(|n| i64::try_from(n).unwrap_or(i64::MAX));
        let Some(row) = bounded(client.query_opt(&stmt, &[&row_id(key), &after, &limit])).await?
        else {
            return Ok(None);
        };
        let Some((k, task, turn)) = Self::decode_row(&row) else {
            return Err(db("a task record does not decode"));
        };
        if k != *key {
            return Ok(None);
        }
        let events = Self::decode_events(&row, 4, &task);
        Ok(Some((task, turn, events)))
    }

    /// The events of a row's two arrays at `at` and `at + 1` (numbers, bodies), decoded
    /// against their task's history.
    pub(super) fn decode_events(row: &Row, at: usize, task: &TaskSnapshot) -> Vec<TaskEvent> {
        let seqs: Vec<i64> = row.get(at);
        let bodies: Vec<Vec<u8>> = row.get(at + 1);
        seqs.into_iter()
            .zip(bodies)
            .filter_map(|(seq, body)| {
                codec::decode_event(u64::try_from(seq).ok()?, &body, &task.history)
            })
            .collect()
    }

    pub(super) async fn list(&self, q: ListQuery) -> Result<ListPage> {
        let client = self.client().await?;
        let s = &self.schema;
        let filter = "principal = $1 AND agent = $2 AND ($3::text IS NULL OR context = $3)
             AND ($4::text IS NULL OR state = $4) AND ($5::bigint IS NULL OR status_us >= $5)";
        let page_sql = format!(
            "SELECT principal, agent, task, record FROM {s}.tasks WHERE {filter}
               AND ($6::bigint IS NULL OR (status_us, task) < ($6, $7::text))
             ORDER BY status_us DESC, task DESC LIMIT $8"
        );
        let count_sql = format!("SELECT count(*) FROM {s}.tasks WHERE {filter}");
        let (page_stmt, count_stmt) = futures_util::try_join!(
            bounded(client.prepare_cached(&page_sql)),
            bounded(client.prepare_cached(&count_sql))
        )?;
        let context = q.context.as_ref().map(|c| c.as_str().to_string());
        let state = q.state.map(|st| st.as_str().to_string());
        let after = q.status_after.map(|t| t.timestamp_micros());
        let (token_at, token_task) = match &q.after {
            Some(t) => (Some(t.timestamp_micros), Some(t.task.as_str().to_string())),
            None => (None, None),
        };
        let size = q.page_size.max(1);
        let limit = i64::try_from(size).unwrap_or(i64::MAX).saturating_add(1);
        let principal = q.principal.as_str();
        let agent = q.agent.as_str();
        let page_params: [&(dyn tokio_postgres::types::ToSql + Sync); 8] = [
            &principal,
            &agent,
            &context,
            &state,
            &after,
            &token_at,
            &token_task,
            &limit,
        ];
        let count_params: [&(dyn tokio_postgres::types::ToSql + Sync); 5] =
            [&principal, &agent, &context, &state, &after];
        let (rows, count) = futures_util::try_join!(
            bounded(client.query(&page_stmt, &page_params)),
            bounded(client.query_one(&count_stmt, &count_params))
        )?;
        let mut page = ListPage {
            total: usize::try_from(count.get::<_, i64>(0)).unwrap_or(0),
            ..ListPage::default()
        };
        for row in &rows {
            let Some((_, task, _)) = Self::decode_row(row) else {
                continue;
            };
            if page.tasks.len() < size {
                page.tasks.push(Arc::new(task));
            } else {
                page.next = page.tasks.last().map(|t| PageToken::of(t));
            }
        }
        Ok(page)
    }

    pub(super) async fn push_query(
        &self,
        sql: String,
        params: PushParams,
    ) -> Result<Vec<Arc<StoredPushConfig>>> {
        let client = self.client().await?;
        let stmt = bounded(client.prepare_cached(&sql)).await?;
        let rows = match params {
            PushParams::OwnerTask(o, t) => bounded(client.query(&stmt, &[&o, &t])).await?,
            PushParams::OwnerId(o, id) => bounded(client.query(&stmt, &[&o, &id])).await?,
        };
        Ok(rows
            .iter()
            .filter_map(|r| codec::decode_push(r.get::<_, &[u8]>(0), &self.sealer))
            .map(|c| self.config(c))
            .collect())
    }
}

pub(super) enum PushParams {
    OwnerTask(Uuid, Option<String>),
    OwnerId(Uuid, String),
}
