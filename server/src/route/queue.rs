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
    cap: usize,
}

#[derive(Debug, Default)]
struct State {
    items: VecDeque<ConnCommand>,
    closed: bool,
    /// `Drain` is due (before anything queued).
    drain: bool,
}

impl ConnQueue {
    pub fn new(cap: usize) -> Self {
        Self {
            state: Mutex::new(State::default()),
            waker: AtomicWaker::new(),
            cap: cap.max(1),
        }
    }

    pub fn try_send(&self, c: ConnCommand) -> Result<(), SendError> {
        {
            let mut s = self.state.lock();
            if s.closed {
                return Err(SendError::Closed(c));
            }
            if s.items.len() >= self.cap {
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

    /// The next command, if one is queued.
    pub fn try_recv(&self) -> Option<ConnCommand> {
        let mut s = self.state.lock();
        if std::mem::take(&mut s.drain) {
            return Some(ConnCommand::Drain);
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
}
