//! A connection's command queue: bounded, and as small as an idle connection
//! needs (a few words and no buffer while empty; tokio's mpsc keeps a
//! 32-slot block per channel). Many senders, one receiver (the connection's
//! task), which drains everything queued before it writes.

use std::collections::VecDeque;

use std::task::Poll;

use futures_util::task::AtomicWaker;
use parking_lot::Mutex;

use super::ConnCommand;

/// Why a command was not queued (it comes back with the error).
#[derive(Debug)]
pub enum SendError {
    /// The queue holds its bound: the connection is a slow consumer.
    Full(ConnCommand),
    /// The connection is gone.
    Closed(ConnCommand),
}

#[derive(Debug)]
pub struct ConnQueue {
    state: Mutex<State>,
    /// The receiving task's waker (one receiver). Polled, not awaited: the
    /// idle connection's task holds no waiter node (tokio's `Notified` is
    /// 64 bytes) for it.
    waker: AtomicWaker,
}

#[derive(Debug)]
struct State {
    items: VecDeque<ConnCommand>,
    /// The gateway timers' tick this connection is armed for (`u64::MAX`:
    /// none). An entry of the timers for another tick is stale.
    armed: u64,
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
                armed: u64::MAX,
                cap: u32::try_from(cap).unwrap_or(u32::MAX).max(1),
                closed: false,
                drain: false,
                tick: false,
            }),
            waker: AtomicWaker::new(),
        }
    }

    pub fn try_send(&self, c: ConnCommand) -> Result<(), SendError> {
        {
            let mut s = self.state.lock();
            if s.closed {
                return Err(SendError::Closed(c));
            }
            if s.items.len() >= s.cap as usize {
                return Err(SendError::Full(c));
            }
            s.items.push_back(c);
        }
        // The receiver registers before it looks again: no lost wakeup.
        self.waker.wake();
        Ok(())
    }

    /// Tells the receiver to drain (once), however full the queue is.
    pub fn drain(&self) {
        {
            let mut s = self.state.lock();
            if s.closed {
                return;
            }
            s.drain = true;
        }
        self.waker.wake();
    }

    /// Arms the connection's timer for tick `at` of its gateway's timers,
    /// unless it is armed for that tick or an earlier one (the earlier one
    /// comes first, and the connection arms again then). True when `at` is
    /// newly armed: the caller enters it in the timers.
    pub fn arm(&self, at: u64) -> bool {
        let mut s = self.state.lock();
        if s.closed || at >= s.armed {
            return false;
        }
        s.armed = at;
        true
    }

    /// The gateway's timers reached tick `at`: wakes the receiver with
    /// `Tick` if the connection is still armed for it (true then). An entry
    /// the connection has since armed earlier than is stale and wakes nobody.
    pub fn fire(&self, at: u64) -> bool {
        {
            let mut s = self.state.lock();
            if s.closed || s.armed != at {
                return false;
            }
            s.armed = u64::MAX;
            s.tick = true;
        }
        self.waker.wake();
        true
    }

    /// Whether an entry of the timers for tick `at` is this connection's
    /// live one (the timers drop the others when they compact).
    pub fn armed_for(&self, at: u64) -> bool {
        let s = self.state.lock();
        !s.closed && s.armed == at
    }

    /// The next command, if one is queued.
    pub fn try_recv(&self) -> Option<ConnCommand> {
        let mut s = self.state.lock();
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
            if let Some(c) = self.try_recv() {
                return Poll::Ready(c);
            }
            self.waker.register(cx.waker());
            // A command queued between the first look and the registration
            // woke nobody: look again.
            match self.try_recv() {
                Some(c) => Poll::Ready(c),
                None => Poll::Pending,
            }
        })
        .await
    }

    /// The receiver is gone: later sends fail with `Closed`; what is queued
    /// is dropped.
    pub fn close(&self) {
        let mut s = self.state.lock();
        s.closed = true;
        s.armed = u64::MAX;
        s.items = VecDeque::new();
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
    /// wakes the receiver (with `Tick`, once); a closed queue arms nothing.
    #[test]
    fn a_timer_is_armed_earlier_only_and_fired_by_its_own_entry() {
        let q = ConnQueue::new(4);
        assert!(q.arm(100), "the first deadline is entered");
        assert!(!q.arm(100), "the same one is not entered twice");
        assert!(!q.arm(200), "a later one waits for the armed one");
        assert!(q.arm(50), "an earlier one is entered");
        assert!(!q.armed_for(100), "the entry for 100 is stale now");
        assert!(q.armed_for(50));
        assert!(!q.fire(100), "a stale entry wakes nobody");
        assert!(q.try_recv().is_none());
        assert!(q.fire(50));
        assert!(matches!(q.try_recv(), Some(ConnCommand::Tick)));
        assert!(q.try_recv().is_none(), "one tick per firing");
        assert!(!q.fire(50), "fired once");
        assert!(
            q.arm(200),
            "disarmed after firing: the next deadline is entered"
        );
        q.close();
        assert!(!q.armed_for(200));
        assert!(!q.fire(200));
        assert!(!q.arm(10), "a closed queue arms nothing");
    }
}
