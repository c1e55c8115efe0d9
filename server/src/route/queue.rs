//! A connection's command queue: bounded, and as small as an idle connection
//! needs (a few words and no buffer while empty; tokio's mpsc keeps a
//! 32-slot block per channel). Many senders, one receiver (the connection's
//! task), which drains everything queued before it writes.

use std::collections::VecDeque;

use std::task::{Poll, Waker};

use parking_lot::{Mutex, MutexGuard};

use super::ConnCommand;

/// Why a command was not queued (it comes back with the error).
#[derive(Debug)]
pub enum SendError {
    /// The queue holds its bound: the connection is a slow consumer.
    Full(ConnCommand),
    /// The connection is gone.
    Closed(ConnCommand),
}

/// What an entry of the gateway's timers did ([`ConnQueue::fire`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fired {
    /// The connection's deadline came: its task is woken with `Tick`.
    Woken,
    /// The deadline had moved to this later tick: the caller enters it.
    Rearmed(u64),
    /// Not the connection's live entry (or it has no deadline any more).
    Stale,
}

#[derive(Debug)]
pub struct ConnQueue {
    state: Mutex<State>,
}

#[derive(Debug)]
struct State {
    items: VecDeque<ConnCommand>,
    /// The receiving task's waker (one receiver), under the lock every
    /// send takes anyway: 16 bytes where an `AtomicWaker` beside the lock
    /// is 24. Polled, not awaited: the idle connection's task holds no
    /// waiter node (tokio's `Notified` is 64 bytes) for it.
    waker: Option<Waker>,
    /// The gateway timers' tick this connection is armed for (`u64::MAX`:
    /// none). An entry of the timers for another tick is stale.
    armed: u64,
    /// The connection's deadline as its task last set it (`u64::MAX`:
    /// none); never before `armed`. Where it moved later, the armed entry
    /// re-arms for it when it comes, without waking the task.
    want: u64,
    /// The bound (here, not beside the lock: it fits in the state's padding).
    cap: u32,
    closed: bool,
    /// `Drain` is due (before anything queued).
    drain: bool,
    /// `Tick` is due: the armed tick came.
    tick: bool,
}

impl ConnQueue {
    pub fn new(cap: usize) -> Self {
        Self {
            state: Mutex::new(State {
                items: VecDeque::new(),
                waker: None,
                armed: u64::MAX,
                want: u64::MAX,
                cap: u32::try_from(cap).unwrap_or(u32::MAX).max(1),
                closed: false,
                drain: false,
                tick: false,
            }),
        }
    }

    /// Wakes the receiver, after the lock is released.
    fn wake(mut s: MutexGuard<'_, State>) {
        let waker = s.waker.take();
        drop(s);
        if let Some(w) = waker {
            w.wake();
        }
    }

    pub fn try_send(&self, c: ConnCommand) -> Result<(), SendError> {
        let mut s = self.state.lock();
        if s.closed {
            return Err(SendError::Closed(c));
        }
        if s.items.len() >= s.cap as usize {
            return Err(SendError::Full(c));
        }
        s.items.push_back(c);
        // The receiver looks and registers under the same lock: no lost
        // wakeup.
        Self::wake(s);
        Ok(())
    }

    /// Tells the receiver to drain (once), however full the queue is.
    pub fn drain(&self) {
        let mut s = self.state.lock();
        if s.closed {
            return;
        }
        s.drain = true;
        Self::wake(s);
    }

    /// Sets the connection's deadline to tick `at` of its gateway's timers
    /// (`u64::MAX`: none). True when the caller must enter it in the timers:
    /// it is earlier than the armed entry, or none is armed. A deadline that
    /// moved later is kept here, and the armed entry re-arms for it when it
    /// comes ([`Self::fire`]).
    pub fn arm(&self, at: u64) -> bool {
        let mut s = self.state.lock();
        if s.closed {
            return false;
        }
        s.want = at;
        if at >= s.armed {
            return false;
        }
        s.armed = at;
        true
    }

    /// The gateway's timers reached the entry for tick `at`. If the
    /// connection is still armed for it: its deadline came, and the
    /// receiver is woken with `Tick`; or its deadline moved later, and the
    /// connection is armed for that one instead, unwoken (the caller enters
    /// it). An entry the connection has since armed earlier than is stale.
    pub fn fire(&self, at: u64) -> Fired {
        let mut s = self.state.lock();
        if s.closed || s.armed != at {
            return Fired::Stale;
        }
        if s.want > at {
            s.armed = s.want;
            return match s.want {
                u64::MAX => Fired::Stale,
                later => Fired::Rearmed(later),
            };
        }
        s.armed = u64::MAX;
        s.tick = true;
        Self::wake(s);
        Fired::Woken
    }

    /// Whether an entry of the timers for tick `at` is this connection's
    /// live one (the timers drop the others when they compact).
    pub fn armed_for(&self, at: u64) -> bool {
        let s = self.state.lock();
        !s.closed && s.armed == at
    }

    /// The next command, if one is queued.
    pub fn try_recv(&self) -> Option<ConnCommand> {
        Self::take(&mut self.state.lock())
    }

    fn take(s: &mut State) -> Option<ConnCommand> {
        if std::mem::take(&mut s.drain) {
            return Some(ConnCommand::Drain);
        }
        if std::mem::take(&mut s.tick) {
            return Some(ConnCommand::Tick);
        }
        let c = s.items.pop_front();
        if s.items.is_empty() && s.items.capacity() > 16 {
            // A burst's buffer is not kept by an idle connection.
            s.items = VecDeque::new();
        }
        c
    }

    /// Waits for the next command. Cancel-safe (used in `select!`); one
    /// receiver at a time.
    pub async fn recv(&self) -> ConnCommand {
        std::future::poll_fn(|cx| {
            let mut s = self.state.lock();
            if let Some(c) = Self::take(&mut s) {
                return Poll::Ready(c);
            }
            // Looked and registered under one lock: a send after it wakes
            // this waker.
            match &s.waker {
                Some(w) if w.will_wake(cx.waker()) => {}
                _ => s.waker = Some(cx.waker().clone()),
            }
            Poll::Pending
        })
        .await
    }

    /// The receiver is gone: later sends fail with `Closed`; what is queued
    /// is dropped.
    pub fn close(&self) {
        let mut s = self.state.lock();
        s.closed = true;
        s.armed = u64::MAX;
        s.want = u64::MAX;
        s.items = VecDeque::new();
        s.waker = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[tokio::test]
    async fn bounded_in_order_and_closed_after_the_receiver() {
        let q = Arc::new(ConnQueue::new(2));
        assert!(q.try_send(ConnCommand::KickAndClose).is_ok());
        assert!(q.try_send(ConnCommand::KickAndClose).is_ok());
        assert!(matches!(
            q.try_send(ConnCommand::KickAndClose),
            Err(SendError::Full(_))
        ));
        assert!(q.try_recv().is_some());
        assert!(q.try_recv().is_some());
        assert!(q.try_recv().is_none());
        // A send while the receiver waits wakes it.
        let r = q.clone();
        let waiter = tokio::spawn(async move { r.recv().await });
        tokio::task::yield_now().await;
        assert!(q.try_send(ConnCommand::KickAndClose).is_ok());
        let got = tokio::time::timeout(std::time::Duration::from_secs(5), waiter)
            .await
            .expect("woken")
            .expect("task");
        assert!(matches!(got, ConnCommand::KickAndClose));
        // A drain gets through a full queue, first and once.
        assert!(q.try_send(ConnCommand::KickAndClose).is_ok());
        assert!(q.try_send(ConnCommand::KickAndClose).is_ok());
        q.drain();
        assert!(matches!(q.try_recv(), Some(ConnCommand::Drain)));
        assert!(matches!(q.try_recv(), Some(ConnCommand::KickAndClose)));
        assert!(matches!(q.try_recv(), Some(ConnCommand::KickAndClose)));
        assert!(q.try_recv().is_none());
        // It wakes a waiting receiver.
        let r = q.clone();
        let waiter = tokio::spawn(async move { r.recv().await });
        tokio::task::yield_now().await;
        q.drain();
        let got = tokio::time::timeout(std::time::Duration::from_secs(5), waiter)
            .await
            .expect("woken")
            .expect("task");
        assert!(matches!(got, ConnCommand::Drain));
        q.close();
        assert!(matches!(
            q.try_send(ConnCommand::KickAndClose),
            Err(SendError::Closed(_))
        ));
    }

    /// The timer's contract with the gateway's timers: a deadline is entered
    /// only when it is earlier than the one armed; only the armed entry
    /// fires; it wakes the receiver (with `Tick`, once) if the deadline
    /// came, and re-arms without a wake if the deadline moved later; a
    /// closed queue arms nothing.
    #[test]
    fn a_timer_is_armed_earlier_only_and_fired_by_its_own_entry() {
        let q = ConnQueue::new(4);
        assert!(q.arm(100), "the first deadline is entered");
        assert!(!q.arm(100), "the same one is not entered twice");
        assert!(!q.arm(200), "a later one waits for the armed one");
        assert!(q.arm(50), "an earlier one is entered");
        assert!(!q.armed_for(100), "the entry for 100 is stale now");
        assert!(q.armed_for(50));
        assert_eq!(q.fire(100), Fired::Stale, "a stale entry wakes nobody");
        assert!(q.try_recv().is_none());
        assert_eq!(q.fire(50), Fired::Woken);
        assert!(matches!(q.try_recv(), Some(ConnCommand::Tick)));
        assert!(q.try_recv().is_none(), "one tick per firing");
        assert_eq!(q.fire(50), Fired::Stale, "fired once");
        assert!(
            q.arm(200),
            "disarmed after firing: the next deadline is entered"
        );
        // The deadline moves later (a handshake done, a heartbeat read):
        // the entry for 200 re-arms for it and wakes nobody.
        assert!(!q.arm(900));
        assert_eq!(q.fire(200), Fired::Rearmed(900));
        assert!(q.try_recv().is_none(), "no wake for a deadline that moved");
        assert!(q.armed_for(900));
        assert_eq!(q.fire(900), Fired::Woken);
        assert!(matches!(q.try_recv(), Some(ConnCommand::Tick)));
        // No deadline any more: the armed entry disarms.
        assert!(q.arm(300));
        assert!(!q.arm(u64::MAX));
        assert_eq!(q.fire(300), Fired::Stale);
        assert!(q.try_recv().is_none());
        assert!(q.arm(400), "nothing armed: the next deadline is entered");
        q.close();
        assert!(!q.armed_for(400));
        assert_eq!(q.fire(400), Fired::Stale);
        assert!(!q.arm(10), "a closed queue arms nothing");
    }

    /// Every connection holds its queue in an `Arc` (two counts, 16 bytes,
    /// before it): the state's fields are laid out to keep it within
    /// jemalloc's 96-byte size class (memory per idle connection).
    #[test]
    fn a_queue_fits_its_allocation_class() {
        let size = std::mem::size_of::<ConnQueue>();
        assert!(size + 16 <= 96, "the queue is {size} bytes");
    }
}
