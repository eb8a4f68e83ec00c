//! Futures made in their box.
//!
//! `Box::pin(f())` makes `f`'s future on the stack and then copies it into the box: the
//! whole of its type's size (what its largest state needs), not just what its first
//! state holds, into memory the cache often no longer holds. With the box allocated
//! first, the compiler can write the future where it stays, and on the request path it
//! does (docs/decisions/what-the-caches-say.md: the copies are gone from `memcpy`'s
//! calls). Nothing depends on it but speed.

use std::pin::Pin;

/// The value `make` makes, in a box allocated before it is made.
pub(crate) fn made_in_place<T>(make: impl FnOnce() -> T) -> Pin<Box<T>> {
    Box::into_pin(Box::write(Box::new_uninit(), make()))
}
