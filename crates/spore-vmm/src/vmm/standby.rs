//! Refilling the standby clone processes off the request path.
//!
//! A clone request that used a standby process must start a new one (a
//! `posix_spawn` of the spore binary, about a millisecond) and, for a
//! zygote, send it the template to restore ahead. Done inline, that is on
//! every `PUT /clone`'s response time; done here, a `standby-refill` thread
//! does it right after the request released the VMM's lock. `GET /clone`
//! waits (bounded) for a refill under way, so what it reports is the pool
//! after the refill.

use std::sync::mpsc::{channel, Sender};
use std::sync::{Arc, Condvar, Mutex, Weak};
use std::time::Duration;

use super::{Inner, Vmm};
use crate::clone::source::fill_standby;
use crate::host::lock;

/// How long `GET /clone` waits for a refill under way.
const STATUS_WAIT: Duration = Duration::from_secs(2);

/// The refill thread's inbox and whether a refill is under way.
pub(super) struct StandbyRefill {
    tx: Mutex<Sender<()>>,
    pending: Arc<(Mutex<bool>, Condvar)>,
}

impl StandbyRefill {
    /// Asks the thread for a refill.
    pub(super) fn request(&self) {
        *lock(&self.pending.0) = true;
        let _ = lock(&self.tx).send(());
    }

    /// Waits until no refill is under way (at most [`STATUS_WAIT`]).
    pub(super) fn settle(&self) {
        let (flag, cv) = &*self.pending;
        let guard = lock(flag);
        let _ = cv.wait_timeout_while(guard, STATUS_WAIT, |pending| *pending);
    }
}

/// How this VMM refills its standby pool.
#[derive(Default)]
pub(super) enum Refill {
    /// On the thread that asks (before a clone request answers).
    #[default]
    Inline,
    /// On a `standby-refill` thread, started at the first refill that has
    /// work to do (a clone, whose pool is empty and stays so unless
    /// configured, never starts it).
    Lazy(Weak<Vmm>),
    Running(Arc<StandbyRefill>),
}

/// Starts the refill thread for `me`.
fn start_refill_thread(me: Weak<Vmm>) -> Option<Arc<StandbyRefill>> {
    let (tx, rx) = channel::<()>();
    let pending = Arc::new((Mutex::new(false), Condvar::new()));
    let done = pending.clone();
    crate::seccomp::spawn(
        crate::seccomp::ThreadKind::Vmm,
        "standby-refill".into(),
        move || {
            while rx.recv().is_ok() {
                // Requests that came meanwhile are served by this refill.
                while rx.try_recv().is_ok() {}
                let Some(vmm) = me.upgrade() else { break };
                vmm.refill_standby_now();
                drop(vmm);
                let (flag, cv) = &*done;
                *lock(flag) = false;
                cv.notify_all();
            }
        },
    )
    .ok()?;
    Some(Arc::new(StandbyRefill {
        tx: Mutex::new(tx),
        pending,
    }))
}

impl Vmm {
    /// Moves standby refills to a `standby-refill` thread (without this,
    /// a clone request refills the pool before it answers).
    pub fn enable_background_standby(self: &Arc<Self>) {
        *lock(&self.standby_refill) = Refill::Lazy(Arc::downgrade(self));
    }

    /// Refills the standby pool: on the refill thread if there is one, else
    /// here (the caller holds no lock).
    pub(super) fn refill_standby(&self) {
        let wanted = {
            let inner = self.lock();
            inner.source.config.standby > 0 || !inner.source.standby.is_empty()
        };
        let refill = {
            let mut r = lock(&self.standby_refill);
            if let Refill::Lazy(me) = &*r {
                if !wanted {
                    return;
                }
                *r = match start_refill_thread(me.clone()) {
                    Some(t) => Refill::Running(t),
                    None => Refill::Inline,
                };
            }
            match &*r {
                Refill::Running(t) => Some(t.clone()),
                _ => None,
            }
        };
        match refill {
            Some(r) => r.request(),
            None => self.refill_standby_now(),
        }
    }

    fn refill_standby_now(&self) {
        let mut inner = self.lock();
        let Inner { config, source, .. } = &mut *inner;
        if let Err(e) = fill_standby(source, config) {
            tracing::warn!("cannot refill the standby clone processes: {e}");
        }
    }

    /// Waits for a refill under way, if any (before reporting the pool).
    pub(super) fn settle_standby(&self) {
        let refill = match &*lock(&self.standby_refill) {
            Refill::Running(r) => Some(r.clone()),
            _ => None,
        };
        if let Some(r) = refill {
            r.settle();
        }
    }
}
