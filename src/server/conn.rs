//! One connection's guard rails: its I/O is wrapped to record activity, and a watchdog
//! closes it when it goes silent, stalls its writes, or the server needs the slot.
//!
//! hyper bounds the time to read a request head (`header_read_timeout`), but nothing
//! bounds a connection that never sends its first byte (choosing HTTP/1 or HTTP/2 from its first bytes
//! waits forever), an idle keep-alive connection, or a client that stops reading its
//! response. The watchdog bounds all three; it never touches a connection while one of its
//! requests is being answered, except for a write that makes no progress.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::Notify;
use tokio::time::Instant;

/// The time limits the watchdog enforces.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Timeouts {
    /// A new connection must send its first byte within this.
    pub(crate) first_byte: Duration,
    /// A connection with no request in flight may stay silent this long.
    pub(crate) idle: Duration,
    /// A response write may make no progress this long.
    pub(crate) write: Duration,
}

/// How long an idle connection may stay when the server is short of connection slots.
const UNDER_PRESSURE: Duration = Duration::from_secs(1);

/// Whether the server is short of connection slots; shared by every watchdog.
#[derive(Default)]
pub(crate) struct Pressure {
    on: AtomicBool,
    /// Wakes every sleeping watchdog when pressure turns on, so idle connections give
    /// their slots back at once instead of at their next scheduled check.
    turned_on: Notify,
}

impl Pressure {
    /// Sets the state; turning it on wakes the watchdogs.
    pub(crate) fn set(&self, on: bool) {
        if self.on.swap(on, Relaxed) != on && on {
            self.turned_on.notify_waiters();
        }
    }

    fn is_on(&self) -> bool {
        self.on.load(Relaxed)
    }
}

/// What happened on one connection, updated by its I/O and its requests.
pub(crate) struct Activity {
    started: Instant,
    /// Milliseconds since `started` of the last byte read or written.
    last_io: AtomicU64,
    /// Whether any byte was read yet.
    first_byte: AtomicBool,
    /// Requests whose response is not finished (a guard in each response body).
    in_flight: AtomicUsize,
    /// Milliseconds since `started` + 1 when a write first found the socket full, 0 when
    /// writes are flowing.
    write_blocked: AtomicU64,
}

impl Activity {
    pub(crate) fn new() -> Arc<Self> {
        Arc::new(Self {
            started: Instant::now(),
            last_io: AtomicU64::new(0),
            first_byte: AtomicBool::new(false),
            in_flight: AtomicUsize::new(0),
            write_blocked: AtomicU64::new(0),
        })
    }

    fn now_ms(&self) -> u64 {
        u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    /// Bytes arrived (read, or peeked to choose the protocol).
    pub(crate) fn read(&self) {
        self.last_io.store(self.now_ms(), Relaxed);
        self.first_byte.store(true, Relaxed);
    }

    fn wrote(&self) {
        self.last_io.store(self.now_ms(), Relaxed);
        self.write_blocked.store(0, Relaxed);
    }

    fn write_pending(&self) {
        let now = self.now_ms().saturating_add(1);
        let _ = self
            .write_blocked
            .compare_exchange(0, now, Relaxed, Relaxed);
    }
}

/// Counts one request from its start until its response body is dropped (written out,
/// or abandoned with the connection).
pub(crate) struct InFlight(Arc<Activity>);

impl InFlight {
    pub(crate) fn new(activity: &Arc<Activity>) -> Self {
        activity.in_flight.fetch_add(1, Relaxed);
        Self(activity.clone())
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Relaxed);
    }
}

/// A response body that keeps its request counted in flight until it is written out or
/// dropped (the connection is busy until then).
pub(crate) struct Guarded {
    body: crate::http::Body,
    _in_flight: InFlight,
}

impl Guarded {
    pub(crate) fn new(body: crate::http::Body, in_flight: InFlight) -> Self {
        Self {
            body,
            _in_flight: in_flight,
        }
    }
}

impl http_body::Body for Guarded {
    type Data = bytes::Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        std::pin::Pin::new(&mut self.get_mut().body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}

/// Why the watchdog closed a connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Closed {
    /// No first byte within `first_byte`.
    FirstByte,
    /// Silent with nothing in flight for `idle`.
    Idle,
    /// A write made no progress for `write`.
    WriteStalled,
}

impl Closed {
    /// The label of the connection metric.
    pub(crate) fn label(self) -> &'static str {
        match self {
            Self::FirstByte => "first_byte_timeout",
            Self::Idle => "idle_timeout",
            Self::WriteStalled => "write_stalled",
        }
    }
}

/// Resolves when the connection should be closed.
pub(crate) async fn watchdog(activity: &Activity, limits: Timeouts, pressure: &Pressure) -> Closed {
    loop {
        let now = activity.now_ms();
        let mut next = limits.write.max(Duration::from_millis(10));
        let blocked = activity.write_blocked.load(Relaxed);
        if blocked != 0 {
            let stalled = Duration::from_millis(now.saturating_sub(blocked - 1));
            if stalled >= limits.write {
                return Closed::WriteStalled;
            }
            next = next.min(limits.write - stalled);
        }
        if activity.in_flight.load(Relaxed) == 0 {
            let (mut limit, why) = if activity.first_byte.load(Relaxed) {
                (limits.idle, Closed::Idle)
            } else {
                (limits.first_byte, Closed::FirstByte)
            };
            if pressure.is_on() {
                limit = limit.min(UNDER_PRESSURE);
            }
            let silent = Duration::from_millis(now.saturating_sub(activity.last_io.load(Relaxed)));
            if silent >= limit {
                return why;
            }
            next = next.min(limit - silent);
        }
        tokio::select! {
            () = tokio::time::sleep(next + Duration::from_millis(1)) => {}
            () = pressure.turned_on.notified() => {}
        }
    }
}

/// An I/O object that reports its reads and writes to an [`Activity`].
pub(crate) struct Tracked<T> {
    inner: T,
    activity: Arc<Activity>,
    vectored: bool,
}

impl<T> Tracked<T> {
    /// `vectored: false` hides the socket's vectored writes from the protocol above. HTTP/2
    /// (h2) then copies a DATA frame of up to 1 KiB into its write buffer instead of
    /// chaining it, and can put the frames after it in the same write: a unary gRPC
    /// response's headers, message and trailers leave in one `write` instead of two
    /// `writev`s (h2 chains frames over 256 bytes on vectored I/O and buffers nothing
    /// behind a chained frame until it is written). The price: a DATA frame over 1 KiB
    /// leaves in two `write`s (h2's buffer, then the frame's bytes) instead of one
    /// `writev` — rarer than a call's small response on this server's HTTP/2 traffic.
    pub(crate) fn new(inner: T, activity: Arc<Activity>, vectored: bool) -> Self {
        Self {
            inner,
            activity,
            vectored,
        }
    }

    fn after_write(&self, r: &Poll<io::Result<usize>>) {
        match r {
            Poll::Ready(Ok(n)) if *n > 0 => self.activity.wrote(),
            Poll::Pending => self.activity.write_pending(),
            _ => {}
        }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Tracked<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let r = Pin::new(&mut this.inner).poll_read(cx, buf);
        if matches!(r, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            this.activity.read();
        }
        r
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Tracked<T> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let r = Pin::new(&mut this.inner).poll_write(cx, buf);
        this.after_write(&r);
        r
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let r = Pin::new(&mut this.inner).poll_write_vectored(cx, bufs);
        this.after_write(&r);
        r
    }

    fn is_write_vectored(&self) -> bool {
        self.vectored && self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let r = Pin::new(&mut this.inner).poll_flush(cx);
        if r.is_pending() {
            this.activity.write_pending();
        }
        r
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits() -> Timeouts {
        Timeouts {
            first_byte: Duration::from_millis(100),
            idle: Duration::from_millis(300),
            write: Duration::from_millis(200),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_silent_connection_is_closed_after_the_first_byte_timeout() {
        let a = Activity::new();
        let t0 = Instant::now();
        let why = watchdog(&a, limits(), &Pressure::default()).await;
        assert_eq!(why, Closed::FirstByte);
        assert!(t0.elapsed() >= Duration::from_millis(100));
    }

    #[tokio::test(start_paused = true)]
    async fn an_idle_connection_is_closed_after_the_idle_timeout_but_not_while_busy() {
        let a = Activity::new();
        a.read();
        let guard = InFlight::new(&a);
        let busy = tokio::time::timeout(
            Duration::from_secs(5),
            watchdog(&a, limits(), &Pressure::default()),
        )
        .await;
        assert!(busy.is_err(), "a request in flight keeps the connection");
        drop(guard);
        let t0 = Instant::now();
        assert_eq!(
            watchdog(&a, limits(), &Pressure::default()).await,
            Closed::Idle
        );
        assert!(t0.elapsed() <= Duration::from_millis(400));
    }

    #[tokio::test(start_paused = true)]
    async fn a_stalled_write_closes_even_a_busy_connection() {
        let a = Activity::new();
        a.read();
        let _guard = InFlight::new(&a);
        a.write_pending();
        assert_eq!(
            watchdog(&a, limits(), &Pressure::default()).await,
            Closed::WriteStalled
        );
    }

    #[tokio::test(start_paused = true)]
    async fn pressure_shortens_the_idle_time_and_wakes_sleeping_watchdogs() {
        let a = Activity::new();
        a.read();
        // Both limits far away: only the pressure notification can wake the watchdog.
        let long = Timeouts {
            idle: Duration::from_secs(3600),
            write: Duration::from_secs(3600),
            ..limits()
        };
        let pressure = Pressure::default();
        let t0 = Instant::now();
        let (why, ()) = tokio::join!(watchdog(&a, long, &pressure), async {
            tokio::time::sleep(Duration::from_secs(10)).await;
            pressure.set(true);
        });
        assert_eq!(why, Closed::Idle);
        assert!(t0.elapsed() < Duration::from_secs(12), "{:?}", t0.elapsed());
    }
}
