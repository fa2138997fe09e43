//! Admission control: bounded concurrency with a bounded, short queue; beyond both, a fast 503
//! with `Retry-After` rather than latency that grows without bound (Little's law: with a fixed
//! service rate, an unbounded queue only converts overload into waiting).
//!
//! At most `in_flight_max` requests run at once. A request that finds no free slot waits for
//! one only if fewer than `queue_max` others are already waiting, and at most `queue_wait_ms`;
//! otherwise it is answered 503 at once.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::sync::Semaphore;

/// Admission limits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AdmissionConfig {
    /// Requests handled at once.
    pub in_flight_max: usize,
    /// Requests allowed to wait for a slot.
    pub queue_max: usize,
    /// Longest wait for a slot.
    pub queue_wait_ms: u64,
    /// `Retry-After` of a refusal, in seconds.
    pub retry_after_s: u64,
}

impl Default for AdmissionConfig {
    fn default() -> Self {
        Self {
            in_flight_max: 512,
            queue_max: 1024,
            queue_wait_ms: 100,
            retry_after_s: 1,
        }
    }
}

/// The admission gate.
#[derive(Debug)]
pub struct Admission {
    cfg: AdmissionConfig,
    slots: Arc<Semaphore>,
    queued: AtomicUsize,
}

/// A held slot (released on drop).
#[derive(Debug)]
pub struct Slot {
    _permit: tokio::sync::OwnedSemaphorePermit,
}

/// Why a request was not admitted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refused {
    /// The queue was full.
    QueueFull,
    /// The wait for a slot timed out.
    Timeout,
}

impl Admission {
    /// A gate with these limits (`in_flight_max` at least 1).
    #[must_use]
    pub fn new(cfg: AdmissionConfig) -> Self {
        let cfg = AdmissionConfig {
            in_flight_max: cfg.in_flight_max.max(1),
            ..cfg
        };
        Self {
            slots: Arc::new(Semaphore::new(cfg.in_flight_max)),
            queued: AtomicUsize::new(0),
            cfg,
        }
    }

    /// The limits.
    #[must_use]
    pub fn config(&self) -> AdmissionConfig {
        self.cfg
    }

    /// Requests running now.
    #[must_use]
    pub fn in_flight(&self) -> usize {
        self.cfg.in_flight_max - self.slots.available_permits()
    }

    /// Requests waiting now.
    #[must_use]
    pub fn queued(&self) -> usize {
        self.queued.load(Ordering::Relaxed)
    }

    /// Takes a slot; `Ok((slot, waited))`.
    pub async fn admit(&self) -> Result<(Slot, bool), Refused> {
        if let Ok(permit) = Arc::clone(&self.slots).try_acquire_owned() {
            return Ok((Slot { _permit: permit }, false));
        }
        if self.queued.fetch_add(1, Ordering::AcqRel) >= self.cfg.queue_max {
            self.queued.fetch_sub(1, Ordering::AcqRel);
            return Err(Refused::QueueFull);
        }
        // Counted out when the wait ends however it ends: a request whose client goes away
        // while it waits is dropped right here (the connection ends, the request's future with
        // it), and a count left behind would fill the queue for good.
        let in_queue = Queued(&self.queued);
        let waited = tokio::time::timeout(
            Duration::from_millis(self.cfg.queue_wait_ms),
            Arc::clone(&self.slots).acquire_owned(),
        )
        .await;
        drop(in_queue);
        match waited {
            Ok(Ok(permit)) => Ok((Slot { _permit: permit }, true)),
            // The semaphore is never closed; treat it as a timeout all the same.
            Ok(Err(_)) | Err(_) => Err(Refused::Timeout),
        }
    }
}

/// One request counted among those waiting for a slot, until dropped.
struct Queued<'a>(&'a AtomicUsize);

impl Drop for Queued<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn refuses_beyond_slots_and_queue_and_recovers() {
        let gate = Admission::new(AdmissionConfig {
            in_flight_max: 1,
            queue_max: 1,
            queue_wait_ms: 20,
            retry_after_s: 1,
        });
        let (held, waited) = gate.admit().await.unwrap();
        assert!(!waited);
        assert_eq!(gate.in_flight(), 1);
        // One may queue (and times out); a concurrent second finds the queue full.
        let (a, b) = tokio::join!(gate.admit(), async {
            tokio::time::sleep(Duration::from_millis(5)).await;
            gate.admit().await
        });
        assert_eq!(a.unwrap_err(), Refused::Timeout);
        assert_eq!(b.unwrap_err(), Refused::QueueFull);
        drop(held);
        assert!(gate.admit().await.is_ok());
        assert_eq!(gate.queued(), 0);
    }

    #[tokio::test]
    async fn a_request_dropped_while_it_waits_leaves_the_queue() {
        let gate = Admission::new(AdmissionConfig {
            in_flight_max: 1,
            queue_max: 1,
            queue_wait_ms: 60_000,
            retry_after_s: 1,
        });
        let (held, _) = gate.admit().await.unwrap();
        // A request waits for the slot, and its client goes away: its future is dropped
        // mid-wait, as hyper drops a request whose connection ended.
        let mut waiting = Box::pin(gate.admit());
        assert!(futures_poll_once(waiting.as_mut()).is_none());
        assert_eq!(gate.queued(), 1);
        drop(waiting);
        assert_eq!(
            gate.queued(),
            0,
            "the dropped request still counted as waiting"
        );
        // The queue has room again: the next request waits rather than being refused at once.
        let next = tokio::spawn({
            let gate = Arc::new(gate);
            let g = Arc::clone(&gate);
            async move { (g.admit().await.map(|_| ()), gate) }
        });
        tokio::task::yield_now().await;
        drop(held);
        let (answer, _) = next.await.unwrap();
        assert_eq!(answer, Ok(()));
    }

    /// Polls `fut` once with a waker that does nothing: `Some` if it finished.
    fn futures_poll_once<F: std::future::Future>(fut: std::pin::Pin<&mut F>) -> Option<F::Output> {
        let waker = std::task::Waker::noop();
        let mut cx = std::task::Context::from_waker(waker);
        match fut.poll(&mut cx) {
            std::task::Poll::Ready(v) => Some(v),
            std::task::Poll::Pending => None,
        }
    }
}
