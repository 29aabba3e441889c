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
//! an outer [`with`]: the outermost caller is the one that counts. Work a
//! filesystem does on its own (commits, orphan recovery at mount, a
//! library caller driving a `Filesystem` directly) has no caller, as the
//! kernel's own threads have none, and [`current`] gives `None`.

use std::cell::Cell;
use std::ptr;

use crate::types::Cred;

std::thread_local! {
    /// The innermost [`with`]'s credentials, null outside one.
    static CURRENT: Cell<*const Cred> = const { Cell::new(ptr::null()) };
}

/// Restores the outer [`with`]'s pointer when the inner one ends, by
/// return or by unwinding.
struct Restore(*const Cred);

impl Drop for Restore {
    fn drop(&mut self) {
        let prev = self.0;
        CURRENT.with(|c| c.set(prev));
    }
}

/// Run `f` with `cred` as this thread's caller, unless an outer [`with`]
/// named one already: that one stays (see the module doc).
pub fn with<R>(cred: &Cred, f: impl FnOnce() -> R) -> R {
    let prev = CURRENT.with(|c| {
        let prev = c.get();
        if prev.is_null() {
            c.set(cred as *const Cred);
        }
        prev
    });
    let _restore = Restore(prev);
    f()
}

/// Call `f` with this thread's caller, `None` outside every [`with`].
pub fn current<R>(f: impl FnOnce(Option<&Cred>) -> R) -> R {
    let p = CURRENT.with(|c| c.get());
    // SAFETY: a non-null pointer was stored by a `with` frame still running
    // on this thread (each one puts the outer value back before it
    // returns, also when unwinding, and `with` cannot be left any other
    // way), so it points at the `&Cred` that frame borrows for its whole
    // run; the reference given to `f` does not outlive this call, which
    // that frame encloses.
    let cred = unsafe { p.as_ref() };
    f(cred)
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
        // Another thread has its own caller.
        with(&outer, || {
            std::thread::spawn(|| assert!(current(|c| c.is_none())))
                .join()
                .unwrap();
        });
    }
}
