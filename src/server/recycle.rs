//! A request's future, in a box that the next request on the same worker thread reuses.
//!
//! A request's future is several kilobytes. Allocated and freed per request, blocks that
//! size cycle mimalloc's pages between empty and in use, and the allocator returns each
//! emptied page to the system at once (docs/decisions/the-allocator.md), so the next
//! request faults the page back in. Kept here, a box is written over instead: no
//! allocation, no free, no page fault (docs/decisions/a-request-future-in-a-recycled-box.md).

use std::any::{Any, TypeId};
use std::cell::RefCell;
use std::pin::Pin;
use std::task::{Context, Poll};

/// The spare boxes a worker thread keeps of one kind; past this, a finished request's box
/// is freed. At 32 connections on one worker about 32 are in use at once.
const SPARES: usize = 64;

/// A box for one kind of future; `None` between requests.
type Slot<F> = Pin<Box<Option<F>>>;

thread_local! {
    /// Each kind's spare slots (a `Vec<Slot<F>>`), by the future's type.
    static SPARE: RefCell<Vec<(TypeId, Box<dyn Any>)>> = const { RefCell::new(Vec::new()) };
}

/// The future `make` makes, made in a spare slot of this thread's if it has one.
///
/// Made there, not passed in: a future passed by value is copied whole (its size, not
/// what its first state holds) into the argument and again into the slot, two copies of
/// ~3.4 KB a request into memory the cache no longer holds.
pub(super) fn boxed<F: Future + 'static>(make: impl FnOnce() -> F) -> Recycled<F> {
    let mut slot = take::<F>().unwrap_or_else(|| Box::pin(None));
    slot.set(Some(make()));
    Recycled { slot: Some(slot) }
}

/// A future in a recycled box. Once it finishes or is dropped, its state is dropped and
/// the box goes to the spares of the thread it is on.
pub(super) struct Recycled<F: Future + 'static> {
    slot: Option<Slot<F>>,
}

impl<F: Future + 'static> Future for Recycled<F> {
    type Output = F::Output;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let Some(future) = self.slot.as_mut().and_then(|s| s.as_mut().as_pin_mut()) else {
            // Only a caller that polls a finished future gets here.
            return Poll::Pending;
        };
        let output = std::task::ready!(future.poll(cx));
        if let Some(slot) = self.slot.take() {
            give_back(slot);
        }
        Poll::Ready(output)
    }
}

impl<F: Future + 'static> Drop for Recycled<F> {
    fn drop(&mut self) {
        if let Some(slot) = self.slot.take() {
            give_back(slot);
        }
    }
}

fn take<F: Future + 'static>() -> Option<Slot<F>> {
    with_spares::<F, _>(Vec::pop).flatten()
}

/// Drops what the slot holds, here, and keeps the box if this thread has room for it.
fn give_back<F: Future + 'static>(mut slot: Slot<F>) {
    slot.set(None);
    with_spares::<F, _>(|spares| {
        if spares.len() < SPARES {
            spares.push(slot);
        }
    });
}

/// `f` on this thread's spares of `F`'s kind; `None` on a thread that is ending, or while
/// the spares are borrowed (a box given back then is freed).
fn with_spares<F: Future + 'static, R>(f: impl FnOnce(&mut Vec<Slot<F>>) -> R) -> Option<R> {
    SPARE
        .try_with(|spare| {
            let mut spare = spare.try_borrow_mut().ok()?;
            let kind = TypeId::of::<F>();
            let at = match spare.iter().position(|(k, _)| *k == kind) {
                Some(at) => at,
                None => {
                    spare.push((kind, Box::new(Vec::<Slot<F>>::with_capacity(SPARES))));
                    spare.len() - 1
                }
            };
            spare[at].1.downcast_mut::<Vec<Slot<F>>>().map(f)
        })
        .ok()
        .flatten()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// Counts its drops, to show when a request's state goes.
    struct Tracked(Arc<AtomicUsize>);
    impl Drop for Tracked {
        fn drop(&mut self) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    fn run<F: Future>(f: F) -> F::Output {
        tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("a runtime")
            .block_on(f)
    }

    /// A request that holds a `Tracked` across one wait.
    async fn request(n: u32, dropped: Arc<AtomicUsize>) -> u32 {
        let held = Tracked(dropped);
        tokio::task::yield_now().await;
        drop(held);
        n
    }

    fn address<F: Future + 'static>(r: &Recycled<F>) -> usize {
        let slot = r.slot.as_ref().expect("a slot");
        &**slot as *const Option<F> as usize
    }

    /// How many spare boxes of `F`'s kind this thread holds (taking them).
    fn spares<F: Future + 'static>(_: &F) -> usize {
        std::iter::from_fn(take::<F>).count()
    }

    #[test]
    fn a_finished_requests_box_serves_the_next_request() {
        let dropped = Arc::new(AtomicUsize::new(0));
        let first = boxed(|| request(1, dropped.clone()));
        let first_box = address(&first);
        assert_eq!(run(first), 1);
        assert_eq!(dropped.load(Ordering::SeqCst), 1);
        let second = boxed(|| request(2, dropped.clone()));
        assert_eq!(
            address(&second),
            first_box,
            "the second request reuses the box"
        );
        assert_eq!(run(second), 2);
        assert_eq!(dropped.load(Ordering::SeqCst), 2);
    }

    #[test]
    fn a_dropped_requests_state_is_dropped_and_its_box_kept() {
        let dropped = Arc::new(AtomicUsize::new(0));
        let mut pending = boxed(|| request(3, dropped.clone()));
        let its_box = address(&pending);
        let mut cx = Context::from_waker(std::task::Waker::noop());
        assert!(Pin::new(&mut pending).poll(&mut cx).is_pending());
        assert_eq!(dropped.load(Ordering::SeqCst), 0, "held across the wait");
        drop(pending);
        assert_eq!(
            dropped.load(Ordering::SeqCst),
            1,
            "dropped with the request"
        );
        let next = boxed(|| request(4, dropped.clone()));
        assert_eq!(address(&next), its_box);
        assert_eq!(run(next), 4);
    }

    #[test]
    fn a_thread_keeps_a_bounded_number_of_spares() {
        let dropped = Arc::new(AtomicUsize::new(0));
        let many: Vec<_> = (0..SPARES as u32 + 10)
            .map(|n| boxed(|| request(n, dropped.clone())))
            .collect();
        drop(many);
        assert_eq!(dropped.load(Ordering::SeqCst), 0, "none was polled");
        assert_eq!(spares(&request(0, dropped.clone())), SPARES);
        // Another kind of future has spares of its own.
        let other = async { 5u8 };
        assert_eq!(spares(&other), 0);
        assert_eq!(run(boxed(|| other)), 5);
    }
}
