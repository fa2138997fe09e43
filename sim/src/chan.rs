//! An unbounded channel with one receiver that wakes its task exactly when
//! `futures::channel::mpsc::unbounded` does, for less.
//!
//! A node's outgoing queue and its inbox are such channels. Which task a send wakes, and when,
//! is part of a run: madsim draws from the run's RNG to pick each task it polls, so one wake-up
//! more or less (even of a task that finds nothing to do) changes the rest of the run. This
//! channel keeps every rule of `futures-channel` 0.3's unbounded channel that decides a wake-up:
//!
//! - a send pushes the message, then wakes the registered waker, if any, and forgets it;
//! - a receive that finds the queue empty (and the channel open) registers the task's waker
//!   (keeping the one registered if it wakes the same task), then looks again: a message found
//!   then is returned and the waker *stays* registered, so the next send wakes the task even if it
//!   is waiting for something else by then;
//! - dropping the last sender closes the channel and wakes the registered waker (the receiver
//!   then drains what is queued and ends); dropping the receiver closes the channel and drops
//!   what is queued, keeps its waker registered, and sends fail from then on.
//!
//! What it saves per message: the queue node `futures-channel` allocates for each message and
//! the atomic read-modify-writes of its lock-free queue and counters (the run is on one thread).
//! The test `the_wire_replays_madsims_udp_path`, the determinism tests and the history
//! comparisons of docs/simulation.md ("Seeds per core-second") check that runs are unchanged.

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};

struct State<T> {
    queue: VecDeque<T>,
    /// Cleared when the last sender or the receiver is dropped.
    open: bool,
    senders: usize,
    /// The receiver's task, registered when it found nothing (`AtomicWaker`).
    waker: Option<Waker>,
}

type Shared<T> = Arc<Mutex<State<T>>>;

fn lock<T>(shared: &Shared<T>) -> MutexGuard<'_, State<T>> {
    shared
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// A new channel.
#[must_use]
pub fn unbounded<T>() -> (Sender<T>, Receiver<T>) {
    let shared = Arc::new(Mutex::new(State {
        queue: VecDeque::new(),
        open: true,
        senders: 1,
        waker: None,
    }));
    (Sender(Arc::clone(&shared)), Receiver(Some(shared)))
}

/// The sending side (cloned for every sender).
pub struct Sender<T>(Shared<T>);

impl<T> Sender<T> {
    /// Queues `msg` and wakes the receiver's task if it is registered; gives `msg` back if the
    /// receiver is gone.
    pub fn send(&self, msg: T) -> Result<(), T> {
        let waker = {
            let mut state = lock(&self.0);
            if !state.open {
                return Err(msg);
            }
            state.queue.push_back(msg);
            state.waker.take()
        };
        if let Some(waker) = waker {
            waker.wake();
        }
        Ok(())
    }
}

impl<T> Clone for Sender<T> {
    fn clone(&self) -> Self {
        lock(&self.0).senders += 1;
        Self(Arc::clone(&self.0))
    }
}

impl<T> Drop for Sender<T> {
    fn drop(&mut self) {
        let waker = {
            let mut state = lock(&self.0);
            state.senders -= 1;
            if state.senders > 0 {
                return;
            }
            state.open = false;
            state.waker.take()
        };
        if let Some(waker) = waker {
            waker.wake();
        }
    }
}

impl<T> std::fmt::Debug for Sender<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sender").finish_non_exhaustive()
    }
}

/// The receiving side; `None` once it has returned the end of the channel.
pub struct Receiver<T>(Option<Shared<T>>);

impl<T> Receiver<T> {
    /// The next message if one is queued, without registering for a wake-up: `Ok(None)` at the
    /// end of the channel, `Err(())` if it is empty but open.
    #[allow(clippy::result_unit_err)]
    pub fn try_recv(&mut self) -> Result<Option<T>, ()> {
        let Some(shared) = &self.0 else {
            return Ok(None);
        };
        let next = {
            let mut state = lock(shared);
            match state.queue.pop_front() {
                Some(msg) => Some(msg),
                None if !state.open => None,
                None => return Err(()),
            }
        };
        if next.is_none() {
            self.0 = None;
        }
        Ok(next)
    }

    /// The next message, waiting for one; `None` at the end of the channel.
    pub fn recv(&mut self) -> Recv<'_, T> {
        Recv(self)
    }

    /// `futures`' `poll_next`: a message, or the end, or the waker registered and a second look.
    /// The run is on one thread, so nothing can arrive between the two looks and both happen
    /// under one lock.
    fn poll_recv(&mut self, cx: &mut Context<'_>) -> Poll<Option<T>> {
        let Some(shared) = &self.0 else {
            return Poll::Ready(None);
        };
        let next = {
            let mut state = lock(shared);
            match state.queue.pop_front() {
                Some(msg) => Some(msg),
                None if !state.open => None,
                None => {
                    match &state.waker {
                        Some(waker) if waker.will_wake(cx.waker()) => {}
                        _ => state.waker = Some(cx.waker().clone()),
                    }
                    return Poll::Pending;
                }
            }
        };
        if next.is_none() {
            self.0 = None;
        }
        Poll::Ready(next)
    }

    /// Every message queued now, in order, to `take` (what [`Receiver::try_recv`] would return
    /// one by one, under one lock).
    pub fn try_recv_all(&mut self, mut take: impl FnMut(T)) {
        let Some(shared) = &self.0 else {
            return;
        };
        let mut state = lock(shared);
        while let Some(msg) = state.queue.pop_front() {
            take(msg);
        }
    }
}

impl<T> Drop for Receiver<T> {
    fn drop(&mut self) {
        if let Some(shared) = self.0.take() {
            let queued = {
                let mut state = lock(&shared);
                state.open = false;
                std::mem::take(&mut state.queue)
            };
            drop(queued);
        }
    }
}

impl<T> std::fmt::Debug for Receiver<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Receiver")
            .field("ended", &self.0.is_none())
            .finish_non_exhaustive()
    }
}

/// [`Receiver::recv`]'s future.
#[derive(Debug)]
pub struct Recv<'a, T>(&'a mut Receiver<T>);

impl<T> Future for Recv<'_, T> {
    type Output = Option<T>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<T>> {
        self.get_mut().0.poll_recv(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::StreamExt;
    use futures::channel::mpsc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::task::Wake;

    /// A task that counts its wake-ups.
    struct Counting(AtomicUsize);

    impl Wake for Counting {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Both channels side by side, each with its own two tasks (the receiver may be polled by
    /// either, as a task that moved on would poll a stale registration's channel).
    struct Pair {
        ours: (Vec<Sender<u32>>, Option<Receiver<u32>>),
        theirs: (
            Vec<mpsc::UnboundedSender<u32>>,
            Option<mpsc::UnboundedReceiver<u32>>,
        ),
        tasks: [(Arc<Counting>, Arc<Counting>); 2],
    }

    impl Pair {
        fn new() -> Self {
            let (tx, rx) = unbounded();
            let (ftx, frx) = mpsc::unbounded();
            let task = || Arc::new(Counting(AtomicUsize::new(0)));
            Self {
                ours: (vec![tx], Some(rx)),
                theirs: (vec![ftx], Some(frx)),
                tasks: [(task(), task()), (task(), task())],
            }
        }

        fn wakes(&self) -> [(usize, usize); 2] {
            self.tasks
                .each_ref()
                .map(|(a, b)| (a.0.load(Ordering::Relaxed), b.0.load(Ordering::Relaxed)))
        }

        /// One step of either channel; what each returned, as text.
        fn step(&mut self, op: u32, n: u32) -> (String, String) {
            let (ours, theirs) = (&mut self.ours, &mut self.theirs);
            let i = n as usize;
            match op {
                0 | 1 => {
                    let a = ours
                        .0
                        .get(i % ours.0.len().max(1))
                        .map(|t| t.send(n).is_ok());
                    let b = theirs
                        .0
                        .get(i % theirs.0.len().max(1))
                        .map(|t| t.unbounded_send(n).is_ok());
                    (format!("{a:?}"), format!("{b:?}"))
                }
                2 => {
                    if let Some(t) = ours.0.first().cloned() {
                        ours.0.push(t);
                    }
                    if let Some(t) = theirs.0.first().cloned() {
                        theirs.0.push(t);
                    }
                    (String::new(), String::new())
                }
                3 => {
                    if !ours.0.is_empty() {
                        ours.0.remove(i % ours.0.len());
                    }
                    if !theirs.0.is_empty() {
                        theirs.0.remove(i % theirs.0.len());
                    }
                    (String::new(), String::new())
                }
                4..=6 => {
                    let our_waker = Waker::from(Arc::clone(&self.tasks[0].0));
                    let their_waker = Waker::from(Arc::clone(&self.tasks[1].0));
                    let (our_waker, their_waker) = if n.is_multiple_of(2) {
                        (our_waker, their_waker)
                    } else {
                        (
                            Waker::from(Arc::clone(&self.tasks[0].1)),
                            Waker::from(Arc::clone(&self.tasks[1].1)),
                        )
                    };
                    let a = ours.1.as_mut().map(|rx| {
                        Pin::new(&mut rx.recv()).poll(&mut Context::from_waker(&our_waker))
                    });
                    let b = theirs
                        .1
                        .as_mut()
                        .map(|rx| rx.poll_next_unpin(&mut Context::from_waker(&their_waker)));
                    (format!("{a:?}"), format!("{b:?}"))
                }
                7 if n % 2 == 1 => {
                    let a = ours.1.as_mut().map(|rx| {
                        let mut all = Vec::new();
                        rx.try_recv_all(|m| all.push(m));
                        all
                    });
                    let b = theirs.1.as_mut().map(|rx| {
                        let mut all = Vec::new();
                        while let Ok(m) = rx.try_recv() {
                            all.push(m);
                        }
                        all
                    });
                    (format!("{a:?}"), format!("{b:?}"))
                }
                7 => {
                    let a = ours.1.as_mut().map(Receiver::try_recv);
                    let b = theirs.1.as_mut().map(|rx| match rx.try_recv() {
                        Ok(m) => Ok(Some(m)),
                        Err(e) if e.is_closed() => Ok(None),
                        Err(_) => Err(()),
                    });
                    (format!("{a:?}"), format!("{b:?}"))
                }
                _ => {
                    ours.1 = None;
                    theirs.1 = None;
                    (String::new(), String::new())
                }
            }
        }
    }

    /// Random sequences of sends, sender clones and drops, polls by one task or another,
    /// `try_recv`, `try_recv_all` and the receiver's drop: after every step this channel and `futures`' have
    /// answered the same and woken the same tasks as often.
    #[test]
    fn wakes_and_answers_as_futures_unbounded_channel() {
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let mut woken = 0;
        for _ in 0..2_000 {
            let mut pair = Pair::new();
            for _ in 0..40 {
                let r = next();
                // Drops of the receiver are rare, so that most sequences run long.
                let op = if r % 64 == 0 { 8 } else { (r >> 8) as u32 % 8 };
                let n = (r >> 32) as u32 % 7;
                let (a, b) = pair.step(op, n);
                assert_eq!(a, b, "op {op} ({n})");
                let [ours, theirs] = pair.wakes();
                assert_eq!(ours, theirs, "wake-ups after op {op} ({n})");
            }
            woken += pair.wakes()[0].0 + pair.wakes()[0].1;
        }
        assert!(woken > 1_000, "the sequences wake tasks ({woken})");
    }
}
