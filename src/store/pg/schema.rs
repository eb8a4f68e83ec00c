//! The schema: its tables, and the migration that creates or checks them.

use std::time::Duration;

use super::{SCHEMA_VERSION, open_error};
use crate::config::ClusterConfig;
use crate::error::Result;

pub(super) fn schema_sql(s: &str) -> String {
    format!(
        r#"
CREATE TABLE IF NOT EXISTS {s}.nodes (
  node text PRIMARY KEY, incarnation uuid NOT NULL, heartbeat_at timestamptz NOT NULL,
  started_at timestamptz NOT NULL);
CREATE TABLE IF NOT EXISTS {s}.tasks (
  id uuid PRIMARY KEY, principal text NOT NULL, agent text NOT NULL,
  task text COLLATE "C" NOT NULL, context text NOT NULL, state text NOT NULL,
  terminal boolean NOT NULL, seq bigint NOT NULL, fence bigint NOT NULL, runner uuid,
  runner_node text, status_us bigint NOT NULL, finished_at timestamptz, record bytea NOT NULL);
CREATE INDEX IF NOT EXISTS tasks_owner ON {s}.tasks (principal, agent, status_us DESC, task DESC);
CREATE INDEX IF NOT EXISTS tasks_running ON {s}.tasks (runner) WHERE NOT terminal;
CREATE INDEX IF NOT EXISTS tasks_finished ON {s}.tasks (finished_at) WHERE terminal;
CREATE TABLE IF NOT EXISTS {s}.events (
  task uuid NOT NULL, seq bigint NOT NULL, body bytea NOT NULL, PRIMARY KEY (task, seq));
CREATE TABLE IF NOT EXISTS {s}.push (
  owner uuid NOT NULL, task text, named boolean NOT NULL, id text NOT NULL,
  created_us bigint NOT NULL, body bytea NOT NULL);
CREATE INDEX IF NOT EXISTS push_owner ON {s}.push (owner, task);
CREATE UNIQUE INDEX IF NOT EXISTS push_named ON {s}.push (owner, task, id) WHERE named;
CREATE TABLE IF NOT EXISTS {s}.outbox (
  delivery uuid PRIMARY KEY, task uuid NOT NULL, seq bigint NOT NULL, config text NOT NULL,
  attempt int NOT NULL, due_us bigint, claimed_by uuid, claimed_node text);
CREATE INDEX IF NOT EXISTS outbox_lane ON {s}.outbox (task, config, seq);
CREATE INDEX IF NOT EXISTS outbox_claim ON {s}.outbox (claimed_by);
CREATE UNLOGGED TABLE IF NOT EXISTS {s}.usage (
  incarnation uuid NOT NULL, key text NOT NULL, n bigint NOT NULL, PRIMARY KEY (incarnation, key));
CREATE TABLE IF NOT EXISTS {s}.turns (
  principal text NOT NULL, context text NOT NULL, since bigint NOT NULL, number int NOT NULL,
  at timestamptz NOT NULL DEFAULT now(), body bytea NOT NULL,
  PRIMARY KEY (principal, context, since, number));
"#
    )
}

/// Creates or checks the schema, under an advisory lock so nodes starting together take
/// turns. Refuses a schema written by a newer a2ad.
pub(super) async fn migrate(client: &tokio_postgres::Client, cfg: &ClusterConfig) -> Result<()> {
    let s = &cfg.schema;
    let lock = format!("a2ad schema {s}");
    let run = async {
        client
            .execute("SELECT pg_advisory_lock(hashtext($1))", &[&lock])
            .await?;
        let result = async {
            client
                .batch_execute(&format!(
                    "CREATE SCHEMA IF NOT EXISTS {s};
                     CREATE TABLE IF NOT EXISTS {s}.meta (id int PRIMARY KEY, version int NOT NULL);"
                ))
                .await?;
            let found: Option<i32> = client
                .query_opt(&format!("SELECT version FROM {s}.meta WHERE id = 1"), &[])
                .await?
                .map(|r| r.get(0));
            Ok::<_, tokio_postgres::Error>(found)
        }
        .await;
        let found = match result {
            Ok(f) => f,
            Err(e) => {
                let _ = client
                    .execute("SELECT pg_advisory_unlock(hashtext($1))", &[&lock])
                    .await;
                return Err(e);
            }
        };
        let outcome = match found {
            Some(v) if v > SCHEMA_VERSION => Ok(Some(v)),
            _ => {
                let r = client
                    .batch_execute(&format!(
                        "{}\nINSERT INTO {s}.meta (id, version) VALUES (1, {SCHEMA_VERSION})
                         ON CONFLICT (id) DO UPDATE SET version = EXCLUDED.version;",
                        schema_sql(s)
                    ))
                    .await;
                r.map(|()| None)
            }
        };
        let _ = client
            .execute("SELECT pg_advisory_unlock(hashtext($1))", &[&lock])
            .await;
        outcome
    };
    match tokio::time::timeout(Duration::from_secs(60), run).await {
        Ok(Ok(None)) => Ok(()),
        Ok(Ok(Some(v))) => Err(open_error(
            cfg,
            format!(
                "schema {s} is version {v}, written by a newer a2ad (this one writes {SCHEMA_VERSION}); upgrade this node"
            ),
        )),
        Ok(Err(e)) => Err(open_error(cfg, format!("cannot create schema {s}: {e}"))),
        Err(_) => Err(open_error(cfg, "creating the schema timed out")),
    }
}
