//! Crash testing: a [`BlockDevice`] that records every write and flush
//! ([`RecordingDevice`]), and the crash states a disk could be left in
//! ([`CrashLog::states`]): every prefix of the log that ends at a flush,
//! and random subsets of the writes in flight since the last flush (a disk
//! may complete them in any order, or not at all, until the flush).
//!
//! The recorder takes no lock: each operation claims a slot of a fixed-size
//! log with one atomic add, so recording does not serialise the workload.
//! A log that fills up fails the write (EIO) rather than grow.

use std::io;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::OnceLock;

use crate::device::BlockDevice;

/// One recorded operation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Op {
    Write { off: u64, data: Vec<u8> },
    Flush,
}

/// A device that forwards to `inner` and records what reaches it.
pub struct RecordingDevice<D: BlockDevice> {
    inner: D,
    slots: Box<[OnceLock<Op>]>,
    next: AtomicUsize,
}

impl<D: BlockDevice> RecordingDevice<D> {
    /// Record at most `capacity` operations.
    pub fn new(inner: D, capacity: usize) -> Self {
        RecordingDevice {
            inner,
            slots: (0..capacity).map(|_| OnceLock::new()).collect(),
            next: AtomicUsize::new(0),
        }
    }

    fn record(&self, op: Op) -> io::Result<()> {
        let slot = self.claim()?;
        let _ = slot.set(op);
        Ok(())
    }

    /// The next slot of the log. Relaxed: the counter only hands out
    /// distinct slots (in an order consistent with happens-before, as
    /// every RMW of one atomic is); the OnceLock publishes the operation.
    fn claim(&self) -> io::Result<&OnceLock<Op>> {
        let i = self.next.fetch_add(1, Ordering::Relaxed);
        self.slots
            .get(i)
            .ok_or_else(|| io::Error::other("recording device: log full"))
    }

    /// The operations recorded so far, in the order they claimed slots
    /// (a slot claimed but not yet filled by a racing writer is left out).
    pub fn ops(&self) -> Vec<Op> {
        // Relaxed: a racing operation may or may not be seen, either is fine.
        let n = self.next.load(Ordering::Relaxed).min(self.slots.len());
        self.slots[..n]
            .iter()
            .filter_map(|s| s.get().cloned())
            .collect()
    }

    /// The writes recorded so far (flushes not counted): where a crash
    /// test notes each fsync point.
    pub fn writes(&self) -> usize {
        self.ops()
            .iter()
            .filter(|o| !matches!(o, Op::Flush))
            .count()
    }

    /// The wrapped device.
    pub fn inner(&self) -> &D {
        &self.inner
    }
}

impl<D: BlockDevice> BlockDevice for RecordingDevice<D> {
    fn read_at(&self, off: u64, buf: &mut [u8]) -> io::Result<()> {
        self.inner.read_at(off, buf)
    }
    fn write_at(&self, off: u64, buf: &[u8]) -> io::Result<()> {
        self.inner.write_at(off, buf)?;
        self.record(Op::Write {
            off,
            data: buf.to_vec(),
        })
    }
    fn write_vectored_at(&self, off: u64, bufs: &[&[u8]]) -> io::Result<()> {
        // One recorded write, as `pwritev` issues one request.
        self.write_at(off, &bufs.concat())
    }
    fn flush(&self) -> io::Result<()> {
        // A flush makes durable what completed before it began: its place
        // in the log is taken first, so a write that completes (and is
        // recorded) while it runs comes after it, still in flight. Taken
        // after, such a write counted as flushed: a filesystem relying on
        // another thread's flush for it would have passed. A failed flush
        // leaves its slot empty (`ops` skips it): it made nothing durable.
        let slot = self.claim()?;
        self.inner.flush()?;
        let _ = slot.set(Op::Flush);
        Ok(())
    }
    fn size(&self) -> u64 {
        self.inner.size()
    }
    fn kind(&self) -> &'static str {
        self.inner.kind()
    }
    fn release_claim(&self) {
        self.inner.release_claim()
    }
}

/// A recorded run: the image before it and the operations.
#[derive(Clone, Debug)]
pub struct CrashLog {
    pub base: Vec<u8>,
    pub ops: Vec<Op>,
}

/// One state the disk may be in after a crash.
#[derive(Clone, Debug)]
pub struct CrashState {
    /// Writes of completed epochs (before the last flush) applied.
    pub flushed_writes: usize,
    /// Which writes of the epoch in flight were applied (indices within it).
    pub in_flight: Vec<usize>,
    pub image: Vec<u8>,
}

fn apply(img: &mut [u8], op: &Op) {
    if let Op::Write { off, data } = op {
        let Ok(start) = usize::try_from(*off) else {
            return;
        };
        let end = start.saturating_add(data.len()).min(img.len());
        if start < end {
            img[start..end].copy_from_slice(&data[..end - start]);
        }
    }
}

impl CrashLog {
    /// The writes between flushes: epoch i holds the writes after the
    /// i-th flush (the last epoch may be unflushed).
    pub fn epochs(&self) -> Vec<Vec<&Op>> {
        let mut out = vec![Vec::new()];
        for op in &self.ops {
            match op {
                Op::Flush => out.push(Vec::new()),
                w => out.last_mut().expect("never empty").push(w),
            }
        }
        out
    }

    /// Crash states: for each epoch, the state with every earlier epoch
    /// applied and none of its own writes (the crash right after a flush),
    /// the state with all of its writes (the flush completing), and up to
    /// `random` states with a random subset of its writes (in log order),
    /// drawn from `seed`. Calls `f` for each; stops early when `f` returns
    /// false. Returns the number of states produced.
    pub fn states(
        &self,
        random: usize,
        seed: u64,
        f: &mut dyn FnMut(&CrashState) -> bool,
    ) -> usize {
        let mut rng = seed | 1;
        let mut next = move || {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng
        };
        let epochs = self.epochs();
        let mut base = self.base.clone();
        let mut flushed = 0;
        let mut n = 0;
        for epoch in &epochs {
            let mut emit = |subset: Vec<usize>, n: &mut usize| {
                let mut image = base.clone();
                for &i in &subset {
                    apply(&mut image, epoch[i]);
                }
                *n += 1;
                f(&CrashState {
                    flushed_writes: flushed,
                    in_flight: subset,
                    image,
                })
            };
            if !emit(Vec::new(), &mut n) {
                return n;
            }
            if !epoch.is_empty() {
                if !emit((0..epoch.len()).collect(), &mut n) {
                    return n;
                }
                for _ in 0..random {
                    let subset: Vec<usize> = (0..epoch.len()).filter(|_| next() % 2 == 0).collect();
                    if !emit(subset, &mut n) {
                        return n;
                    }
                }
            }
            for op in epoch {
                apply(&mut base, op);
            }
            flushed += epoch.len();
        }
        n
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::MemDevice;

    /// A device whose flush waits until `go` is set, telling `started`.
    struct SlowFlush {
        inner: MemDevice,
        started: std::sync::atomic::AtomicBool,
        go: std::sync::atomic::AtomicBool,
    }

    impl BlockDevice for SlowFlush {
        fn read_at(&self, off: u64, buf: &mut [u8]) -> io::Result<()> {
            self.inner.read_at(off, buf)
        }
        fn write_at(&self, off: u64, buf: &[u8]) -> io::Result<()> {
            self.inner.write_at(off, buf)
        }
        fn flush(&self) -> io::Result<()> {
            self.started.store(true, Ordering::SeqCst);
            while !self.go.load(Ordering::SeqCst) {
                std::thread::yield_now();
            }
            Ok(())
        }
        fn size(&self) -> u64 {
            self.inner.size()
        }
    }

    /// A write that completes while another thread's flush runs is after
    /// that flush in the log (in flight, not flushed by it): it was
    /// recorded before, because a flush took its place when it finished.
    #[test]
    fn a_write_during_a_flush_comes_after_it() {
        let d = std::sync::Arc::new(RecordingDevice::new(
            SlowFlush {
                inner: MemDevice::new(vec![0; 16]),
                started: Default::default(),
                go: Default::default(),
            },
            16,
        ));
        let flusher = {
            let d = d.clone();
            std::thread::spawn(move || d.flush().unwrap())
        };
        while !d.inner().started.load(Ordering::SeqCst) {
            std::thread::yield_now();
        }
        d.write_at(0, &[9]).unwrap();
        d.inner().go.store(true, Ordering::SeqCst);
        flusher.join().unwrap();
        assert_eq!(
            d.ops(),
            vec![
                Op::Flush,
                Op::Write {
                    off: 0,
                    data: vec![9]
                }
            ]
        );
    }

    #[test]
    fn records_and_generates_every_flush_prefix_and_subsets() {
        let d = RecordingDevice::new(MemDevice::new(vec![0; 16]), 16);
        let base = vec![0u8; 16];
        d.write_at(0, &[1]).unwrap();
        d.write_at(1, &[2]).unwrap();
        d.flush().unwrap();
        d.write_at(2, &[3]).unwrap();
        d.write_at(0, &[4]).unwrap();
        d.flush().unwrap();
        d.write_at(3, &[5]).unwrap();
        let log = CrashLog { base, ops: d.ops() };
        assert_eq!(log.ops.len(), 7);
        assert_eq!(
            log.epochs().iter().map(Vec::len).collect::<Vec<_>>(),
            [2, 2, 1]
        );
        let mut seen = Vec::new();
        let n = log.states(4, 7, &mut |s| {
            seen.push(s.clone());
            true
        });
        assert_eq!(n, seen.len());
        // Per epoch: none, all, 4 random.
        assert_eq!(n, 3 * 6);
        for s in &seen {
            let img = &s.image;
            let has = |i: usize| s.in_flight.contains(&i);
            // What was flushed is there unless an in-flight write replaced
            // it; an in-flight write is there exactly when chosen.
            match s.flushed_writes {
                0 => {
                    assert_eq!(img[0], if has(0) { 1 } else { 0 });
                    assert_eq!(img[1], if has(1) { 2 } else { 0 });
                }
                2 => {
                    assert_eq!(img[0], if has(1) { 4 } else { 1 });
                    assert_eq!(img[1], 2);
                    assert_eq!(img[2], if has(0) { 3 } else { 0 });
                }
                4 => {
                    assert_eq!(&img[..3], &[4, 2, 3]);
                    assert_eq!(img[3], if has(0) { 5 } else { 0 });
                }
                x => panic!("flushed {x}"),
            }
            assert!(img[4..].iter().all(|&x| x == 0));
        }
        // The final state of the run is among them, as is the empty one.
        assert!(seen.iter().any(|s| s.image[..4] == [4, 2, 3, 5]));
        assert!(seen.iter().any(|s| s.image == vec![0; 16]));
        // Random subsets differ from none/all somewhere.
        assert!(seen
            .iter()
            .any(|s| s.in_flight.len() == 1 && s.flushed_writes < 4));
        // The inner device saw every write.
        let mut now = vec![0u8; 4];
        d.inner().read_at(0, &mut now).unwrap();
        assert_eq!(now, [4, 2, 3, 5]);
    }

    #[test]
    fn a_full_log_fails_the_write() {
        let d = RecordingDevice::new(MemDevice::new(vec![0; 4]), 1);
        d.write_at(0, &[1]).unwrap();
        assert!(d.write_at(1, &[1]).is_err());
        assert!(d.flush().is_err());
        assert_eq!(d.ops().len(), 1);
    }
}
