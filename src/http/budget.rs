//! Bounds on the request body bytes held at once (docs/RELIABILITY.md): every body is read
//! against a budget for all requests (`server.max_buffered_body_bytes`) and, on an HTTP/2
//! connection, one for that connection's streams
//! (`server.max_buffered_body_bytes_per_connection`). Each piece of a body takes its bytes
//! from both as it arrives, and gives them back when the request is done with its body. A
//! read that finds a budget spent waits (within `server.body_read_timeout_seconds`) and
//! reads nothing meanwhile, so HTTP/2 flow control stops the sender: what the server holds
//! stays within the budgets plus the connection's window. Bodies are read only once their
//! request is authenticated and admitted (every binding), so a client without a key holds
//! none of this.

use std::sync::Arc;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// One budget of bytes.
#[derive(Clone)]
pub(crate) struct BodyBudget(Arc<Semaphore>, usize);

impl BodyBudget {
    /// A budget of `bytes`.
    pub(crate) fn new(bytes: u64) -> Self {
        let bytes = usize::try_from(bytes)
            .unwrap_or(usize::MAX)
            .min(Semaphore::MAX_PERMITS);
        Self(Arc::new(Semaphore::new(bytes)), bytes)
    }

    /// Bytes not taken now.
    pub(crate) fn available(&self) -> usize {
        self.0.available_permits()
    }

    /// Bytes taken now (`a2ad_request_body_bytes_held`).
    pub(crate) fn held(&self) -> usize {
        self.1.saturating_sub(self.available())
    }

    /// Takes `n` bytes, waiting until they are there.
    async fn take(&self, n: usize) -> Option<OwnedSemaphorePermit> {
        let n = u32::try_from(n).ok()?;
        if let Ok(p) = self.0.clone().try_acquire_many_owned(n) {
            return Some(p);
        }
        self.0.clone().acquire_many_owned(n).await.ok()
    }
}

/// The bytes a body holds of its budgets, given back when dropped.
#[derive(Default)]
pub(crate) struct Held {
    all: Option<OwnedSemaphorePermit>,
    connection: Option<OwnedSemaphorePermit>,
}

impl Held {
    /// Takes `n` more bytes from `all` and, if there is one, the connection's budget.
    /// `None` when a piece is too large to be counted (over 4 GiB: never, below the cap).
    pub(crate) async fn take(
        &mut self,
        n: usize,
        all: &BodyBudget,
        connection: Option<&BodyBudget>,
    ) -> Option<()> {
        if n == 0 {
            return Some(());
        }
        // The connection's first: a connection at its own bound waits without holding
        // any of the bytes every connection shares.
        if let Some(c) = connection {
            merge(&mut self.connection, c.take(n).await?);
        }
        merge(&mut self.all, all.take(n).await?);
        Some(())
    }
}

fn merge(into: &mut Option<OwnedSemaphorePermit>, more: OwnedSemaphorePermit) {
    match into {
        Some(p) => p.merge(more),
        None => *into = Some(more),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn bytes_are_given_back_when_the_body_is_done_and_a_spent_budget_waits() {
        let all = BodyBudget::new(100);
        let conn = BodyBudget::new(60);
        let mut first = Held::default();
        first.take(40, &all, Some(&conn)).await.expect("taken");
        first.take(20, &all, Some(&conn)).await.expect("taken");
        assert_eq!((all.available(), conn.available()), (40, 0));
        // The connection's budget is spent: the next piece waits…
        let mut second = Held::default();
        let waiting = second.take(10, &all, Some(&conn));
        tokio::pin!(waiting);
        assert!(
            futures_util::FutureExt::now_or_never(waiting.as_mut()).is_none(),
            "waits while the connection's bytes are held"
        );
        // …until the first body is done.
        drop(first);
        waiting.await.expect("taken once given back");
        assert_eq!((all.available(), conn.available()), (90, 50));
        // Without a connection budget (HTTP/1: one body at a time) only `all` counts.
        let mut third = Held::default();
        third.take(90, &all, None).await.expect("taken");
        assert_eq!(all.available(), 0);
    }
}
