//! One process's events, fanned out to any number of subscribers (the Start stream and
//! any Connect streams).
//!
//! A slow subscriber never stalls the process nor the other subscribers: the producer
//! only appends to a shared backlog, bounded in bytes, and each subscriber reads it at its
//! own pace from a cursor of its own. Items every subscriber has read are dropped at
//! once; when a lagging subscriber keeps the backlog above its bound, the oldest items
//! go, and that subscriber is told how many bytes it lost (`Delivery::Lost`). The final
//! event is kept apart from the backlog, so no subscriber ever loses it.
//!
//! A subscriber sees what was pushed after it subscribed: E2B's Connect does not replay
//! earlier output, and the Start stream subscribes before the command runs.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::Notify;

/// Most bytes of events kept for subscribers that lag behind, per process.
pub(crate) const BACKLOG_BYTES: usize = 4 * 1024 * 1024;

/// What a subscriber gets next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Delivery<T, E> {
    /// The next item.
    Item(T),
    /// This many bytes of items were dropped because this subscriber read too slowly.
    Lost(usize),
    /// The final event; nothing follows it.
    End(E),
}

/// The producer's side: shared by the process task and every subscription.
pub(crate) struct Fanout<T, E> {
    state: Mutex<State<T, E>>,
    changed: Notify,
    cap: usize,
}

/// Where a subscriber stands.
struct Cursor {
    /// The sequence number of the next item it reads.
    next: u64,
    /// Bytes dropped before it read them, not yet reported.
    lost: usize,
}

struct State<T, E> {
    /// Items not yet read by every subscriber, with their sequence numbers and weights.
    items: VecDeque<(u64, T, usize)>,
    /// The sequence number the next pushed item gets.
    next_seq: u64,
    /// The summed weight of `items`.
    bytes: usize,
    /// Every live subscriber's cursor, by subscriber id.
    cursors: HashMap<u64, Cursor>,
    /// The id the next subscriber gets.
    next_id: u64,
    /// The final event, once there is one.
    end: Option<E>,
}

impl<T, E> State<T, E> {
    /// The sequence number of the oldest item kept.
    fn first_seq(&self) -> u64 {
        self.next_seq - self.items.len() as u64
    }

    /// Drops the items every subscriber has read (all of them when nobody listens), then
    /// the oldest ones while the backlog is over `cap`, charging them to the subscribers
    /// that had not read them yet. The newest item always stays.
    fn trim(&mut self, cap: usize) {
        let slowest = self.cursors.values().map(|c| c.next).min();
        while let Some(&(seq, _, weight)) = self.items.front() {
            let read_by_all = slowest.is_none_or(|slowest| seq < slowest);
            let over = self.bytes > cap && self.items.len() > 1;
            if !read_by_all && !over {
                break;
            }
            if !read_by_all {
                for cursor in self.cursors.values_mut() {
                    if cursor.next <= seq {
                        cursor.lost += weight;
                        cursor.next = seq + 1;
                    }
                }
            }
            self.items.pop_front();
            self.bytes -= weight;
        }
    }
}

impl<T: Clone, E: Clone> Fanout<T, E> {
    /// An empty fanout whose backlog holds at most `cap` bytes (beyond its newest item).
    pub(crate) fn new(cap: usize) -> Arc<Self> {
        Arc::new(Self {
            state: Mutex::new(State {
                items: VecDeque::new(),
                next_seq: 0,
                bytes: 0,
                cursors: HashMap::new(),
                next_id: 0,
                end: None,
            }),
            changed: Notify::new(),
            cap,
        })
    }

    fn lock(&self) -> MutexGuard<'_, State<T, E>> {
        // A panic while holding the lock leaves consistent state (every mutation is a
        // few plain assignments): keep serving rather than poison every stream.
        self.state
            .lock()
            .unwrap_or_else(|poison| poison.into_inner())
    }

    /// Appends an item of `weight` bytes for every subscriber. Never waits: a subscriber
    /// that lags loses the oldest items instead. Ignored after [`Fanout::finish`].
    pub(crate) fn push(&self, item: T, weight: usize) {
        {
            let mut state = self.lock();
            if state.end.is_some() {
                return;
            }
            if state.cursors.is_empty() {
                // Nobody listens: nobody will ever read it (no replay, see the module docs).
                state.next_seq += 1;
                return;
            }
            let seq = state.next_seq;
            state.items.push_back((seq, item, weight));
            state.next_seq += 1;
            state.bytes += weight;
            state.trim(self.cap);
        }
        self.changed.notify_waiters();
    }

    /// Sets the final event (the first one set wins) and wakes every subscriber.
    pub(crate) fn finish(&self, end: E) {
        {
            let mut state = self.lock();
            if state.end.is_none() {
                state.end = Some(end);
            }
        }
        self.changed.notify_waiters();
    }

    /// Whether the final event was set.
    pub(crate) fn is_finished(&self) -> bool {
        self.lock().end.is_some()
    }

    /// A new subscriber: it reads what is pushed from now on, then the final event.
    pub(crate) fn subscribe(self: &Arc<Self>) -> Subscription<T, E> {
        let mut state = self.lock();
        let id = state.next_id;
        state.next_id += 1;
        let next = state.next_seq;
        state.cursors.insert(id, Cursor { next, lost: 0 });
        Subscription {
            fanout: self.clone(),
            id,
            ended: false,
        }
    }
}

/// One subscriber's view of a [`Fanout`]. Dropping it lets the backlog go.
pub(crate) struct Subscription<T, E> {
    fanout: Arc<Fanout<T, E>>,
    id: u64,
    ended: bool,
}

impl<T: Clone, E: Clone> Subscription<T, E> {
    /// The next delivery, waiting for one; `None` after the final event was delivered.
    pub(crate) async fn next(&mut self) -> Option<Delivery<T, E>> {
        if self.ended {
            return None;
        }
        loop {
            // Created before the state is read: a push in between still wakes it.
            let changed = self.fanout.changed.notified();
            if let Some(delivery) = self.try_next() {
                if matches!(delivery, Delivery::End(_)) {
                    self.ended = true;
                }
                return Some(delivery);
            }
            changed.await;
        }
    }

    /// The next delivery if one is ready.
    fn try_next(&self) -> Option<Delivery<T, E>> {
        let mut state = self.fanout.lock();
        let first = state.first_seq();
        let next_seq = state.next_seq;
        let cursor = state.cursors.get_mut(&self.id)?;
        if cursor.lost > 0 {
            return Some(Delivery::Lost(std::mem::take(&mut cursor.lost)));
        }
        // Items pushed while nobody listened were never kept.
        cursor.next = cursor.next.max(first);
        if cursor.next < next_seq {
            let index = (cursor.next - first) as usize;
            cursor.next += 1;
            let item = state.items[index].1.clone();
            state.trim(self.fanout.cap);
            return Some(Delivery::Item(item));
        }
        state.end.clone().map(Delivery::End)
    }
}

impl<T, E> Drop for Subscription<T, E> {
    fn drop(&mut self) {
        let mut state = self
            .fanout
            .state
            .lock()
            .unwrap_or_else(|poison| poison.into_inner());
        state.cursors.remove(&self.id);
        state.trim(self.fanout.cap);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    type Test = Fanout<u32, &'static str>;

    #[tokio::test]
    async fn every_subscriber_gets_every_item_then_the_end() {
        let fanout = Test::new(1024);
        let mut a = fanout.subscribe();
        let mut b = fanout.subscribe();
        fanout.push(1, 1);
        fanout.push(2, 1);
        fanout.finish("done");
        fanout.push(3, 1);
        for sub in [&mut a, &mut b] {
            assert_eq!(sub.next().await, Some(Delivery::Item(1)));
            assert_eq!(sub.next().await, Some(Delivery::Item(2)));
            assert_eq!(sub.next().await, Some(Delivery::End("done")));
            assert_eq!(sub.next().await, None);
        }
    }

    #[tokio::test]
    async fn a_late_subscriber_sees_only_what_follows_and_the_end() {
        let fanout = Test::new(1024);
        let _early = fanout.subscribe();
        fanout.push(1, 1);
        let mut late = fanout.subscribe();
        fanout.push(2, 1);
        fanout.finish("done");
        assert_eq!(late.next().await, Some(Delivery::Item(2)));
        assert_eq!(late.next().await, Some(Delivery::End("done")));
        let mut after_end = fanout.subscribe();
        assert_eq!(after_end.next().await, Some(Delivery::End("done")));
    }

    #[tokio::test]
    async fn a_slow_subscriber_loses_old_items_but_never_the_end_nor_stalls_others() {
        let fanout = Test::new(10);
        let mut slow = fanout.subscribe();
        let mut fast = fanout.subscribe();
        for i in 0..100 {
            // The producer never waits, whatever the slow one does.
            fanout.push(i, 4);
            assert_eq!(fast.next().await, Some(Delivery::Item(i)));
        }
        fanout.finish("done");
        assert_eq!(fast.next().await, Some(Delivery::End("done")));
        // The backlog kept at most 10 bytes: 98 and 99 remain.
        assert_eq!(slow.next().await, Some(Delivery::Lost(98 * 4)));
        assert_eq!(slow.next().await, Some(Delivery::Item(98)));
        assert_eq!(slow.next().await, Some(Delivery::Item(99)));
        assert_eq!(slow.next().await, Some(Delivery::End("done")));
        assert!(fanout.lock().bytes <= 10);
    }

    #[tokio::test]
    async fn items_read_by_all_are_dropped_and_a_waiting_subscriber_wakes() {
        let fanout = Test::new(1024);
        let mut sub = fanout.subscribe();
        let waiter = tokio::spawn(async move {
            let first = sub.next().await;
            (first, sub)
        });
        tokio::time::sleep(Duration::from_millis(20)).await;
        fanout.push(7, 100);
        let (first, sub) = tokio::time::timeout(Duration::from_secs(5), waiter)
            .await
            .expect("woken")
            .expect("joined");
        assert_eq!(first, Some(Delivery::Item(7)));
        assert_eq!(fanout.lock().bytes, 0);
        drop(sub);
        fanout.push(8, 100);
        // Nobody listens: nothing is kept.
        assert_eq!(fanout.lock().items.len(), 0);
    }
}
