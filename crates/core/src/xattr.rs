//! Extended attributes: Linux's name spaces, POSIX ACL validation, and the
//! store memfs keeps per inode (a skip list read without locks). The
//! `*xattr` calls of a [`crate::Task`] and the permission rules below are in
//! `xattr_calls.rs`, above the `Task`.
//!
//! What the VFS decides (as `fs/xattr.c` does) and what the filesystem
//! stores: names are checked here (empty or over 255 bytes: ERANGE; values
//! over 64 KiB: E2BIG), then `xattr_permission`'s rules (immutable or
//! append-only: EPERM for a change; `trusted.*` needs root: EPERM to change,
//! ENODATA to read; `user.*` only on regular files and directories: EPERM to
//! change, ENODATA to read, and not on someone else's sticky directory;
//! `user.*` and unknown names need read or write permission on the inode),
//! then the capability rule for `security.*` (root to change), then the
//! name space: `user.`, `trusted.`, `security.` with a non-empty rest, and
//! `system.posix_acl_access`/`_default`; anything else is EOPNOTSUPP.
//! Writes take the inode's data lock exclusively (serialising them with
//! each other and with chattr, as Linux's inode lock does); reads take no
//! lock.
//!
//! POSIX ACLs are stored and returned, in the `posix_acl_xattr` format
//! (version 2, then 8-byte entries); a value that is not a valid ACL is
//! EINVAL (EOPNOTSUPP for another version, as Linux), and an empty value
//! removes the ACL. Setting the access ACL updates the mode's permission
//! bits as Linux does (an ACL the mode says in full is not stored at all).
//! ACLs are enforced by the permission checks (`Inode::permission_ok`), a
//! chmod rewrites the stored access ACL's mask or group entry, and new
//! files and directories inherit a directory's default ACL (`namei.rs`).

use crossbeam_epoch::{self as epoch, Atomic, Owned};
use crossbeam_skiplist::SkipMap;
use scalevfs_sync::primitive::{AtomicU64, Ordering};

use crate::errno::{Errno, VfsResult};

/// `setxattr` flag: fail with EEXIST if the attribute exists.
pub const XATTR_CREATE: u32 = 1;
/// `setxattr` flag: fail with ENODATA unless the attribute exists.
pub const XATTR_REPLACE: u32 = 2;
/// Longest name, prefix included (Linux's XATTR_NAME_MAX).
pub const XATTR_NAME_MAX: usize = 255;
/// Largest value (XATTR_SIZE_MAX).
pub const XATTR_SIZE_MAX: usize = 65536;
/// Largest name list `listxattr` returns (XATTR_LIST_MAX).
pub const XATTR_LIST_MAX: usize = 65536;

/// The access ACL's name.
pub const POSIX_ACL_ACCESS: &[u8] = b"system.posix_acl_access";
/// The default ACL's name (directories only).
pub const POSIX_ACL_DEFAULT: &[u8] = b"system.posix_acl_default";

pub(crate) const MAY_READ: u32 = 4;
pub(crate) const MAY_WRITE: u32 = 2;

/// The name spaces the VFS knows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum XattrNs {
    User,
    Trusted,
    Security,
    /// `system.posix_acl_access` or `system.posix_acl_default`.
    Acl {
        default: bool,
    },
    /// Any other name (`system.foo`, `foo.bar`): EOPNOTSUPP once the
    /// permission checks pass.
    Unknown,
}

impl XattrNs {
    /// The name space of a full name.
    pub fn of(name: &[u8]) -> XattrNs {
        if name.starts_with(b"user.") {
            XattrNs::User
        } else if name.starts_with(b"trusted.") {
            XattrNs::Trusted
        } else if name.starts_with(b"security.") {
            XattrNs::Security
        } else if name == POSIX_ACL_ACCESS {
            XattrNs::Acl { default: false }
        } else if name == POSIX_ACL_DEFAULT {
            XattrNs::Acl { default: true }
        } else {
            XattrNs::Unknown
        }
    }

    /// `xattr_resolve_name`: EOPNOTSUPP for an unknown prefix, EINVAL for
    /// a known prefix with nothing after it.
    pub(crate) fn resolve(self, name: &[u8]) -> VfsResult<()> {
        let prefix = match self {
            XattrNs::User => 5,
            XattrNs::Trusted => 8,
            XattrNs::Security => 9,
            XattrNs::Acl { .. } => return Ok(()),
            XattrNs::Unknown => return Err(Errno::EOPNOTSUPP),
        };
        if name.len() == prefix {
            return Err(Errno::EINVAL);
        }
        Ok(())
    }
}

/// The checks on a name that come before the path lookup.
pub(crate) fn check_name(name: &[u8]) -> VfsResult<()> {
    if name.is_empty() || name.len() > XATTR_NAME_MAX || name.contains(&0) {
        return Err(Errno::ERANGE);
    }
    Ok(())
}

// ---------------------------------------------------------------------
// POSIX ACLs (the xattr format of include/uapi/linux/posix_acl_xattr.h)
// ---------------------------------------------------------------------

const ACL_VERSION: u32 = 2;
/// ACL entry tags (`AclEntry::tag`).
pub const ACL_USER_OBJ: u16 = 0x01;
pub const ACL_USER: u16 = 0x02;
pub const ACL_GROUP_OBJ: u16 = 0x04;
pub const ACL_GROUP: u16 = 0x08;
pub const ACL_MASK: u16 = 0x10;
pub const ACL_OTHER: u16 = 0x20;
/// The id of an entry that names no user or group.
pub const ACL_UNDEFINED_ID: u32 = u32::MAX;

/// One ACL entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AclEntry {
    pub tag: u16,
    pub perm: u16,
    pub id: u32,
}

/// Parse and validate an ACL in xattr form (`parse_acl_format` then
/// `validate_acl`): `Ok(None)` for an empty ACL (a header only), which
/// means "no ACL".
pub fn parse_acl(v: &[u8]) -> VfsResult<Option<Vec<AclEntry>>> {
    let acl = parse_acl_format(v)?;
    if let Some(a) = &acl {
        validate_acl(a)?;
    }
    Ok(acl)
}

/// An ACL in xattr form, as `posix_acl_from_xattr` reads it: `Ok(None)`
/// for a header only; EOPNOTSUPP for another version; EINVAL for a short
/// header, a size that is not whole entries, an unknown tag, or a named
/// user or group of id -1. The entries' order and permission bits are
/// `validate_acl`'s (Linux checks them later, after the owner check).
pub fn parse_acl_format(v: &[u8]) -> VfsResult<Option<Vec<AclEntry>>> {
    if v.len() < 4 {
        return Err(Errno::EINVAL);
    }
    // As posix_acl_from_xattr: another version is EOPNOTSUPP, not EINVAL.
    if u32::from_le_bytes([v[0], v[1], v[2], v[3]]) != ACL_VERSION {
        return Err(Errno::EOPNOTSUPP);
    }
    let body = &v[4..];
    if !body.len().is_multiple_of(8) {
        return Err(Errno::EINVAL);
    }
    if body.is_empty() {
        return Ok(None);
    }
    // At most XATTR_SIZE_MAX / 8 entries: the value's size is checked first.
    let mut out = Vec::with_capacity(body.len() / 8);
    for e in body.chunks_exact(8) {
        let tag = u16::from_le_bytes([e[0], e[1]]);
        let perm = u16::from_le_bytes([e[2], e[3]]);
        let id = u32::from_le_bytes([e[4], e[5], e[6], e[7]]);
        let id = match tag {
            ACL_USER_OBJ | ACL_GROUP_OBJ | ACL_MASK | ACL_OTHER => ACL_UNDEFINED_ID,
            // An id of -1 maps to no user or group (make_kuid fails).
            ACL_USER | ACL_GROUP if id != ACL_UNDEFINED_ID => id,
            _ => return Err(Errno::EINVAL),
        };
        out.push(AclEntry { tag, perm, id });
    }
    Ok(Some(out))
}

/// `posix_acl_valid`: permission bits rwx only; the entries in tag order
/// (owner, named users, owning group, named groups, mask, other), one
/// owner, owning group and other, and a mask where there are named
/// entries. Like Linux 6.x, neither the order of named entries' ids nor
/// duplicates are checked (the first match wins when permissions are
/// checked).
pub fn validate_acl(acl: &[AclEntry]) -> VfsResult<()> {
    let mut state = ACL_USER_OBJ;
    let mut needs_mask = false;
    for e in acl {
        if e.perm & !7 != 0 {
            return Err(Errno::EINVAL);
        }
        match e.tag {
            ACL_USER_OBJ if state == ACL_USER_OBJ => state = ACL_USER,
            ACL_USER if state == ACL_USER => needs_mask = true,
            ACL_GROUP_OBJ if state == ACL_USER => state = ACL_GROUP,
            ACL_GROUP if state == ACL_GROUP => needs_mask = true,
            ACL_MASK if state == ACL_GROUP => state = ACL_OTHER,
            ACL_OTHER if state == ACL_OTHER || (state == ACL_GROUP && !needs_mask) => state = 0,
            _ => return Err(Errno::EINVAL),
        }
    }
    if state != 0 {
        return Err(Errno::EINVAL);
    }
    Ok(())
}

/// An ACL in xattr form.
pub fn encode_acl(acl: &[AclEntry]) -> Vec<u8> {
    let mut v = Vec::with_capacity(4 + acl.len() * 8);
    v.extend_from_slice(&ACL_VERSION.to_le_bytes());
    for e in acl {
        v.extend_from_slice(&e.tag.to_le_bytes());
        v.extend_from_slice(&e.perm.to_le_bytes());
        v.extend_from_slice(&e.id.to_le_bytes());
    }
    v
}

/// `posix_acl_equiv_mode`: the permission bits the ACL gives (owner from
/// USER_OBJ, group from MASK if present else GROUP_OBJ, other from OTHER),
/// and whether the mode says all of it (no named entries and no mask).
pub fn acl_mode(acl: &[AclEntry]) -> (u32, bool) {
    let (mut mode, mut equiv) = (0u32, true);
    for e in acl {
        let p = u32::from(e.perm);
        match e.tag {
            ACL_USER_OBJ => mode |= p << 6,
            ACL_GROUP_OBJ => mode |= p << 3,
            ACL_MASK => {
                mode = (mode & !0o070) | (p << 3);
                equiv = false;
            }
            ACL_OTHER => mode |= p,
            _ => equiv = false,
        }
    }
    (mode, equiv)
}

/// Linux's `posix_acl_permission` for a caller who is not the owner (the
/// owner is decided by the mode's owner bits before an ACL is looked at):
/// `want` is a combination of R_OK/W_OK/X_OK. A named-user entry decides
/// alone; otherwise every group entry the caller is in (the owning group
/// through GROUP_OBJ) is tried and any one that grants `want` does; a
/// caller in some group that none grants is refused, one in no group gets
/// OTHER. Named users and all group entries are limited by MASK.
pub(crate) fn acl_permits(
    acl: &[AclEntry],
    owner_gid: u32,
    cred: &crate::types::Cred,
    want: u32,
) -> bool {
    let want = want & 7;
    let mask = acl
        .iter()
        .find(|e| e.tag == ACL_MASK)
        .map_or(7, |e| u32::from(e.perm));
    let masked = |e: &AclEntry| u32::from(e.perm) & mask & want == want;
    let mut in_some_group = false;
    for e in acl {
        match e.tag {
            ACL_USER if e.id == cred.uid => return masked(e),
            ACL_GROUP_OBJ | ACL_GROUP => {
                let gid = if e.tag == ACL_GROUP_OBJ {
                    owner_gid
                } else {
                    e.id
                };
                if cred.in_group(gid) {
                    if masked(e) {
                        return true;
                    }
                    in_some_group = true;
                }
            }
            ACL_OTHER => return !in_some_group && u32::from(e.perm) & want == want,
            _ => {}
        }
    }
    false
}

/// Linux's `posix_acl_create_masq`: fit the default ACL `acl` (a copy, to
/// become the new inode's access ACL) and the requested `mode` to each
/// other. Returns the new mode (bits outside 0o777 kept) and whether the
/// ACL says more than the mode (then it is stored as the access ACL).
pub(crate) fn acl_create_masq(acl: &mut [AclEntry], mode: u32) -> (u32, bool) {
    let mut m = mode & 0o777;
    let mut not_equiv = false;
    let (mut group_obj, mut mask_obj) = (None, None);
    for (i, e) in acl.iter_mut().enumerate() {
        let p = u32::from(e.perm);
        match e.tag {
            ACL_USER_OBJ => {
                let p = p & ((m >> 6) | !0o7);
                e.perm = (p & 7) as u16;
                m &= (p << 6) | !0o700;
            }
            ACL_USER | ACL_GROUP => not_equiv = true,
            ACL_GROUP_OBJ => group_obj = Some(i),
            ACL_OTHER => {
                let p = p & (m | !0o7);
                e.perm = (p & 7) as u16;
                m &= p | !0o7;
            }
            ACL_MASK => {
                mask_obj = Some(i);
                not_equiv = true;
            }
            _ => {}
        }
    }
    // parse_acl guarantees a GROUP_OBJ entry; without one nothing changes.
    if let Some(i) = mask_obj.or(group_obj) {
        let e = &mut acl[i];
        let p = u32::from(e.perm) & ((m >> 3) | !0o7);
        e.perm = (p & 7) as u16;
        m &= (p << 3) | !0o070;
    }
    ((mode & !0o777) | m, not_equiv)
}

/// Linux's `posix_acl_chmod` (`__posix_acl_chmod`): after a chmod the
/// access ACL's owner, group class (MASK if present, else GROUP_OBJ) and
/// other entries take the new mode's bits.
pub(crate) fn acl_chmod(acl: &mut [AclEntry], mode: u32) {
    let has_mask = acl.iter().any(|e| e.tag == ACL_MASK);
    for e in acl.iter_mut() {
        let bits = match e.tag {
            ACL_USER_OBJ => mode >> 6,
            ACL_GROUP_OBJ if !has_mask => mode >> 3,
            ACL_MASK => mode >> 3,
            ACL_OTHER => mode,
            _ => continue,
        };
        e.perm = (bits & 7) as u16;
    }
}

// ---------------------------------------------------------------------
// memfs's store
// ---------------------------------------------------------------------

/// The space an attribute is charged (Linux's `simple_xattr_space`: 40
/// for the entry, then the full name and the value). Measured on the host
/// tmpfs (Linux 6.18, `nr_inodes=10`): after eight attributes of 900
/// bytes, 13 empty ones fit and not 14, which only 38 to 40 bytes of
/// overhead give; the 33 charged before let more in.
pub(crate) fn xattr_space(name: &[u8], value: &[u8]) -> u64 {
    (40 + name.len() + value.len()) as u64
}

/// Name -> value (values shared with readers that copy them out).
type XattrMap = SkipMap<Box<[u8]>, Value>;

/// One attribute's value, replaced in place: a replace swaps the pointer
/// here (readers see the old value or the new one), where reinserting the
/// name in the skip list would unlink the old entry before linking the new
/// one, and a reader in between would find no attribute at all (xfstests
/// generic/037: "replacing a xattr's value is an atomic operation").
struct Value(Atomic<Box<[u8]>>);

impl Value {
    fn new(v: &[u8]) -> Value {
        Value(Atomic::new(Box::from(v)))
    }

    /// The bytes, under `g`.
    fn get<'g>(&self, g: &'g epoch::Guard) -> &'g [u8] {
        // Acquire: pairs with the Release in `replace` (and the publication
        // of a new entry by the skip list).
        let p = self.0.load(Ordering::Acquire, g);
        // SAFETY: never null (set at construction, swapped for another
        // value), and freed only after a grace period `g` holds off.
        unsafe { p.deref() }
    }

    /// Put `v` in place; the old bytes go after a grace period. The caller
    /// serialises writers (`XattrStore::change`).
    fn replace(&self, v: &[u8], g: &epoch::Guard) {
        // Release: publish the new bytes to readers (`get`).
        let old = self.0.swap(Owned::new(Box::from(v)), Ordering::Release, g);
        // SAFETY: unreachable now; pinned readers are waited for.
        unsafe { g.defer_destroy(old) };
    }
}

impl Drop for Value {
    fn drop(&mut self) {
        // The skip list drops a value when its entry is reclaimed, after a
        // grace period of its own; a reader that loaded the bytes under its
        // guard may still use them, so they go after one more.
        // Runs inside a collection (limbo.rs, "Pins in frees").
        let pin = crate::limbo::pin();
        // Relaxed: `&mut self`, nobody else reaches this cell any more.
        let p = self
            .0
            .swap(epoch::Shared::null(), Ordering::Relaxed, pin.loads());
        if !p.is_null() {
            // SAFETY: unreachable from the map; freed once, after readers.
            unsafe { pin.defer_destroy(p) };
        }
    }
}

/// One inode's attributes: a concurrent skip list (name -> value), made on
/// the first set and kept until the inode goes. Readers take no lock;
/// writers are serialised by the inode's data lock (see
/// `Task::xattr_change`), so a check-then-insert is not raced.
#[derive(Default)]
pub(crate) struct XattrStore {
    map: Atomic<XattrMap>,
    /// The space charged for the attributes (`space`), kept by the
    /// serialised writers so that the inode's drop needs no walk of the
    /// map (a walk pins, and a drop may run inside the epoch's collection:
    /// limbo.rs, "Pins in frees").
    charged: AtomicU64,
}

impl std::fmt::Debug for XattrStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("XattrStore").finish_non_exhaustive()
    }
}

/// The filesystem-wide space the store charges: tmpfs's `free_ispace`,
/// one pool of `max_units` × 1 KiB (`BOGO_INODE_SIZE`) shared by inodes
/// (1 KiB each: memfs's `nr_inodes` units) and attributes (their bytes,
/// `xattr_space`). The attributes' bytes are counted here and held in
/// the inode counter as whole units: `ceil(bytes / 1 KiB)` of them, which
/// gives exactly tmpfs's limit (`inodes × 1024 + bytes <= max × 1024`
/// holds iff `inodes + ceil(bytes / 1024) <= max`). So attributes leave
/// fewer inodes, and inodes leave less room for attributes, as on tmpfs
/// (before, each had a budget of its own: `nr_inodes=10` took 10
/// attributes of 900 bytes and 8 more files; tmpfs, 8 attributes and no
/// file).
#[derive(Debug)]
pub(crate) struct XattrBudget<'a> {
    pub(crate) bytes: &'a AtomicU64,
    pub(crate) units: &'a crate::percpu::LimitedCounter,
    pub(crate) max_units: u64,
}

/// tmpfs's `BOGO_INODE_SIZE`: the bytes of its inode space one inode takes.
const UNIT: u64 = 1024;

/// The whole units `bytes` of attributes hold.
fn units_of(bytes: u64) -> u64 {
    bytes.div_ceil(UNIT)
}

impl XattrBudget<'_> {
    /// Charge `n` more bytes: the units they need first (ENOSPC where the
    /// pool has none), then the byte count, by compare-exchange so that
    /// the units each change takes or gives back are those between the
    /// count it replaced and the one it stored (concurrent changes add up
    /// to the difference of their first and last counts).
    pub(crate) fn charge(&self, n: u64) -> VfsResult<()> {
        loop {
            // Relaxed (all here): the counts publish no data; the
            // compare-exchange orders the byte count with itself.
            let old = self.bytes.load(Ordering::Relaxed);
            let new = old.checked_add(n).ok_or(Errno::ENOSPC)?;
            let need = units_of(new) - units_of(old);
            // At most a 64 KiB value's worth (XATTR_SIZE_MAX) of units.
            let mut got = 0;
            while got < need && self.units.try_inc(self.max_units) {
                got += 1;
            }
            if got < need {
                (0..got).for_each(|_| self.units.dec());
                return Err(Errno::ENOSPC);
            }
            if self
                .bytes
                .compare_exchange(old, new, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
            {
                return Ok(());
            }
            (0..got).for_each(|_| self.units.dec());
        }
    }

    pub(crate) fn release(&self, n: u64) {
        // Relaxed: as `charge`.
        let old = self
            .bytes
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |b| {
                Some(b.saturating_sub(n))
            })
            .unwrap_or_else(|b| b);
        let freed = units_of(old) - units_of(old.saturating_sub(n));
        (0..freed).for_each(|_| self.units.dec());
        // Toward the heap trim, as a removed file's memory.
        crate::frames::heap_freed(n as usize);
    }
}

impl XattrStore {
    fn map<'g>(&self, g: &'g epoch::Guard) -> Option<&'g XattrMap> {
        // Acquire: pairs with the Release store that published the map.
        let p = self.map.load(Ordering::Acquire, g);
        // SAFETY: once published the map lives as long as the store, which
        // outlives every `&self`.
        unsafe { p.as_ref() }
    }

    pub(crate) fn get(&self, name: &[u8]) -> VfsResult<Vec<u8>> {
        let g = epoch::pin();
        let m = self.map(&g).ok_or(Errno::ENODATA)?;
        m.get(name)
            .map(|e| e.value().get(&g).to_vec())
            .ok_or(Errno::ENODATA)
    }

    pub(crate) fn names(&self) -> Vec<Vec<u8>> {
        let g = epoch::pin();
        match self.map(&g) {
            Some(m) => m.iter().map(|e| e.key().to_vec()).collect(),
            None => Vec::new(),
        }
    }

    /// The space all the attributes are charged.
    pub(crate) fn space(&mut self) -> u64 {
        // Relaxed: `&mut self`, the writers are done.
        self.charged.load(Ordering::Relaxed)
    }

    /// Set or (`value: None`) remove `name`, charging `budget` (`None`:
    /// nothing charged, for a name that must always be uncharged, as the
    /// ACLs). The caller serialises writers.
    pub(crate) fn change(
        &self,
        name: &[u8],
        value: Option<&[u8]>,
        flags: u32,
        budget: Option<&XattrBudget<'_>>,
    ) -> VfsResult<()> {
        let g = epoch::pin();
        let m = match (self.map(&g), value) {
            (Some(m), _) => m,
            (None, None) => return Err(Errno::ENODATA),
            (None, Some(_)) => {
                let m = Owned::new(SkipMap::new()).into_shared(&g);
                // Release: publish the empty map; writers are serialised,
                // so nobody else installs one.
                self.map.store(m, Ordering::Release);
                // SAFETY: just made, and lives as long as the store.
                unsafe { m.deref() }
            }
        };
        let entry = m.get(name);
        // What the entry is charged (0 for uncharged names).
        let space = |v: &[u8]| budget.map_or(0, |_| xattr_space(name, v));
        let old_space = entry.as_ref().map(|e| space(e.value().get(&g)));
        match (value, old_space) {
            (None, None) => Err(Errno::ENODATA),
            (None, Some(old)) => {
                m.remove(name);
                if let Some(b) = budget {
                    b.release(old);
                }
                // Relaxed: writers are serialised (this function's
                // contract); the drop has `&mut`.
                self.charged.fetch_sub(old, Ordering::Relaxed);
                Ok(())
            }
            (Some(_), Some(_)) if flags & XATTR_CREATE != 0 => Err(Errno::EEXIST),
            (Some(_), None) if flags & XATTR_REPLACE != 0 => Err(Errno::ENODATA),
            (Some(v), old) => {
                let old = old.unwrap_or(0);
                let new = space(v);
                // The whole new value is charged while the old one still
                // is, then the old one given back, as tmpfs does
                // (shmem_xattr_handler_set): on a full pool even a
                // smaller value is ENOSPC.
                if let Some(b) = budget {
                    b.charge(new)?;
                    if old != 0 {
                        b.release(old);
                    }
                }
                // Relaxed: as for the removal.
                self.charged.fetch_add(new, Ordering::Relaxed);
                self.charged.fetch_sub(old, Ordering::Relaxed);
                match &entry {
                    Some(e) => e.value().replace(v, &g),
                    None => {
                        m.insert(Box::from(name), Value::new(v));
                    }
                }
                Ok(())
            }
        }
    }
}

impl Drop for XattrStore {
    fn drop(&mut self) {
        // SAFETY: `&mut self`: no reader holds this store, so the map can
        // be freed at once.
        unsafe {
            let p = self.map.load(Ordering::Relaxed, epoch::unprotected());
            if !p.is_null() {
                drop(p.into_owned());
            }
        }
    }
}
