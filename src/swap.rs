//! A value swapped whole while readers go on: each reader takes the value in force (an
//! `Arc`, kept for as long as it needs it) and a writer puts a new one in force for the
//! readers that come after. What a configuration reload changes lives in one: the agents,
//! the configuration in force, the callers and their rate buckets.

use std::sync::{Arc, PoisonError, RwLock};

/// A value read as a whole and replaced as a whole.
pub(crate) struct Swap<T>(RwLock<Arc<T>>);

impl<T> Swap<T> {
    pub(crate) fn new(value: T) -> Self {
        Self::from_arc(Arc::new(value))
    }

    pub(crate) fn from_arc(value: Arc<T>) -> Self {
        Self(RwLock::new(value))
    }

    /// The value in force now.
    pub(crate) fn now(&self) -> Arc<T> {
        self.0
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Puts `value` in force for the readers from now on.
    pub(crate) fn set(&self, value: T) {
        *self.0.write().unwrap_or_else(PoisonError::into_inner) = Arc::new(value);
    }
}
