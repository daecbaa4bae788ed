//! The simulated hosts: what each holds (busy and idle instances, zygotes,
//! snapshots), how a start finds room (evicting the least recently used
//! idle instance, then the least recently used zygote, as `spore serve
//! --memory-budget` does), and how idle instances and zygotes expire.
//!
//! Idle instances sit on two intrusive lists: their (function, host) pair's,
//! most recently used first (a warm start takes the head), and their host's,
//! least recently used last (eviction and keep-alive expiry take the tail:
//! the oldest idle instance is also the next to expire). Zygotes sit on
//! their host's list by last invocation, least recent last (eviction and
//! expiry take the tail again). Every operation is O(1).

use super::workload::{Function, ZYGOTE_DIVISOR};

/// No instance (the end of a list).
const NONE: u32 = u32::MAX;
/// No time (no check pending).
pub(super) const NEVER: u64 = u64::MAX;

/// Pair flags.
const SNAPSHOT: u8 = 1;
const ZYGOTE: u8 = 2;

/// How a start on a host began (the order of the start costs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Start {
    Warm = 0,
    Clone = 1,
    Restore = 2,
    Cold = 3,
}

#[derive(Clone, Debug)]
struct Instance {
    f: u32,
    h: u32,
    idle_since: u64,
    pair_prev: u32,
    pair_next: u32,
    host_prev: u32,
    host_next: u32,
}

/// What a (function, host) pair holds.
#[derive(Clone, Debug)]
struct Pair {
    /// The function's last invocation on the host (what keeps its zygote).
    last_invoked: u64,
    /// The head of its idle instances (most recently used first).
    idle_head: u32,
    /// The functions before and after it on the host's zygote list.
    zyg_prev: u32,
    zyg_next: u32,
    flags: u8,
}

#[derive(Clone, Debug)]
pub(super) struct Host {
    cap: u64,
    busy: u64,
    idle: u64,
    zygotes_kib: u64,
    /// Idle instances: most recently used first.
    lru_head: u32,
    lru_tail: u32,
    /// When the pending keep-alive check of this host is due.
    check_at: u64,
    /// Functions with a zygote here: most recently invoked first.
    zyg_head: u32,
    zyg_tail: u32,
    /// When the pending zygote check of this host is due.
    zyg_check_at: u64,
    /// Held memory (busy + idle + zygotes) integrated over time (KiB·s), and
    /// busy memory alike, up to `last_ns`.
    held_kib_s: f64,
    busy_kib_s: f64,
    last_ns: u64,
    peak_kib: u64,
}

impl Host {
    fn held(&self) -> u64 {
        self.busy + self.idle + self.zygotes_kib
    }
}

/// What each host holds, and what was ended to make room.
pub(super) struct Cluster {
    hosts: Vec<Host>,
    nhosts: usize,
    instances: Vec<Instance>,
    free: Vec<u32>,
    /// Per (function, host), in one place (one cache line to reach).
    pairs: Vec<Pair>,
    mem_kib: Vec<u64>,
    keep_alive: u64,
    zygote_keep_alive: u64,
    pub(super) evicted_instances: u64,
    pub(super) evicted_zygotes: u64,
}

impl Cluster {
    /// `nhosts` hosts of `cap_kib`; idle instances kept `keep_alive` ns,
    /// zygotes `zygote_keep_alive` ns after their function's last invocation.
    pub(super) fn new(
        nhosts: u32,
        cap_kib: u64,
        functions: &[Function],
        keep_alive: u64,
        zygote_keep_alive: u64,
    ) -> Cluster {
        let nhosts = nhosts as usize;
        let host = Host {
            cap: cap_kib,
            busy: 0,
            idle: 0,
            zygotes_kib: 0,
            lru_head: NONE,
            lru_tail: NONE,
            check_at: NEVER,
            zyg_head: NONE,
            zyg_tail: NONE,
            zyg_check_at: NEVER,
            held_kib_s: 0.0,
            busy_kib_s: 0.0,
            last_ns: 0,
            peak_kib: 0,
        };
        let pairs = nhosts * functions.len();
        Cluster {
            hosts: vec![host; nhosts],
            nhosts,
            instances: Vec::new(),
            free: Vec::new(),
            pairs: vec![
                Pair {
                    last_invoked: 0,
                    idle_head: NONE,
                    zyg_prev: NONE,
                    zyg_next: NONE,
                    flags: 0,
                };
                pairs
            ],
            mem_kib: functions.iter().map(|f| f.mem_kib).collect(),
            keep_alive,
            zygote_keep_alive,
            evicted_instances: 0,
            evicted_zygotes: 0,
        }
    }

    pub(super) fn pair(&self, f: u32, h: u32) -> usize {
        f as usize * self.nhosts + h as usize
    }

    pub(super) fn has_idle(&self, f: u32, h: u32) -> bool {
        self.pairs[self.pair(f, h)].idle_head != NONE
    }

    /// Whether a new instance of `f` fits on `h` once its idle instances
    /// and other functions' zygotes are ended.
    pub(super) fn fits(&self, h: u32, f: &Function) -> bool {
        let host = &self.hosts[h as usize];
        host.busy + f.start_kib() <= host.cap
    }

    /// Memory not held by anything (KiB).
    pub(super) fn unreserved(&self, h: u32) -> u64 {
        let host = &self.hosts[h as usize];
        host.cap.saturating_sub(host.held())
    }

    /// Brings the host's memory integrals up to `now`: before every change.
    fn account(&mut self, h: usize, now: u64) {
        let host = &mut self.hosts[h];
        let dt = now.saturating_sub(host.last_ns) as f64 / 1e9;
        host.held_kib_s += host.held() as f64 * dt;
        host.busy_kib_s += host.busy as f64 * dt;
        host.last_ns = now;
    }

    fn note_peak(&mut self, h: usize) {
        let host = &mut self.hosts[h];
        host.peak_kib = host.peak_kib.max(host.held());
    }

    /// A warm start: the most recently used idle instance of `f` on `h`
    /// becomes busy. `None` when there is none.
    pub(super) fn take_warm(&mut self, now: u64, f: u32, h: u32) -> Option<u32> {
        let id = self.pairs[self.pair(f, h)].idle_head;
        if id == NONE {
            return None;
        }
        self.account(h as usize, now);
        self.unlink(id);
        let mem = self.mem_kib[f as usize];
        let host = &mut self.hosts[h as usize];
        host.idle -= mem;
        host.busy += mem;
        Some(id)
    }

    /// A start that is not warm: makes room, then clones the zygote, or
    /// restores the snapshot (making the zygote), or boots (making both).
    /// Returns how it started, the busy instance, and when to check the
    /// host's zygotes if no check is pending.
    pub(super) fn start_new(&mut self, now: u64, f: u32, h: u32) -> (Start, u32, Option<u64>) {
        let p = self.pair(f, h);
        let mem = self.mem_kib[f as usize];
        let had_zygote = self.pairs[p].flags & ZYGOTE != 0;
        let need = if had_zygote {
            mem
        } else {
            mem + mem / ZYGOTE_DIVISOR
        };
        self.account(h as usize, now);
        self.make_room(h, need, f);
        let kind = if had_zygote {
            Start::Clone
        } else if self.pairs[p].flags & SNAPSHOT != 0 {
            Start::Restore
        } else {
            Start::Cold
        };
        let mut check = None;
        if !had_zygote {
            self.pairs[p].flags |= ZYGOTE | SNAPSHOT;
            self.hosts[h as usize].zygotes_kib += mem / ZYGOTE_DIVISOR;
            self.pairs[p].last_invoked = now;
            self.zyg_link(f, h);
            let host = &mut self.hosts[h as usize];
            // A zygote keep-alive of NEVER keeps zygotes: nothing to check.
            if host.zyg_check_at == NEVER && self.zygote_keep_alive != NEVER {
                host.zyg_check_at = now.saturating_add(self.zygote_keep_alive);
                check = Some(host.zyg_check_at);
            }
        }
        self.hosts[h as usize].busy += mem;
        self.note_peak(h as usize);
        let inst = Instance {
            f,
            h,
            idle_since: 0,
            pair_prev: NONE,
            pair_next: NONE,
            host_prev: NONE,
            host_next: NONE,
        };
        let id = if let Some(id) = self.free.pop() {
            self.instances[id as usize] = inst;
            id
        } else {
            self.instances.push(inst);
            u32::try_from(self.instances.len() - 1).unwrap_or(NONE)
        };
        (kind, id, check)
    }

    /// Ends idle instances (least recently used first), then zygotes other
    /// than `keep`'s (least recently invoked first), until `need` KiB fit.
    fn make_room(&mut self, h: u32, need: u64, keep: u32) {
        let hu = h as usize;
        while self.hosts[hu].held() + need > self.hosts[hu].cap {
            let tail = self.hosts[hu].lru_tail;
            if tail != NONE {
                self.end_idle(tail);
                self.evicted_instances += 1;
                continue;
            }
            let mut victim = self.hosts[hu].zyg_tail;
            if victim == keep {
                victim = self.pairs[self.pair(keep, h)].zyg_prev;
            }
            if victim == NONE {
                break;
            }
            self.end_zygote(victim, h);
            self.evicted_zygotes += 1;
        }
    }

    /// Records an invocation of `f` on `h`: what keeps its zygote there.
    pub(super) fn invoked(&mut self, now: u64, f: u32, h: u32) {
        let p = self.pair(f, h);
        self.pairs[p].last_invoked = now;
        if self.pairs[p].flags & ZYGOTE != 0 && self.hosts[h as usize].zyg_head != f {
            self.zyg_unlink(f, h);
            self.zyg_link(f, h);
        }
    }

    /// The end of an invocation: the instance becomes idle. Returns when to
    /// check its host's keep-alives, and the host, if no check is pending.
    pub(super) fn end_exec(&mut self, now: u64, id: u32) -> Option<(u64, u32)> {
        let (f, host_id) = {
            let i = &self.instances[id as usize];
            (i.f, i.h)
        };
        let h = host_id as usize;
        self.account(h, now);
        let mem = self.mem_kib[f as usize];
        self.hosts[h].busy -= mem;
        self.hosts[h].idle += mem;
        self.instances[id as usize].idle_since = now;
        self.link(id);
        let host = &mut self.hosts[h];
        (host.check_at == NEVER).then(|| {
            host.check_at = now.saturating_add(self.keep_alive);
            (host.check_at, host_id)
        })
    }

    /// A host's keep-alive check: ends the instances idle for `keep_alive`;
    /// returns when to check next, if anything is left idle.
    pub(super) fn expire(&mut self, now: u64, h: u32) -> Option<u64> {
        let hu = h as usize;
        self.account(hu, now);
        self.hosts[hu].check_at = NEVER;
        loop {
            let tail = self.hosts[hu].lru_tail;
            if tail == NONE {
                return None;
            }
            let due = self.instances[tail as usize]
                .idle_since
                .saturating_add(self.keep_alive);
            if due > now {
                self.hosts[hu].check_at = due;
                return Some(due);
            }
            self.end_idle(tail);
        }
    }

    /// A host's zygote check: ends the zygotes whose function was not
    /// invoked there for the zygote keep-alive; returns when to check next,
    /// if any zygote is left.
    pub(super) fn expire_zygotes(&mut self, now: u64, h: u32) -> Option<u64> {
        let hu = h as usize;
        self.account(hu, now);
        self.hosts[hu].zyg_check_at = NEVER;
        loop {
            let tail = self.hosts[hu].zyg_tail;
            if tail == NONE {
                return None;
            }
            let due = self.pairs[self.pair(tail, h)]
                .last_invoked
                .saturating_add(self.zygote_keep_alive);
            if due > now {
                self.hosts[hu].zyg_check_at = due;
                return Some(due);
            }
            self.end_zygote(tail, h);
        }
    }

    /// Ends a zygote (its host is accounted up to now).
    fn end_zygote(&mut self, f: u32, h: u32) {
        let p = self.pair(f, h);
        self.pairs[p].flags &= !ZYGOTE;
        self.zyg_unlink(f, h);
        self.hosts[h as usize].zygotes_kib -= self.mem_kib[f as usize] / ZYGOTE_DIVISOR;
    }

    /// Puts `f`'s zygote at the head of `h`'s zygote list.
    fn zyg_link(&mut self, f: u32, h: u32) {
        let p = self.pair(f, h);
        let head = self.hosts[h as usize].zyg_head;
        self.pairs[p].zyg_prev = NONE;
        self.pairs[p].zyg_next = head;
        if head != NONE {
            let q = self.pair(head, h);
            self.pairs[q].zyg_prev = f;
        } else {
            self.hosts[h as usize].zyg_tail = f;
        }
        self.hosts[h as usize].zyg_head = f;
    }

    /// Takes `f`'s zygote off `h`'s zygote list.
    fn zyg_unlink(&mut self, f: u32, h: u32) {
        let p = self.pair(f, h);
        let (prev, next) = (self.pairs[p].zyg_prev, self.pairs[p].zyg_next);
        if prev != NONE {
            let q = self.pair(prev, h);
            self.pairs[q].zyg_next = next;
        } else {
            self.hosts[h as usize].zyg_head = next;
        }
        if next != NONE {
            let q = self.pair(next, h);
            self.pairs[q].zyg_prev = prev;
        } else {
            self.hosts[h as usize].zyg_tail = prev;
        }
    }

    /// Ends an idle instance (its host is accounted up to now).
    fn end_idle(&mut self, id: u32) {
        self.unlink(id);
        let (f, h) = {
            let i = &self.instances[id as usize];
            (i.f, i.h as usize)
        };
        self.hosts[h].idle -= self.mem_kib[f as usize];
        self.free.push(id);
    }

    /// Puts an instance at the head of its pair's and its host's idle lists.
    fn link(&mut self, id: u32) {
        let (f, h) = {
            let i = &self.instances[id as usize];
            (i.f, i.h)
        };
        let p = self.pair(f, h);
        let (pair_head, host_head) = (self.pairs[p].idle_head, self.hosts[h as usize].lru_head);
        {
            let i = &mut self.instances[id as usize];
            i.pair_prev = NONE;
            i.pair_next = pair_head;
            i.host_prev = NONE;
            i.host_next = host_head;
        }
        if pair_head != NONE {
            self.instances[pair_head as usize].pair_prev = id;
        }
        self.pairs[p].idle_head = id;
        if host_head != NONE {
            self.instances[host_head as usize].host_prev = id;
        } else {
            self.hosts[h as usize].lru_tail = id;
        }
        self.hosts[h as usize].lru_head = id;
    }

    /// Takes an idle instance off both lists.
    fn unlink(&mut self, id: u32) {
        let i = self.instances[id as usize].clone();
        let p = self.pair(i.f, i.h);
        if i.pair_prev != NONE {
            self.instances[i.pair_prev as usize].pair_next = i.pair_next;
        } else {
            self.pairs[p].idle_head = i.pair_next;
        }
        if i.pair_next != NONE {
            self.instances[i.pair_next as usize].pair_prev = i.pair_prev;
        }
        let host = &mut self.hosts[i.h as usize];
        if i.host_prev != NONE {
            self.instances[i.host_prev as usize].host_next = i.host_next;
        } else {
            host.lru_head = i.host_next;
        }
        if i.host_next != NONE {
            self.instances[i.host_next as usize].host_prev = i.host_prev;
        } else {
            host.lru_tail = i.host_prev;
        }
    }

    /// Per host, up to `end`: (held KiB·s, busy KiB·s, peak held KiB).
    pub(super) fn memory(&mut self, end: u64) -> Vec<(f64, f64, u64)> {
        (0..self.nhosts).for_each(|h| self.account(h, end));
        self.hosts
            .iter()
            .map(|h| (h.held_kib_s, h.busy_kib_s, h.peak_kib))
            .collect()
    }
}
