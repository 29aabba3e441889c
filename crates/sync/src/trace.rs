//! Cache-line recording for the conflict matrix (`scalevfs bench commute`).
//!
//! Built with the `trace-lines` feature (and not under loom), every atomic of
//! the `primitive` shim and every `ordered` lock reports the cache
//! line it uses (`addr & !63`) to this module. While recording is on for the
//! calling thread ([`start`]), the line goes into that thread's sets: a load
//! into *touches*; a store, swap, compare-exchange (failed ones too: they take
//! the line exclusively) or fetch-op into *writes* and *touches*; a lock
//! acquisition (shared ones too: a reader count is a write) into both, under
//! the lock's class name. [`stop`] returns the sets. Two operations conflict
//! when one writes a line the other touches ([`Lines::conflicts`]).
//!
//! What is seen and what is not:
//! - Seen: every atomic routed through the shim (LockRef words, sequence
//!   counters, spin locks, reference counts and flags of the core), every
//!   `ordered` lock word, and the explicit [`note_read`] / [`note_write`]
//!   hooks for shared structures whose atomics live in another crate.
//! - Data protected by a lock is covered by the lock word: any access to it
//!   takes the lock, and taking the lock is a write of the lock's line, so two
//!   operations that both touch the protected data both write the lock line.
//! - Not seen: plain (non-atomic) memory accesses outside a lock (data read
//!   under a seqcount retry, immutable data), atomics inside other crates
//!   (`Arc`'s counts, `crossbeam-epoch`'s epoch, `crossbeam-skiplist`'s
//!   nodes except where a hook stands in, the allocator), and `std` atomics the
//!   core names directly (a few global statistics).
//!
//! Outside that build the hooks do not exist; [`ENABLED`] says which build
//! this is.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::fmt;
use std::panic::Location;

/// Whether this build records lines (the `trace-lines` feature, not loom).
pub const ENABLED: bool = cfg!(all(feature = "trace-lines", not(loom)));

/// Cache-line size the recorder rounds to.
pub const LINE: usize = 64;

/// What a recorded line is, for the report.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Label {
    /// An `ordered` lock of this class.
    Lock(&'static str),
    /// An explicit hook ([`note_read`] / [`note_write`]).
    Hint(&'static str),
    /// An atomic, by the source line that used it.
    Site(&'static Location<'static>),
}

impl Label {
    /// Higher wins when two labels name one line.
    fn rank(self) -> u8 {
        match self {
            Label::Lock(_) => 2,
            Label::Hint(_) => 1,
            Label::Site(_) => 0,
        }
    }
}

impl fmt::Display for Label {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Label::Lock(c) => write!(f, "lock {c}"),
            Label::Hint(h) => f.write_str(h),
            Label::Site(l) => {
                // `crates/core/src/dcache.rs` -> `core/dcache.rs`.
                let file = l.file();
                let short = file
                    .strip_prefix("crates/")
                    .map(|s| s.replacen("/src/", "/", 1))
                    .unwrap_or_else(|| file.to_string());
                write!(f, "atomic {}:{}", short, l.line())
            }
        }
    }
}

/// The lines one recorded stretch wrote and touched, each with a label.
#[derive(Clone, Debug, Default)]
pub struct Lines {
    /// Lines written (stores, RMWs, lock acquisitions).
    pub writes: HashMap<usize, Label>,
    /// Lines read or written.
    pub touches: HashMap<usize, Label>,
    /// With [`track_transfers`] on: the writes that found their line last
    /// used (read or written) by another recording thread, by line. Each
    /// is a write that moves the line from another core's cache (or
    /// invalidates its copy): a shared-line write as BENCHMARKS.md counts
    /// them, and the ones a commuting operation should not make.
    pub transfers: HashMap<usize, (Label, u64)>,
    /// With [`track_transfers`] on: all writes recorded.
    pub all_writes: u64,
}

fn put(m: &mut HashMap<usize, Label>, line: usize, label: Label) {
    m.entry(line)
        .and_modify(|l| {
            if label.rank() > l.rank() {
                *l = label;
            }
        })
        .or_insert(label);
}

impl Lines {
    /// Lines `self` writes that `other` touches, and lines `other` writes that
    /// `self` touches: (line, label), sorted by line, each line once.
    pub fn conflicts(&self, other: &Lines) -> Vec<(usize, Label)> {
        let mut out: HashMap<usize, Label> = HashMap::new();
        for (a, b) in [(self, other), (other, self)] {
            for (&line, &l) in &a.writes {
                if let Some(&m) = b.touches.get(&line) {
                    put(&mut out, line, l);
                    put(&mut out, line, m);
                }
            }
        }
        let mut v: Vec<_> = out.into_iter().collect();
        v.sort_by_key(|&(line, _)| line);
        v
    }

    fn record(&mut self, addr: usize, label: Label, write: bool) {
        let line = addr & !(LINE - 1);
        if write {
            put(&mut self.writes, line, label);
        }
        put(&mut self.touches, line, label);
        // Relaxed: the flag is set before the recording threads start and
        // cleared after they are joined.
        if TRACK.load(std::sync::atomic::Ordering::Relaxed) {
            let moved = ownership(line, thread_tag(), write);
            if write {
                self.all_writes += 1;
                if moved {
                    let e = self.transfers.entry(line).or_insert((label, 0));
                    if label.rank() > e.0.rank() {
                        e.0 = label;
                    }
                    e.1 += 1;
                }
            }
        }
    }
}

/// Whether recording threads also track line ownership ([`Lines::transfers`]).
static TRACK: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Shards of the map line -> (the recording thread that wrote it last,
/// whether another recording thread has read it since). A `std` mutex per
/// shard, held only inside one `ownership` call with nothing else taken:
/// the recorder's own state (trace-lines build, `--traced` runs), outside
/// the lock-order table of the product's locks (docs/design.md, section 2).
const SHARDS: usize = 64;
type Owners = Vec<std::sync::Mutex<HashMap<usize, (u64, bool)>>>;
static LAST_USER: std::sync::LazyLock<Owners> =
    std::sync::LazyLock::new(|| (0..SHARDS).map(|_| Default::default()).collect());

/// This thread's tag (unique per thread for the process's life).
fn thread_tag() -> u64 {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    thread_local! {
        // Relaxed: only uniqueness is needed (one RMW per thread).
        static TAG: u64 = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }
    TAG.try_with(|t| *t).unwrap_or(0)
}

/// Note an access to `line` by thread `me`; true for a write that must take
/// the line from another thread's cache: the last writer was another
/// thread, or another thread read it since (its copy is invalidated). A
/// line seen for the first time is no one's (fresh memory, or the
/// set-up's): a first write there moves nothing.
fn ownership(line: usize, me: u64, write: bool) -> bool {
    let shard = &LAST_USER[(line / LINE) % SHARDS];
    let mut m = shard.lock().unwrap_or_else(|p| p.into_inner());
    match m.get_mut(&line) {
        None => {
            m.insert(line, (me, false));
            false
        }
        Some(st) if write => {
            let moved = st.0 != me || st.1;
            *st = (me, false);
            moved
        }
        Some(st) => {
            if st.0 != me {
                st.1 = true;
            }
            false
        }
    }
}

/// Track, from now until [`stop_tracking_transfers`], which recording
/// thread used each line last, so that [`Lines::transfers`] counts the
/// writes that take a line from another thread. Costs a mutex per recorded
/// access: for counting runs (`scalevfs bench --traced`), not timing.
pub fn track_transfers() {
    for s in LAST_USER.iter() {
        s.lock().unwrap_or_else(|p| p.into_inner()).clear();
    }
    TRACK.store(true, std::sync::atomic::Ordering::SeqCst);
}

/// End [`track_transfers`] and forget the ownership map.
pub fn stop_tracking_transfers() {
    TRACK.store(false, std::sync::atomic::Ordering::SeqCst);
    for s in LAST_USER.iter() {
        s.lock().unwrap_or_else(|p| p.into_inner()).clear();
    }
}

thread_local! {
    static ON: Cell<bool> = const { Cell::new(false) };
    static SET: RefCell<Lines> = RefCell::new(Lines::default());
}

/// Start recording on this thread (clears what an earlier stretch left).
pub fn start() {
    SET.with(|s| *s.borrow_mut() = Lines::default());
    ON.with(|o| o.set(true));
}

/// Stop recording on this thread and return what was recorded.
pub fn stop() -> Lines {
    ON.with(|o| o.set(false));
    SET.with(|s| std::mem::take(&mut *s.borrow_mut()))
}

/// Whether this thread is recording.
#[inline]
pub fn recording() -> bool {
    ON.try_with(|o| o.get()).unwrap_or(false)
}

#[inline]
fn record(addr: usize, label: Label, write: bool) {
    if !recording() {
        return;
    }
    // `try_*`: an atomic used in a thread-local destructor, or (never
    // expected) from inside the recorder, is skipped rather than a panic.
    let _ = SET.try_with(|s| {
        if let Ok(mut s) = s.try_borrow_mut() {
            s.record(addr, label, write);
        }
    });
}

/// Record a read of the line holding `addr` (atomic load).
#[inline]
#[track_caller]
pub fn atomic_read(addr: usize) {
    record(addr, Label::Site(Location::caller()), false);
}

/// Record a write of the line holding `addr` (atomic store or RMW).
#[inline]
#[track_caller]
pub fn atomic_write(addr: usize) {
    record(addr, Label::Site(Location::caller()), true);
}

/// Record a lock acquisition (a write of its word's line) of class `class`.
#[inline]
pub fn lock(addr: usize, class: &'static str) {
    record(addr, Label::Lock(class), true);
}

/// Record a read of a shared structure whose own atomics are not routed
/// through the shim (`what` names it in the report).
#[inline]
pub fn note_read<T: ?Sized>(obj: &T, what: &'static str) {
    record(
        obj as *const T as *const u8 as usize,
        Label::Hint(what),
        false,
    );
}

/// Record a write of such a structure.
#[inline]
pub fn note_write<T: ?Sized>(obj: &T, what: &'static str) {
    record(
        obj as *const T as *const u8 as usize,
        Label::Hint(what),
        true,
    );
}

/// Atomics that report to the recorder: `std`'s, wrapped, with the same API
/// (the subset the workspace uses).
#[cfg(all(feature = "trace-lines", not(loom)))]
pub(crate) mod traced {
    use std::sync::atomic as s;
    use std::sync::atomic::Ordering;

    macro_rules! traced_atomic {
        ($name:ident, $t:ty) => {
            #[doc = concat!("`std`'s `", stringify!($name), "`, reporting each access.")]
            #[derive(Default)]
            #[repr(transparent)]
            pub struct $name(s::$name);

            #[allow(missing_docs)]
            impl $name {
                pub const fn new(v: $t) -> Self {
                    $name(s::$name::new(v))
                }
                /// The `std` atomic inside (for a futex wait on it).
                pub fn as_std(&self) -> &s::$name {
                    &self.0
                }
                #[inline]
                fn addr(&self) -> usize {
                    self as *const Self as usize
                }
                #[inline]
                #[track_caller]
                pub fn load(&self, o: Ordering) -> $t {
                    super::atomic_read(self.addr());
                    self.0.load(o)
                }
                #[inline]
                #[track_caller]
                pub fn store(&self, v: $t, o: Ordering) {
                    super::atomic_write(self.addr());
                    self.0.store(v, o)
                }
                #[inline]
                #[track_caller]
                pub fn swap(&self, v: $t, o: Ordering) -> $t {
                    super::atomic_write(self.addr());
                    self.0.swap(v, o)
                }
                #[inline]
                #[track_caller]
                pub fn compare_exchange(
                    &self,
                    cur: $t,
                    new: $t,
                    ok: Ordering,
                    fail: Ordering,
                ) -> Result<$t, $t> {
                    super::atomic_write(self.addr());
                    self.0.compare_exchange(cur, new, ok, fail)
                }
                #[inline]
                #[track_caller]
                pub fn compare_exchange_weak(
                    &self,
                    cur: $t,
                    new: $t,
                    ok: Ordering,
                    fail: Ordering,
                ) -> Result<$t, $t> {
                    super::atomic_write(self.addr());
                    self.0.compare_exchange_weak(cur, new, ok, fail)
                }
                #[inline]
                #[track_caller]
                pub fn fetch_update<F: FnMut($t) -> Option<$t>>(
                    &self,
                    set: Ordering,
                    fetch: Ordering,
                    f: F,
                ) -> Result<$t, $t> {
                    super::atomic_write(self.addr());
                    self.0.fetch_update(set, fetch, f)
                }
                /// # Safety
                /// As `std`'s `from_ptr`: `ptr` is aligned, valid for `'a`
                /// and only accessed atomically meanwhile.
                #[inline]
                pub unsafe fn from_ptr<'a>(ptr: *mut $t) -> &'a Self {
                    // SAFETY: `Self` is `repr(transparent)` over `std`'s
                    // atomic, which has the layout of `$t`; the caller
                    // keeps `std::from_ptr`'s contract.
                    unsafe { &*(ptr as *const Self) }
                }
                #[inline]
                pub fn get_mut(&mut self) -> &mut $t {
                    self.0.get_mut()
                }
                #[inline]
                pub fn into_inner(self) -> $t {
                    self.0.into_inner()
                }
            }

            impl std::fmt::Debug for $name {
                fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                    std::fmt::Debug::fmt(&self.0, f)
                }
            }

            impl From<$t> for $name {
                fn from(v: $t) -> Self {
                    Self::new(v)
                }
            }
        };
    }

    macro_rules! fetch_ops {
        ($name:ident, $t:ty, $($op:ident),*) => {
            #[allow(missing_docs)]
            impl $name {
                $(
                    #[inline]
                    #[track_caller]
                    pub fn $op(&self, v: $t, o: Ordering) -> $t {
                        super::atomic_write(self.addr());
                        self.0.$op(v, o)
                    }
                )*
            }
        };
    }

    traced_atomic!(AtomicBool, bool);
    fetch_ops!(AtomicBool, bool, fetch_or, fetch_and, fetch_xor);
    traced_atomic!(AtomicU32, u32);
    fetch_ops!(
        AtomicU32, u32, fetch_add, fetch_sub, fetch_or, fetch_and, fetch_xor, fetch_max, fetch_min
    );
    traced_atomic!(AtomicU64, u64);
    fetch_ops!(
        AtomicU64, u64, fetch_add, fetch_sub, fetch_or, fetch_and, fetch_xor, fetch_max, fetch_min
    );
    traced_atomic!(AtomicUsize, usize);
    fetch_ops!(
        AtomicUsize,
        usize,
        fetch_add,
        fetch_sub,
        fetch_or,
        fetch_and,
        fetch_xor,
        fetch_max,
        fetch_min
    );
    traced_atomic!(AtomicI64, i64);
    fetch_ops!(
        AtomicI64, i64, fetch_add, fetch_sub, fetch_or, fetch_and, fetch_xor, fetch_max, fetch_min
    );

    /// `std`'s `AtomicPtr`, reporting each access.
    #[repr(transparent)]
    pub struct AtomicPtr<T>(s::AtomicPtr<T>);

    #[allow(missing_docs)]
    impl<T> AtomicPtr<T> {
        pub const fn new(p: *mut T) -> Self {
            AtomicPtr(s::AtomicPtr::new(p))
        }
        #[inline]
        fn addr(&self) -> usize {
            self as *const Self as usize
        }
        #[inline]
        #[track_caller]
        pub fn load(&self, o: Ordering) -> *mut T {
            super::atomic_read(self.addr());
            self.0.load(o)
        }
        #[inline]
        #[track_caller]
        pub fn store(&self, p: *mut T, o: Ordering) {
            super::atomic_write(self.addr());
            self.0.store(p, o)
        }
        #[inline]
        #[track_caller]
        pub fn swap(&self, p: *mut T, o: Ordering) -> *mut T {
            super::atomic_write(self.addr());
            self.0.swap(p, o)
        }
        #[inline]
        #[track_caller]
        pub fn compare_exchange(
            &self,
            cur: *mut T,
            new: *mut T,
            ok: Ordering,
            fail: Ordering,
        ) -> Result<*mut T, *mut T> {
            super::atomic_write(self.addr());
            self.0.compare_exchange(cur, new, ok, fail)
        }
        #[inline]
        #[track_caller]
        pub fn compare_exchange_weak(
            &self,
            cur: *mut T,
            new: *mut T,
            ok: Ordering,
            fail: Ordering,
        ) -> Result<*mut T, *mut T> {
            super::atomic_write(self.addr());
            self.0.compare_exchange_weak(cur, new, ok, fail)
        }
        #[inline]
        pub fn get_mut(&mut self) -> &mut *mut T {
            self.0.get_mut()
        }
        #[inline]
        pub fn into_inner(self) -> *mut T {
            self.0.into_inner()
        }
    }

    impl<T> Default for AtomicPtr<T> {
        fn default() -> Self {
            Self::new(std::ptr::null_mut())
        }
    }

    impl<T> std::fmt::Debug for AtomicPtr<T> {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            std::fmt::Debug::fmt(&self.0, f)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conflicts_are_write_touch_overlaps() {
        let mut a = Lines::default();
        let mut b = Lines::default();
        a.record(0x1000, Label::Hint("x"), true);
        a.record(0x2000, Label::Hint("shared read"), false);
        b.record(0x1010, Label::Hint("y"), false); // same line as 0x1000
        b.record(0x2000, Label::Hint("shared read"), false);
        b.record(0x3000, Label::Lock("Z"), true);
        let c = a.conflicts(&b);
        assert_eq!(c.len(), 1, "{c:?}");
        assert_eq!(c[0].0, 0x1000);
        // Read-read sharing is no conflict; symmetric.
        assert_eq!(b.conflicts(&a).len(), 1);
        assert!(a.conflicts(&Lines::default()).is_empty());
    }

    /// Ownership tracking: a write counts when another thread wrote the
    /// line last or read it since; a thread's own lines and read-only
    /// sharing count nothing. (Uses the process-wide map with addresses
    /// no other test records.)
    #[test]
    fn transfers_are_writes_that_take_a_line_from_another_thread() {
        const S: usize = 0x5ca1_0000_0000;
        const P: usize = 0x5ca1_0000_1000;
        const R: usize = 0x5ca1_0000_2000;
        track_transfers();
        let on = |f: fn() -> Lines| std::thread::spawn(f).join().unwrap();
        let h = Label::Hint("t");
        let a = on(|| {
            let mut l = Lines::default();
            let h = Label::Hint("t");
            l.record(S, h, true);
            l.record(P, h, true);
            l.record(P + 8, h, true);
            l.record(R, h, true);
            l
        });
        assert_eq!((a.all_writes, a.transfers.len()), (4, 0), "{a:?}");
        let b = on(|| {
            let mut l = Lines::default();
            let h = Label::Hint("t");
            l.record(S, h, false);
            l.record(S, h, true); // moves: A wrote it last
            l.record(S, h, true); // B's own now
            l.record(R, h, false); // read-only sharing of R
            l
        });
        assert_eq!(b.transfers.get(&S), Some(&(h, 1)), "{b:?}");
        assert_eq!(b.transfers.len(), 1);
        let a2 = on(|| {
            let mut l = Lines::default();
            let h = Label::Hint("t");
            l.record(P, h, true); // a new thread: P's writer was the first
            l.record(S, h, true); // moves: B wrote it last
            l
        });
        assert_eq!(a2.transfers.get(&S), Some(&(h, 1)), "{a2:?}");
        assert_eq!(a2.transfers.get(&P), Some(&(h, 1)));
        // A writer whose line another thread read since writes again:
        // that write invalidates the reader's copy.
        let (w1, w2) = (std::sync::Barrier::new(2), std::sync::Barrier::new(2));
        let writer = std::thread::scope(|sc| {
            let x = sc.spawn(|| {
                let mut l = Lines::default();
                let h = Label::Hint("t");
                l.record(R + 64, h, true);
                l.record(R + 64, h, true); // still its own
                w1.wait();
                w2.wait();
                l.record(R + 64, h, true); // read by the other since
                l
            });
            sc.spawn(|| {
                let mut l = Lines::default();
                w1.wait();
                l.record(R + 64, Label::Hint("t"), false);
                w2.wait();
            });
            x.join().unwrap()
        });
        assert_eq!(writer.transfers.get(&(R + 64)), Some(&(h, 1)), "{writer:?}");
        assert_eq!(writer.all_writes, 3);
        stop_tracking_transfers();
    }

    #[test]
    fn lock_label_wins() {
        let mut a = Lines::default();
        a.record(0x40, Label::Site(Location::caller()), true);
        a.record(0x40, Label::Lock("DirLock"), true);
        a.record(0x40, Label::Hint("h"), false);
        assert_eq!(a.writes[&0x40], Label::Lock("DirLock"));
        assert_eq!(a.touches[&0x40], Label::Lock("DirLock"));
    }
}
