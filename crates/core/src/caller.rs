//! Who is calling: the credentials of the call in progress on this thread,
//! for the few things a filesystem decides by the caller rather than by the
//! file (the kernel's `current_fsuid()` and `capable()` inside a
//! filesystem). ext4 uses it for its reserved blocks: only root, the
//! superblock's `s_def_resuid` or a member of `s_def_resgid` may allocate
//! the last `s_r_blocks_count` blocks.
//!
//! The VFS runs each filesystem call that may allocate (create, mkdir,
//! mknod, symlink, link, rename, write, truncate, fallocate, setattr,
//! setxattr) inside [`with`] with the task's credentials. A front end that
//! runs a call for someone else on a task of its own (the FUSE daemon does
//! a request's file I/O on one base task) names the requester first, with
//! an outer [`with`] (or [`with_groups`], when the supplementary groups
//! are to be read only if a check needs them): the outermost caller is
//! the one that counts. Work a
//! filesystem does on its own (commits, orphan recovery at mount, a
//! library caller driving a `Filesystem` directly) has no caller, as the
//! kernel's own threads have none, and [`current`] gives `None`.

use std::cell::{Cell, OnceCell};
use std::ptr;

use crate::types::Cred;

/// One [`with`] or [`with_groups`]: the caller, and where its
/// supplementary groups come from when they are not in `cred`.
struct Frame<'a> {
    cred: &'a Cred,
    /// Loads the supplementary groups on first need ([`in_group`]).
    load: Option<&'a dyn Fn() -> Vec<u32>>,
    loaded: OnceCell<Vec<u32>>,
}

std::thread_local! {
    /// The outermost running frame (a `Frame` with its lifetime erased),
    /// null outside every [`with`].
    static CURRENT: Cell<*const ()> = const { Cell::new(ptr::null()) };
}

/// Restores the outer [`with`]'s pointer when the inner one ends, by
/// return or by unwinding.
struct Restore(*const ());

impl Drop for Restore {
    fn drop(&mut self) {
        let prev = self.0;
        CURRENT.with(|c| c.set(prev));
    }
}

/// Run `f` with `cred` as this thread's caller, unless an outer [`with`]
/// named one already: that one stays (see the module doc).
pub fn with<R>(cred: &Cred, f: impl FnOnce() -> R) -> R {
    run(
        Frame {
            cred,
            load: None,
            loaded: OnceCell::new(),
        },
        f,
    )
}

/// [`with`] for a caller whose supplementary groups are not in `cred`
/// (a FUSE request carries only the uid and gid): `load` gives them, at
/// most once in this call and only when [`in_group`] needs them.
pub fn with_groups<R>(cred: &Cred, load: &dyn Fn() -> Vec<u32>, f: impl FnOnce() -> R) -> R {
    run(
        Frame {
            cred,
            load: Some(load),
            loaded: OnceCell::new(),
        },
        f,
    )
}

fn run<R>(frame: Frame<'_>, f: impl FnOnce() -> R) -> R {
    let prev = CURRENT.with(|c| {
        let prev = c.get();
        if prev.is_null() {
            c.set((&frame as *const Frame<'_>).cast());
        }
        prev
    });
    let _restore = Restore(prev);
    f()
}

/// The running frame, if any.
fn frame<R>(f: impl FnOnce(Option<&Frame<'_>>) -> R) -> R {
    let p = CURRENT.with(|c| c.get()).cast::<Frame<'_>>();
    // SAFETY: a non-null pointer was stored by a `run` still running on
    // this thread (each one puts the outer value back before it returns,
    // also when unwinding, and it cannot be left any other way), so it
    // points at that call's `Frame`, alive for its whole run, with every
    // borrow in it; the reference given to `f` does not outlive this
    // call, which that run encloses. Only shared references are made.
    let fr = unsafe { p.as_ref() };
    f(fr)
}

/// Call `f` with this thread's caller, `None` outside every [`with`].
pub fn current<R>(f: impl FnOnce(Option<&Cred>) -> R) -> R {
    frame(|fr| f(fr.map(|fr| fr.cred)))
}

/// Whether this thread's caller is in group `gid` (its gid or a
/// supplementary group, loaded if [`with_groups`] named a loader);
/// `None` outside every [`with`].
pub fn in_group(gid: u32) -> Option<bool> {
    frame(|fr| {
        let fr = fr?;
        if fr.cred.in_group(gid) {
            return Some(true);
        }
        Some(
            fr.load
                .is_some_and(|load| fr.loaded.get_or_init(load).contains(&gid)),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outermost_caller_counts_and_unwinding_restores() {
        assert!(current(|c| c.is_none()));
        let outer = Cred::user(1000, 1000);
        let inner = Cred::root();
        with(&outer, || {
            assert_eq!(current(|c| c.map(|c| c.uid)), Some(1000));
            // A task's own credentials do not replace the requester's.
            with(&inner, || {
                assert_eq!(current(|c| c.map(|c| c.uid)), Some(1000))
            });
            assert_eq!(current(|c| c.map(|c| c.uid)), Some(1000));
        });
        assert!(current(|c| c.is_none()));
        let r = std::panic::catch_unwind(|| {
            with(&inner, || panic!("unwind through with"));
        });
        assert!(r.is_err());
        assert!(current(|c| c.is_none()));
        with(&inner, || {
            assert_eq!(current(|c| c.map(|c| c.uid)), Some(0))
        });
        // Groups loaded only when asked, once per call.
        let loads = Cell::new(0);
        let load = || {
            loads.set(loads.get() + 1);
            vec![27, 44]
        };
        assert_eq!(in_group(0), None);
        with_groups(&outer, &load, || {
            assert_eq!(current(|c| c.map(|c| c.uid)), Some(1000));
            assert_eq!(in_group(1000), Some(true));
            assert_eq!(loads.get(), 0, "own gid: nothing loaded");
            assert_eq!(in_group(44), Some(true));
            assert_eq!(in_group(45), Some(false));
            assert_eq!(loads.get(), 1);
            // An inner caller does not replace the requester.
            with(&inner, || assert_eq!(in_group(27), Some(true)));
        });
        with(&outer, || assert_eq!(in_group(44), Some(false)));
        // Another thread has its own caller.
        with(&outer, || {
            std::thread::spawn(|| assert!(current(|c| c.is_none())))
                .join()
                .unwrap();
        });
    }
}
