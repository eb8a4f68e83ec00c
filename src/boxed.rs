//! Futures made in their box.
//!
//! `Box::pin(f())` makes `f`'s future on the stack and then copies it into the box: the
//! whole of its type's size (what its largest state needs), not just what its first
//! state holds, into memory the cache often no longer holds. Made in a box allocated
//! first, the compiler writes the future where it stays.

use std::pin::Pin;

/// The value `make` makes, in a box allocated before it is made.
pub(crate) fn made_in_place<T>(make: impl FnOnce() -> T) -> Pin<Box<T>> {
    Box::into_pin(Box::write(Box::new_uninit(), make()))
}
