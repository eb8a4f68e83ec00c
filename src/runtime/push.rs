//! Push configurations: stored, listed and removed through the store, owner-scoped.

use std::sync::Arc;

use super::{Runtime, task_key};
use crate::error::Result;
use crate::model::{AgentId, Principal, TaskId};
use crate::push::{PushScope, StoredPushConfig};
use crate::store::Write;

impl Runtime {
    /// Stores a push configuration (scoped: replaces its scope's; named: replaces the
    /// same task and id) and answers once it is durable. A task-scoped configuration needs
    /// the caller's task.
    ///
    /// # Errors
    /// [`crate::Error::TaskNotFound`] when the task is not this caller's; over the per-task cap,
    /// [`crate::Error::InvalidParams`].
    pub async fn set_push(&self, config: Arc<StoredPushConfig>) -> Result<()> {
        if let Some(task) = &config.scope.task {
            // Scoping to a task requires that this caller owns it.
            self.get(&config.scope.principal, &config.scope.agent, task)
                .await?;
        }
        let max = self.shared.in_force.now().webhooks.max_configs_per_task;
        self.shared.store.push_check(&config, max).await?;
        self.shared.store.push_reserve(&config, max)?;
        self.durable(vec![Write::PushSet(config)]).await
    }

    /// The named configurations of a task of this caller.
    ///
    /// # Errors
    /// [`crate::Error::TaskNotFound`] when the task is not this caller's.
    pub async fn task_push_configs(
        &self,
        principal: &Principal,
        agent: &AgentId,
        task: &TaskId,
    ) -> Result<Vec<Arc<StoredPushConfig>>> {
        self.get(principal, agent, task).await?;
        self.shared
            .store
            .push_named(&task_key(principal, agent, task))
            .await
    }

    /// Removes a named configuration of a task of this caller (idempotent); answers once
    /// the removal is durable.
    ///
    /// # Errors
    /// [`crate::Error::TaskNotFound`] when the task is not this caller's.
    pub async fn delete_push(
        &self,
        principal: &Principal,
        agent: &AgentId,
        task: &TaskId,
        id: &str,
    ) -> Result<()> {
        self.get(principal, agent, task).await?;
        self.durable(vec![Write::PushRemoveNamed {
            task: task_key(principal, agent, task),
            id: id.to_string(),
        }])
        .await
    }

    /// The scoped configuration of a scope.
    ///
    /// # Errors
    /// [`crate::Error::Internal`] when the store cannot be read.
    pub(crate) async fn scoped_push(
        &self,
        scope: &PushScope,
    ) -> Result<Option<Arc<StoredPushConfig>>> {
        self.shared.store.push_scope(scope).await
    }

    /// A scoped configuration of this principal and agent by id.
    ///
    /// # Errors
    /// [`crate::Error::Internal`] when the store cannot be read.
    pub(crate) async fn push_by_id(
        &self,
        principal: &Principal,
        agent: &AgentId,
        id: &str,
    ) -> Result<Option<Arc<StoredPushConfig>>> {
        self.shared.store.push_by_id(principal, agent, id).await
    }
}
