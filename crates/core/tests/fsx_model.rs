//! fsx-style property test: random read / write / pread / pwrite / truncate /
//! lseek / fallocate (allocate, keep-size, punch) / SEEK_DATA / SEEK_HOLE
//! sequences on one file, checked after every step against a byte-vector
//! model. Single-threaded, many seeds, a few million operations in total.
//!
//! The model tracks the contents and size only; SEEK_DATA/SEEK_HOLE are
//! checked for consistency (data offsets hold what the model says, holes read
//! as zeros) rather than exact page placement.

use scalevfs::io::*;
use scalevfs::*;

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        // xorshift64*
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

const MAX: u64 = 300_000;

fn run(seed: u64, ops: usize) {
    let vfs = Vfs::new();
    let t = vfs.root_task();
    let fd = t.open("/f", O_CREAT | O_RDWR, 0o644).unwrap();
    let mut model: Vec<u8> = Vec::new();
    let mut pos: u64 = 0;
    let mut r = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
    let mut buf = vec![0u8; 70_000];
    for step in 0..ops {
        let op = r.below(100);
        // Mostly small ops near page boundaries, sometimes large ones.
        let off = if r.below(4) == 0 {
            r.below(MAX)
        } else {
            (r.below(MAX / 4096) * 4096)
                .wrapping_add(r.below(64))
                .wrapping_sub(32)
                % MAX
        };
        let len = if r.below(8) == 0 {
            r.below(65_536)
        } else {
            r.below(300)
        } as usize;
        let ctx = || format!("seed {seed} step {step} op {op} off {off} len {len}");
        match op {
            0..=24 => {
                // pwrite
                let data: Vec<u8> = (0..len).map(|_| (r.next() % 255 + 1) as u8).collect();
                assert_eq!(t.pwrite(fd, &data, off as i64).unwrap(), len, "{}", ctx());
                let end = off as usize + len;
                if len > 0 && model.len() < end {
                    model.resize(end, 0);
                }
                if len > 0 {
                    model[off as usize..off as usize + len].copy_from_slice(&data);
                }
            }
            25..=44 => {
                // pread
                let n = t.pread(fd, &mut buf[..len], off as i64).unwrap();
                let want = model.len().saturating_sub(off as usize).min(len);
                assert_eq!(n, want, "{}", ctx());
                assert!(
                    n == 0 || buf[..n] == model[off as usize..off as usize + n],
                    "{}",
                    ctx()
                );
            }
            45..=54 => {
                // truncate
                let size = if r.below(3) == 0 {
                    r.below(4096 * 3)
                } else {
                    r.below(MAX)
                };
                t.ftruncate(fd, size as i64).unwrap();
                model.resize(size as usize, 0);
            }
            55..=64 => {
                // lseek + read / write on the position
                let whence = r.below(3) as u32;
                let o = r.below(MAX) as i64
                    - if whence == SEEK_SET {
                        0
                    } else {
                        (MAX / 2) as i64
                    };
                let base = match whence {
                    SEEK_SET => 0,
                    SEEK_CUR => pos as i64,
                    _ => model.len() as i64,
                };
                let got = t.lseek(fd, o, whence);
                if base + o < 0 {
                    assert_eq!(got, Err(Errno::EINVAL), "{}", ctx());
                } else {
                    pos = (base + o) as u64;
                    assert_eq!(got, Ok(pos), "{}", ctx());
                }
                if pos < MAX && r.below(2) == 0 {
                    let n = t.read(fd, &mut buf[..len]).unwrap();
                    let want = model.len().saturating_sub(pos as usize).min(len);
                    assert_eq!(n, want, "{}", ctx());
                    assert!(
                        n == 0 || buf[..n] == model[pos as usize..pos as usize + n],
                        "{}",
                        ctx()
                    );
                    pos += n as u64;
                } else if pos < MAX {
                    let data: Vec<u8> = (0..len).map(|_| (r.next() % 255 + 1) as u8).collect();
                    assert_eq!(t.write(fd, &data).unwrap(), len, "{}", ctx());
                    let end = pos as usize + len;
                    if len > 0 && model.len() < end {
                        model.resize(end, 0);
                    }
                    if len > 0 {
                        model[pos as usize..end].copy_from_slice(&data);
                    }
                    pos += len as u64;
                }
            }
            65..=74 => {
                // fallocate: allocate (maybe keep size) or punch
                let l = len.max(1) as i64;
                match r.below(3) {
                    0 => {
                        t.fallocate(fd, 0, off as i64, l).unwrap();
                        let end = off as usize + l as usize;
                        if model.len() < end {
                            model.resize(end, 0);
                        }
                    }
                    1 => t.fallocate(fd, FALLOC_FL_KEEP_SIZE, off as i64, l).unwrap(),
                    _ => {
                        t.fallocate(
                            fd,
                            FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
                            off as i64,
                            l,
                        )
                        .unwrap();
                        let a = (off as usize).min(model.len());
                        let b = (off as usize + l as usize).min(model.len());
                        model[a..b].fill(0);
                    }
                }
            }
            75..=84 => {
                // SEEK_DATA / SEEK_HOLE consistency.
                let size = model.len() as u64;
                let data = r.below(2) == 0;
                let got = t.lseek(fd, off as i64, if data { SEEK_DATA } else { SEEK_HOLE });
                pos = t.lseek(fd, 0, SEEK_CUR).unwrap();
                if off >= size {
                    assert_eq!(got, Err(Errno::ENXIO), "{}", ctx());
                    continue;
                }
                match got {
                    Ok(p) if data => {
                        assert!(p >= off && p < size, "{}", ctx());
                        // Everything skipped is zero.
                        assert!(
                            model[off as usize..p as usize].iter().all(|&b| b == 0),
                            "{}",
                            ctx()
                        );
                    }
                    Ok(p) => {
                        assert!(p >= off && p <= size, "{}", ctx());
                        // A hole reads as zeros up to the next page or EOF.
                        let e = (p.div_ceil(4096) * 4096).min(size).max(p);
                        assert!(
                            model[p as usize..e as usize].iter().all(|&b| b == 0),
                            "{}",
                            ctx()
                        );
                    }
                    Err(Errno::ENXIO) if data => {
                        assert!(model[off as usize..].iter().all(|&b| b == 0), "{}", ctx());
                    }
                    Err(e) => panic!("{}: {e:?}", ctx()),
                }
            }
            _ => {
                // Whole-file check, plus size and blocks sanity.
                let st = t.fstat(fd).unwrap();
                assert_eq!(st.size, model.len() as u64, "{}", ctx());
                let mut all = vec![0u8; model.len()];
                assert_eq!(t.pread(fd, &mut all, 0).unwrap(), model.len(), "{}", ctx());
                assert!(all == model, "{}", ctx());
            }
        }
    }
    t.close(fd).unwrap();
}

#[test]
fn fsx_random_ops_match_model() {
    let start = std::time::Instant::now();
    let seeds = 200u64;
    let ops = 10_000;
    for seed in 0..seeds {
        run(seed, ops);
    }
    eprintln!("fsx: {} ops in {:?}", seeds as usize * ops, start.elapsed());
}
